/* cotrain-server: the route table of the v1 API. */
#include "server/router.h"

#include <stdio.h>
#include <string.h>

#include "server/api.h"
#include "server/credit.h"
#include "server/reachability.h"

typedef struct {
	const char *method;
	const char *pattern;
	route_handler handler;
} route;

static const route routes[] = {
	{ "POST", "/v1/accounts", api_account_create },
	{ "POST", "/v1/accounts/login", api_account_login },
	{ "GET", "/v1/account", api_account_get },
	{ "PATCH", "/v1/account", api_account_update },
	{ "POST", "/v1/account/logout", api_account_logout },
	{ "POST", "/v1/teams", api_team_create },
	{ "GET", "/v1/teams/{}", api_team_get },
	{ "POST", "/v1/teams/{}/join", api_team_join },
	{ "POST", "/v1/teams/{}/leave", api_team_leave },
	{ "POST", "/v1/hosts", api_host_register },
	{ "GET", "/v1/hosts/{}", api_host_get },
	{ "DELETE", "/v1/hosts/{}", api_host_revoke },
	{ "GET", "/v1/hosts/{}/nat", api_host_nat },
	{ "GET", "/v1/hosts/{}/network", web_host_network },
	{ "GET", "/v1/projects", api_project_list },
	{ "GET", "/v1/projects/{}", api_project_get },
	{ "POST", "/v1/projects/{}/work", api_work_request },
	{ "POST", "/v1/workunits/{}/heartbeat", api_work_heartbeat },
	{ "POST", "/v1/workunits/{}/handback", api_work_handback },
	{ "POST", "/v1/workunits/{}/finish", api_work_finish },
	{ "POST", "/v1/workunits/{}/report", api_work_report },
	{ "GET", "/v1/workunits/{}/round", api_work_round_watch },
	{ "GET", "/v1/projects/{}/ca", api_project_ca },
	{ "POST", "/v1/hosts/{}/certificate", api_host_certificate },
	{ "GET", "/v1/projects/{}/rounds/{}/plan", api_round_plan },
	{ "POST", "/v1/projects/{}/rounds/{}/outcome", api_round_outcome },
	{ "POST", "/v1/projects/{}/rounds/{}/seed2", api_round_seed2 },
	{ "POST", "/v1/projects/{}/rounds/{}/group_sum", api_round_group_sum },
	{ "POST", "/v1/projects/{}/rounds/{}/mean_hash", api_round_mean_hash },
	{ "POST", "/v1/projects/{}/rounds/{}/checkpoint", api_round_checkpoint },
	{ "GET", "/v1/projects/{}/rounds", api_round_list },
	{ "GET", "/v1/projects/{}/checkpoints/{}", api_checkpoint_sources },
	{ "GET", "/files/{}", files_get },
	{ "HEAD", "/files/{}", files_get },
	{ "GET", "/v1/credit/{}", credit_leaderboard },
	{ "GET", "/v1/credit/{}/{}", credit_entity },
	{ "GET", "/v1/hosts/{}/spotchecks", spot_list_get },
	{ "POST", "/v1/projects/{}/spotchecks/claim", spot_claim_post },
	{ "POST", "/v1/spotchecks/{}/fingerprint", spot_fingerprint_post },
	{ "GET", "/v1/projects/{}/dashboard", web_dashboard },
	{ "GET", "/metrics", metrics_get },
	{ "GET", "/static/{}", web_static },
	{ "GET", "/dashboard", web_page },
	{ "GET", "/leaderboard", web_page },
	{ "GET", "/user", web_page },
	{ "GET", "/team", web_page },
	{ "GET", "/host", web_page },
	{ "GET", "/stats/{}", stats_get },
	{ "HEAD", "/stats/{}", stats_get },
	{ "GET", "/signup", web_signup_form },
	{ "POST", "/signup", web_signup_post },
};

/* Does path (already split: segs[0..nseg)) match pattern?  Captures the
 * segments that "{}" stands for. */
