/* cotrain tests: the real cotrain-server beside a throwaway PostgreSQL,
 * driven over real HTTP with libcurl.
 *
 *   th_start(args)   starts PostgreSQL (tests/pgtmp), applies the embedded
 *                    migrations, starts server/cotrain-server as a child on a
 *                    free port with a temporary data directory and the extra
 *                    arguments, and waits for its "listening on" line.
 *                    Everything is torn down at exit (atexit; the server also
 *                    gets SIGTERM if the test process dies, PR_SET_PDEATHSIG).
 *   th_http(...)     one request; the answer's status, body, parsed JSON and
 *                    a few headers.
 *   th_sql_int(...)  a scalar from the database, for before/after checks.
 * Failures to set up bail out (TAP "Bail out!"). */
#ifndef COT_TESTS_SERVER_HARNESS_H
#define COT_TESTS_SERVER_HARNESS_H

#include <stdbool.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libpq-fe.h>

typedef struct {
	long status;
	char *body; /* NUL-terminated, malloc'd */
	size_t len;
	json_t *json; /* the body parsed, or NULL when it is not JSON */
	char etag[100];
	char content_range[100];
	char content_type[100];
	char allow[100];
	char retry_after[32];
	long long content_length; /* -1 when absent */
	double seconds;           /* how long the request took */
} th_resp;

void th_start(const char *const *extra_args);
const char *th_url(void);
const char *th_data_dir(void);
PGconn *th_db(void);
/* Stop the server with SIGTERM; true when it exited with status 0 in time. */
bool th_stop_server(void);

/* Perform one request.  curl may be NULL (a handle of this thread is used).
 * bearer may be NULL (no Authorization header); body may be NULL (none).
 * headers: NULL or a NULL-terminated list of extra "Name: value" lines.
 * Returns false (and diag()s) only when the transfer itself failed. */
bool th_http(CURL *curl, const char *method, const char *path, const char *bearer, const char *body,
             const char *const *headers, th_resp *out);
void th_resp_free(th_resp *r);

/* ok() that r is an error answer with this status and error code, with a
 * non-empty message. */
bool th_is_error(const th_resp *r, long status, const char *code, const char *what);

/* Integer field of the response JSON (or of a nested path "a.b"); -1 when absent. */
long long th_json_int(const th_resp *r, const char *key);
const char *th_json_str(const th_resp *r, const char *key);

/* SQL on the harness's own connection; printf-style.  th_sql_int returns
 * the first column of the first row as an integer (0 for NULL).  Bails out
 * on an SQL error. */
long long th_sql_int(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void th_sql(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A fingerprint of every table the API writes (row counts and a hash of the
 * rows), to check that a refused request changed nothing. */
char *th_db_fingerprint(void);

/* Insert a dataset of n_shards shards of shard_tokens tokens each (file rows
 * only; the bytes are not stored), a project using it and model version 0
 * with a checkpoint row.  Returns the project id. */
long long th_seed_project(const char *name, int wu_seconds, double flops_per_sample, int microbatch_size,
                          int seq_len, int n_shards, long long shard_tokens);

/* Create an account (email from tag), log it in and register one host with
 * the given flops; fills the key, host id and token (buffers of 64). */
void th_new_host(const char *tag, double flops, char *account_key, long long *host_id, char *host_token);

/* --- Rounds (tests/test_rounds.c, tests/test_round_step.c) --- */

/* The test model: 1 layer, width 8, 2 heads, d_ff 32, sequence 16,
 * vocabulary 256: V*C + T*C + (2C + 3C*C + 3C + C*C + C + 2C + C*F + F +
 * F*C + C) + 2C = 2048 + 128 + 872 + 16 parameters. */
#define TH_MODEL \
	"{\"n_layer\": 1, \"n_shared\": 1, \"n_head\": 2, \"d_model\": 8, \"d_ff\": 32, \"seq_len\": 16, " \
	"\"vocab\": 256}"
#define TH_PARAMS 3064

typedef struct {
	char key[64], token[64];
	long long id, wu, lo, hi;
} th_host;

/* th_db_fingerprint plus the round tables (round, round_report,
 * round_member, round_group_sum, model_version, file). */
char *th_round_fingerprint(void);
/* One request whose status is checked (ok/diag); bails out when the
 * transfer fails.  The caller th_resp_free()s. */
th_resp th_call(const char *method, const char *path, const char *bearer, const char *body, long status,
                const char *what);
/* A request that must be refused with status and code, changing nothing
 * (th_round_fingerprint before and after). */
void th_refused(const char *method, const char *path, const char *bearer, const char *body, long status,
                const char *code, const char *what);
/* POST len raw bytes as application/octet-stream (th_http sends C strings). */
th_resp th_post_raw(const char *path, const char *token, const void *data, size_t len);
/* th_post_raw that must be refused, changing nothing. */
void th_raw_refused(const char *path, const char *token, const void *data, size_t len, long status,
                    const char *code, const char *what);
/* Register a host (th_new_host) into h. */
void th_host_new(th_host *h, const char *tag, double flops);
/* Ask project for work (200 checked): h->wu, lo, hi. */
void th_ask_work(th_host *h, const char *project, long long version);
/* ok() that every stream microbatch of project below its frontier is in
 * exactly one place: a pool range, a live unit, or the finished part of
 * another unit. */
void th_coverage_exact(long long project, const char *what);
/* A GET (a long poll) in a thread of its own: th_bg_get returns once the
 * request is sent (bails out after 10 s); th_bg_done tells whether the
 * answer is in; th_bg_join waits for it and frees the rest. */
typedef struct th_bg th_bg;
th_bg *th_bg_get(const char *path, const char *token);
bool th_bg_done(th_bg *b);
th_resp th_bg_join(th_bg *b);
/* Heartbeat of h's unit (200 checked). */
th_resp th_heartbeat(th_host *h, long long mb_done, double sps);

#endif
