/* cotrain-server: the handlers of the v1 API, one file per resource
 * (api_accounts.c, api_teams.c, api_hosts.c, api_projects.c, api_work.c,
 * api_certs.c, api_rounds.c) and
 * the file store (files.c).  Each takes a complete request and answers it
 * with one http_reply_* call; doc/api.md describes every route. */
#ifndef COT_SERVER_API_H
#define COT_SERVER_API_H

#include "server/http.h"

void api_account_create(http_req *req);
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

void api_project_ca(http_req *req); /* api_certs.c */
void api_host_certificate(http_req *req);

void api_work_report(http_req *req); /* api_rounds.c */
void api_round_plan(http_req *req);
void api_round_outcome(http_req *req);
void api_round_list(http_req *req);
/* A group's gradient sum, raw fp32; bodies up to API_GRADIENT_MAX_BYTES
 * (2^28 parameters), checked against the round's exact parameter count
 * before they are read (http_req.early). */
#define API_GRADIENT_MAX_BYTES ((size_t)1 << 30)
/* A work unit's report, with the sketch of each of its microbatches (k
 * numbers each, doc/credit.md): bodies up to 4 MiB. */
#define API_REPORT_MAX_BYTES ((size_t)4 << 20)
void api_round_group_sum(http_req *req);

void files_get(http_req *req);

#endif
