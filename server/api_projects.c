/* cotrain-server: public project information (no credentials needed). */
#include "server/api.h"

#include <string.h>

#include "server/apiutil.h"

static const dbc_stmt st_list = { "project_list",
	                          "SELECT json_build_object('projects', coalesce(json_agg(json_build_object("
	                          "       'name', name, 'title', title, 'active', active,"
	                          "       'current_version', current_version) ORDER BY name), "
	                          "'[]'::json))::text"
	                          "  FROM project",
	                          0 };

void api_project_list(http_req *req)
{
	PGresult *r = api_exec(req, &st_list, NULL, NULL);
	if (!r)
		return;
	http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
	PQclear(r);
}

static const dbc_stmt st_info = { "project_info", "SELECT status, body FROM api_project_info($1)", 1 };

void api_project_get(http_req *req)
{
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	const char *params[] = { req->params[0] };
	api_relay(req, &st_info, params);
}
