/* cotrain-server: the hosts' side of spot checks (doc/api.md, "Spot
 * checks"); the rules live in db/functions/spotcheck.sql. */
#include "server/credit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "shared/common/fingerprint.h"

static const dbc_stmt st_list = { "spot_list", "SELECT status, body FROM spot_list($1::bytea, $2::bigint)",
	                          2 };
static const dbc_stmt st_claim = { "spot_claim", "SELECT status, body FROM spot_claim($1::bytea, $2)", 2 };
static const dbc_stmt st_fp = {
	"spot_fingerprint", "SELECT status, body FROM spot_fingerprint($1::bytea, $2::bigint, $3::float8[])",
	3
};

void spot_list_get(http_req *req)
{
	long long host;
	if (!api_path_id(req, 0, "host", &host))
		return;
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	char hs[24];
	snprintf(hs, sizeof hs, "%lld", host);
	const char *params[] = { hp, hs };
	api_relay(req, &st_list, params);
}

void spot_claim_post(http_req *req)
{
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	const char *params[] = { hp, req->params[0] };
	api_relay(req, &st_claim, params);
}

void spot_fingerprint_post(http_req *req)
{
	long long id;
	if (req->early)
		return; /* up to API_FINGERPRINT_MAX_BYTES (a block check's values): read it */
	if (!api_path_id(req, 0, "spot check", &id))
		return;
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	json_t *vals = json_object_get(body, "values");
	size_t n = json_is_array(vals) ? json_array_size(vals) : 0;
	if (!json_is_array(vals) || n < 1 || n > SPOT_VALUES_MAX) {
		char msg[80];
		snprintf(msg, sizeof msg, "values must be an array of 1 to %d numbers", SPOT_VALUES_MAX);
		http_reply_error(req, 400, "invalid", msg, NULL);
		json_decref(body);
		return;
	}
	double *d = malloc(n * sizeof *d);
	char *lit = malloc(API_FLOAT8_LEN(n));
	if (!d || !lit) {
		http_reply_error(req, 500, "out_of_memory", "out of memory", NULL);
		free(d);
		free(lit);
		json_decref(body);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(vals, i);
		d[i] = json_is_number(v) ? json_number_value(v) : NAN;
		if (!isfinite(d[i])) {
			char msg[80];
			snprintf(msg, sizeof msg, "values[%zu] is not a finite number", i);
			http_reply_error(req, 400, "invalid", msg, NULL);
			free(d);
			free(lit);
			json_decref(body);
			return;
		}
	}
	api_float8_literal(d, n, lit, API_FLOAT8_LEN(n));
	free(d);
	char ids[24];
	snprintf(ids, sizeof ids, "%lld", id);
	const char *params[] = { hp, ids, lit };
	api_relay(req, &st_fp, params);
	free(lit);
	json_decref(body);
}
