/* cotrain-server: the handlers of the v1 API, one file per resource
 * (api_accounts.c, api_teams.c, api_hosts.c, api_projects.c, api_work.c,
 * api_certs.c, api_rounds.c) and
 * the file store (files.c).  Each takes a complete request and answers it
 * with one http_reply_* call; doc/api.md describes every route. */
#ifndef COT_SERVER_API_H
#define COT_SERVER_API_H

#include "server/http.h"

void api_account_create(http_req *req);

/* Why an account could not be made: the HTTP status, the API's error code,
 * a message and a hint in PostgreSQL's style, and the seconds to wait for a
 * 429 or 503. */
#define API_ACCOUNT_KEY_CHARS 48
typedef struct {
	int status;
	const char *code;
	char message[256];
	char hint[256];
	int retry_after;
} api_account_error;

/* Make an account under the API's rules, for the API (POST /v1/accounts)
 * and the web site's sign-up form alike: email 3 to 254 bytes with an '@',
 * name 1 to 100, password 8 or more, no character the stats export cannot
 * carry, one account per email, the per-address limit of log-ins and
 * sign-ups (server/auth_limit.h).  Answers nothing: true with the account's
 * id and a fresh account key, or false with *e filled. */
bool api_account_new(http_req *req, const char *email, const char *name, const char *password,
                     long long *account_id, char key[API_ACCOUNT_KEY_CHARS], api_account_error *e);
void api_account_login(http_req *req);
void api_account_get(http_req *req);
void api_account_update(http_req *req);
void api_account_logout(http_req *req);

void api_team_create(http_req *req);
void api_team_get(http_req *req);
void api_team_join(http_req *req);
void api_team_leave(http_req *req);

void api_host_register(http_req *req);
void api_host_get(http_req *req);
void api_host_revoke(http_req *req);

void api_project_list(http_req *req);
void api_project_get(http_req *req);

/* The longest a work request may wait (query argument wait) for its
 * round to move. */
#define WORK_WAIT_MAX 60
void api_work_request(http_req *req);
void api_work_heartbeat(http_req *req);
void api_work_handback(http_req *req);
void api_work_finish(http_req *req);
/* GET /v1/workunits/{id}/round[?wait=S]: the close notice (long poll). */
void api_work_round_watch(http_req *req);

void api_project_ca(http_req *req); /* api_certs.c */
void api_host_certificate(http_req *req);

void api_work_report(http_req *req); /* api_rounds.c */
void api_round_plan(http_req *req);
void api_round_outcome(http_req *req);
/* POST /v1/projects/{name}/rounds/{version}/seed2: a peer's sketches under
 * the committed round's second seed (db/functions/round_sketch_seed2.sql). */
void api_round_seed2(http_req *req);
void api_round_list(http_req *req);
/* A group's gradient sum, raw fp32; bodies up to API_GRADIENT_MAX_BYTES
 * (2^28 parameters), checked against the round's exact parameter count
 * before they are read (http_req.early). */
#define API_GRADIENT_MAX_BYTES ((size_t)1 << 30)
/* A work unit's report, with the sketch of each of its microbatches (k
 * numbers each, doc/credit.md): bodies up to 4 MiB. */
#define API_REPORT_MAX_BYTES ((size_t)4 << 20)
#define API_FINGERPRINT_MAX_BYTES ((size_t)8 << 20) /* a spot check's answer (spotcheck.c) */
void api_round_group_sum(http_req *req);

/* Averaging across groups between the peers (api_round_cross.c, doc/api.md
 * "Rounds"): a member posts the hash of the round's mean its group holds
 * (no body), and the peer the server asks uploads its checkpoint of v+1;
 * bodies up to API_CHECKPOINT_MAX_BYTES. */
void api_round_mean_hash(http_req *req);
void api_round_checkpoint(http_req *req);
#define API_CHECKPOINT_MAX_BYTES ((size_t)4 << 30)

/* Argument checks the round routes share (api_rounds.c): path parameter 1
 * as a version (answers 400 when it is not one); a positive query argument
 * or 0; the "included" list as a JSON array text (malloc'd; answers 400). */
bool rounds_path_version(http_req *req, long long *out);
long long rounds_query_pos(http_req *req, const char *name);
bool rounds_included_param(http_req *req, char **out);

void files_get(http_req *req);

/* A checkpoint's piece manifest and the peers that hold it
 * (api_checkpoints.c). */
void api_checkpoint_sources(http_req *req);

#endif
