/* cotrain client: every call to the project server's v1 API (doc/api.md).
 *
 * Each function makes one HTTPS/HTTP request with libcurl (no redirects,
 * bounded time, answers of at most CL_API_MAX_ANSWER bytes), checks the
 * answer's shape before anything of it is used, and maps failures onto
 * cot_err:
 *   COT_ERR_NETWORK   no connection, timeout, 5xx, or an answer that is not
 *                     the JSON promised (garbage, wrong types): retry later
 *   COT_ERR_INVALID   400: our request was refused as malformed
 *   COT_ERR_AUTH      401: the key or token is not valid
 *   COT_ERR_FORBIDDEN 403
 *   COT_ERR_NOT_FOUND 404
 *   COT_ERR_CONFLICT  409: e.g. the work unit is no longer live
 * The detail quotes the server's own message ("server: ...") and hint. */
#ifndef CL_API_H
#define CL_API_H

#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "client/state.h"
#include "shared/common/error.h"

#define CL_API_MAX_ANSWER (1 << 20)

typedef struct {
	int timeout_s;
	int64_t upload_limit; /* bytes/s, 0 = unlimited */
} cl_api_opts;

/* One HTTP request to a server (the building block of every call here and
 * in api_round.c).  A JSON body (json) or a raw one (raw, rawlen, ctype) is
 * sent; on a 2xx answer *out (when out is not NULL) owns the JSON answer,
 * NULL for a 204; on an HTTP error eb quotes the server's message and hint
 * and *err_body (when not NULL) owns the error's JSON, when it had one.
 * local_ip receives our address on the connection (the one peers on the
 * same network as the server can reach us at).  The time limit is the
 * options' plus extra_timeout_s (for long polls). */
typedef struct {
	const char *method, *url, *bearer;
	const json_t *json;
	const void *raw;
	size_t rawlen;
	const char *ctype;
	json_t **out;
	json_t **err_body;
	time_t *date;
	long *status;
	char *local_ip;
	size_t local_ip_len;
	int extra_timeout_s;
	volatile int *cancel; /* when non-NULL and set, give up (COT_ERR_TIMEOUT): long polls */
} cl_http_req;

cot_err cl_api_http(const cl_api_opts *o, const cl_http_req *r, cot_errbuf *eb);

/* Split a project URL "http[s]://host[:port][/prefix]/projects/<name>" (or
 * ".../v1/projects/<name>") into the server base URL and the name.
 * COT_ERR_INVALID with a hint when it does not look like one. */
cot_err cl_api_parse_project_url(const char *url, char *base, size_t baselen, char *name, size_t namelen,
                                 cot_errbuf *eb);

/* "2026-11-21T23:47:32.123456+00:00" (PostgreSQL's JSON timestamptz) to
 * unix seconds; -1 when malformed. */
int64_t cl_api_parse_timestamp(const char *s);

/* POST /v1/accounts/login: the account key for email and password. */
cot_err cl_api_login(const cl_api_opts *o, const char *base, const char *email, const char *password,
                     char key[CL_TOKEN_MAX], cot_errbuf *eb);

/* GET /v1/account: checks the key; the account's computing preferences
 * (the "prefs" object, when the server sends one) go into *prefs (keys not
 * sent stay unset). */
cot_err cl_api_account(const cl_api_opts *o, const char *base, const char *key, cl_prefs *prefs,
                       cot_errbuf *eb);

typedef struct {
	char cpu_model[257];
	int cores;
	int64_t memory_bytes;
	char gpu[257];
	double flops;
	char client_version[65];
	char os_name[65];
	char os_version[129];
	char machine_id[65]; /* hex, per project (cl_hostinfo_machine_id); "" = none */
} cl_hostinfo;

/* POST /v1/hosts with the account key: a host id and a new token.  With a
 * machine id the server gives back the account's host of that machine when
 * it has one (the same id, a new token), else a new host. */
cot_err cl_api_register_host(const cl_api_opts *o, const char *base, const char *key, const cl_hostinfo *h,
                             int64_t *host_id, char token[CL_TOKEN_MAX], cot_errbuf *eb);

/* GET /v1/projects/<name>: the project's parameters into p (seq_len,
 * microbatch_size, mb_per_epoch, flops_per_sample).  *info (when not NULL)
 * receives the whole validated answer (new reference). */
cot_err cl_api_project(const cl_api_opts *o, cl_project *p, json_t **info, cot_errbuf *eb);

/* Check the project information a (borrowed) as cl_api_project does and, on
 * success only, update p's parameters, model, training mode and seed.
 * COT_ERR_NETWORK with a detail for what a server should not send.
 * Exposed for the fuzz harness (tests/fuzz/fuzz_project_info.c). */
cot_err cl_api_parse_project(const json_t *a, cl_project *p, cot_errbuf *eb);

/* POST /v1/projects/<name>/work: a work unit into w (mb_done etc. zeroed,
 * deadline in local unix seconds, corrected by the server's Date header
 * for clock skew).  The project parameters in p are refreshed from it.
 * An impossible work unit (hi <= lo, a negative lo, a range longer than an
 * epoch (mb_per_epoch) or over 2^40, a bad file entry)
 * is COT_ERR_NETWORK with a detail.  When refusal is not NULL and the
 * server refused (409: a round is not open, or its target is covered),
 * *refusal owns its answer (with "round" and "retry_after").  The server
 * holds such a refusal up to wait_s seconds, answering as soon as the
 * round moves (a long poll); cancel (may be NULL) ends the wait early. */
cot_err cl_api_request_work(const cl_api_opts *o, cl_project *p, cl_work *w, int wait_s, volatile int *cancel,
                            json_t **refusal, cot_errbuf *eb);

/* Check the work unit answer a (borrowed) as cl_api_request_work does and
 * fill w; date is the server's Date header (0: unknown), p's project
 * parameters are refreshed only on success.  COT_ERR_NETWORK with a detail
 * for anything a server should not send; then w is zeroed.  Exposed for the
 * fuzz harness (tests/fuzz/fuzz_work.c). */
cot_err cl_api_parse_work(const json_t *a, time_t date, cl_project *p, cl_work *w, cot_errbuf *eb);

/* GET /v1/credit/hosts/<id> (public): the host's granted credit
 * (total_credit) and its pending credit: the answer's "pending_credit" when
 * the server sends one, else the sum of the pending grants among the latest
 * it lists.  Fields it does not know are ignored. */
cot_err cl_api_host_credit(const cl_api_opts *o, const char *base, int64_t host_id, double *granted,
                           double *pending, cot_errbuf *eb);

/* POST /v1/workunits/<id>/{heartbeat,handback,finish} with mb_done and
 * samples_per_sec.  On success *answer (when not NULL) is the server's
 * answer (new reference). */
cot_err cl_api_report(const cl_api_opts *o, const cl_project *p, cl_report_op op, int64_t wu, int64_t mb_done,
                      double samples_per_sec, json_t **answer, time_t *date, cot_errbuf *eb);

#endif
