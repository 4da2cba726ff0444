/* cotrain-server: credit, spot checks, the web site and its JSON, metrics
 * (doc/credit.md, doc/web.md).  Route handlers declared here are listed in
 * server/router.c; each answers with exactly one http_reply_* call, errors
 * in the API's JSON error style.
 *
 *   credit_api.c   leaderboards (keyset pagination) and the pages of one
 *                  user, team or host
 *   spotcheck.c    the hosts' side of spot checks: list, claim, fingerprint
 *   web.c          the embedded web/ files, with a Content-Security-Policy
 *   web_api.c      the dashboard's JSON of a project
 *   metrics.c      Prometheus text at /metrics */
#ifndef COT_SERVER_CREDIT_H
#define COT_SERVER_CREDIT_H

#include "server/http.h"

/* GET /v1/credit/{users,teams,hosts}?order=total|rac&limit=N&after=CURSOR */
void credit_leaderboard(http_req *req);
/* GET /v1/credit/{users,teams,hosts}/{id} */
void credit_entity(http_req *req);

/* GET /v1/hosts/{id}/spotchecks (host token) */
void spot_list_get(http_req *req);
/* POST /v1/projects/{name}/spotchecks/claim (host token) */
void spot_claim_post(http_req *req);
/* POST /v1/spotchecks/{id}/fingerprint (host token) {"values": [K numbers]} */
void spot_fingerprint_post(http_req *req);

/* GET /, /dashboard, /leaderboard, /user, /team, /host: the HTML pages;
 * GET /static/{name}: their scripts and style. */
void web_page(http_req *req);
void web_static(http_req *req);
/* The statistics export's files, GET /stats/NAME (server/stats_serve.c). */
void stats_get(http_req *req);
/* The sign-up form (server/web_signup.c, doc/web.md). */
void web_signup_form(http_req *req);
void web_signup_post(http_req *req);
/* GET /v1/projects/{name}/dashboard?rounds=N */
void web_dashboard(http_req *req);
/* GET /v1/hosts/{id}/network: a host's class and rungs, public (web_api.c) */
void web_host_network(http_req *req);

/* GET /metrics */
void metrics_get(http_req *req);

#endif