static bool match(const char *pattern, char **segs, int nseg, const char **params, int *np)
{
	char pat[128];
	snprintf(pat, sizeof pat, "%s", pattern);
	int i = 0, n = 0;
	char *save = NULL;
	for (char *p = strtok_r(pat, "/", &save); p; p = strtok_r(NULL, "/", &save), i++) {
		if (i >= nseg)
			return false;
		if (strcmp(p, "{}") == 0) {
			if (n >= HTTP_MAX_PARAMS)
				return false;
			params[n++] = segs[i];
		} else if (strcmp(p, segs[i]) != 0) {
			return false;
		}
	}
	if (i != nseg)
		return false;
	*np = n;
	return true;
}

route_result router_match(http_req *req, char *pathbuf, size_t pathlen, route_handler *h, char *allow,
                          size_t allowlen)
{
	const char *path = req->path;
	if (strncmp(path, "/api/v1/", 8) == 0) /* the web site's prefix for the same API */
		path += 4;
	if (strcmp(path, "/") == 0) { /* the project page */
		if (strcmp(req->method, "GET") != 0) {
			if (allowlen)
				snprintf(allow, allowlen, "GET");
			return ROUTE_NO_METHOD;
		}
		*h = web_page;
		req->nparams = 0;
		return ROUTE_FOUND;
	}
	size_t len = strlen(path);
	if (len == 0 || len >= pathlen || path[0] != '/')
		return ROUTE_NO_PATH;
	memcpy(pathbuf, path, len + 1);

	/* Split on '/'; an empty segment (a doubled or trailing slash) never
	 * matches anything. */
	char *segs[16];
	int nseg = 0;
	char *p = pathbuf + 1;
	for (;;) {
		if (nseg == 16)
			return ROUTE_NO_PATH;
		segs[nseg++] = p;
		char *slash = strchr(p, '/');
		if (!slash)
			break;
		*slash = '\0';
		p = slash + 1;
	}
	for (int i = 0; i < nseg; i++)
		if (segs[i][0] == '\0')
			return ROUTE_NO_PATH;

	bool path_known = false;
	size_t alen = 0;
	if (allowlen)
		allow[0] = '\0';
	for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
		const char *params[HTTP_MAX_PARAMS];
		int np = 0;
		if (!match(routes[r].pattern, segs, nseg, params, &np))
			continue;
		if (strcmp(routes[r].method, req->method) == 0) {
			memcpy(req->params, params, sizeof params);
			req->nparams = np;
			*h = routes[r].handler;
			return ROUTE_FOUND;
		}
		path_known = true;
		int w = snprintf(allow + alen, allowlen > alen ? allowlen - alen : 0, "%s%s",
		                 alen ? ", " : "", routes[r].method);
		if (w > 0 && alen + (size_t)w < allowlen)
			alen += (size_t)w;
	}
	return path_known ? ROUTE_NO_METHOD : ROUTE_NO_PATH;
}

size_t router_body_limit(route_handler h, size_t dflt)
{
	if (h == api_round_group_sum)
		return API_GRADIENT_MAX_BYTES > dflt ? API_GRADIENT_MAX_BYTES : dflt;
	if (h == api_round_checkpoint)
		return API_CHECKPOINT_MAX_BYTES > dflt ? API_CHECKPOINT_MAX_BYTES : dflt;
	/* An outcome carries the sketches of what was averaged: up to 2 x 256
	 * sketches of 256 values; the sketches under a second seed, those and
	 * a member's blocks. */
	if (h == api_work_report || h == api_round_outcome || h == api_round_seed2)
		return API_REPORT_MAX_BYTES > dflt ? API_REPORT_MAX_BYTES : dflt;
	/* A block check's answer: up to SPOT_VALUES_MAX numbers. */
	if (h == spot_fingerprint_post)
		return API_FINGERPRINT_MAX_BYTES > dflt ? API_FINGERPRINT_MAX_BYTES : dflt;
	return dflt;
}
