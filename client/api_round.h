/* cotrain client: the calls of a collaborative round (doc/api.md, "Rounds"
 * and "Certificates").  Same error mapping as api.h; every answer's shape is
 * checked by the caller (round.c) before use. */
#ifndef CL_API_ROUND_H
#define CL_API_ROUND_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "client/api.h"
#include "client/links.h"

/* GET /v1/projects/<name>/ca: the project CA certificate (PEM, malloc'd,
 * NUL-terminated, at most 64 KiB) into *pem.  local_ip (when not NULL)
 * receives our address on the connection to the server. */
cot_err cl_api_project_ca(const cl_api_opts *o, const cl_project *p, char **pem, char *local_ip, size_t iplen,
                          cot_errbuf *eb);

/* POST /v1/hosts/<id>/certificate: a certificate for our public key
 * (PEM); *cert_pem malloc'd; *lifetime its validity in seconds. */
cot_err cl_api_host_certificate(const cl_api_opts *o, const cl_project *p, const char *pub_pem,
                                char **cert_pem, int64_t *lifetime, cot_errbuf *eb);

typedef struct {
	int64_t mb_done, samples;
	char endpoint[80]; /* "a.b.c.d:port" or "[v6]:port" */
	double bandwidth;  /* bytes/s */
	int can_aggregate;
	int has_loss;
	double loss;            /* mean loss over the samples */
	const json_t *rtt;      /* {"<host id>": ms} measured to peers, or NULL */
	const double *sketches; /* mb_done rows of sketch_k values, or NULL (doc/credit.md) */
	int sketch_k;
} cl_round_report;

/* POST /v1/workunits/<wu>/report. */
cot_err cl_api_round_report(const cl_api_opts *o, const cl_project *p, int64_t wu, const cl_round_report *r,
                            json_t **answer, cot_errbuf *eb);

/* GET .../rounds/<v>/plan?host_id=N&wait=S[&after=gradient]: *plan is NULL
 * while the server has nothing new (204).  A 409 saying the round reopened
 * for the rest of its batch sets *reopened (may be NULL) besides returning
 * COT_ERR_CONFLICT. */
cot_err cl_api_round_plan(const cl_api_opts *o, const cl_project *p, int64_t version, int wait_s,
                          int after_gradient, json_t **plan, int *reopened, cot_errbuf *eb);

/* POST .../rounds/<v>/group_sum: our group's gradient SUM (len fp32 values)
 * over the contributions of included[0..n) (ascending), samples in all. */
cot_err cl_api_group_sum(const cl_api_opts *o, const cl_project *p, int64_t version, const int64_t *included,
                         size_t n, int64_t samples, const float *sum, size_t len, json_t **answer,
                         cot_errbuf *eb);

/* POST .../rounds/<v>/mean_hash: with averaging across groups between the
 * peers, the sha256 of the round's mean we hold (64 hex digits), our group
 * having included[0..n) (ascending), samples in all.  No body: the server
 * takes no gradient. */
cot_err cl_api_mean_hash(const cl_api_opts *o, const cl_project *p, int64_t version, const int64_t *included,
                         size_t n, int64_t samples, const char *sha256, cot_errbuf *eb);

/* POST .../rounds/<v>/checkpoint: our checkpoint of v+1 (len bytes of the
 * file kernels/checkpoint.h saves), when the outcome's answer asked for it;
 * *answer (may be NULL) gets the answer, as an outcome's. */
cot_err cl_api_round_checkpoint(const cl_api_opts *o, const cl_project *p, int64_t version, const void *bytes,
                                size_t len, json_t **answer, cot_errbuf *eb);

/* POST .../rounds/<v>/seed2: the sketches under the committed round's
 * second seed (client/round_seed2.h, cl_seed2_sketches_json). */
cot_err cl_api_round_seed2(const cl_api_opts *o, const cl_project *p, int64_t version, const json_t *sketches,
                           cot_errbuf *eb);

/* POST .../rounds/<v>/outcome?wait=S: ok (1, with the included hosts and
 * the sha256 of our parameters of v+1), failed (0), or dropped (-1: our
 * group left us out, but we aggregated a range: only the sketches); with links (may be NULL), the
 * connections we dialed and the rung each took.  With sketches (may be
 * NULL; cl_round_sketches_json), the sketches of what we averaged.  The server holds an ok up
 * to wait_s seconds until it can say whether we are accepted.  moments_sha256 (may be NULL)
 * is the hash of our optimizer moments of v+1 (hash_sha256_hex2 of m then v), which the server
 * holds an uploaded checkpoint of v+1 to across groups between the peers. */
cot_err cl_api_round_outcome(const cl_api_opts *o, const cl_project *p, int64_t version, int ok, int wait_s,
                             const int64_t *included, size_t n, const char *params_sha256,
                             const char *moments_sha256, cl_links *links, const json_t *sketches,
                             json_t **answer, cot_errbuf *eb);

#endif
