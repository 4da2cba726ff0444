/* cotrain-server: what every API handler needs. */
#include "server/apiutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shared/common/hash.h"
#include "shared/common/json.h"

bool api_bad_request(http_req *req, const cot_errbuf *eb)
{
	http_reply_error(req, 400, "invalid", eb->msg, eb->hint[0] ? eb->hint : NULL);
	return false;
}

bool api_text_check(const char *field, const char *s, cot_errbuf *eb)
{
	unsigned cp = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && !cp; p++) {
		if (*p < 0x20 && *p != '\t' && *p != '\n')
			cp = *p;
		else if (p[0] == 0xEF && p[1] == 0xBF && (p[2] == 0xBE || p[2] == 0xBF))
			cp = p[2] == 0xBE ? 0xFFFEu : 0xFFFFu;
	}
	if (!cp)
		return true;
	cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" contains the character U+%04X, which cannot be stored",
	           field, cp);
	cot_sethint(eb, "Names and descriptions are published in the XML statistics export, which "
	                "cannot carry U+FFFE, U+FFFF or control characters other than tab and "
	                "newline; remove the character.");
	return false;
}

bool api_text_ok(http_req *req, const char *field, const char *s)
{
	cot_errbuf eb = { 0 };
	return api_text_check(field, s, &eb) || api_bad_request(req, &eb);
}

bool api_body(http_req *req, bool optional, json_t **out)
{
	cot_errbuf eb = { 0 };
	if (optional && req->body_len == 0) {
		*out = json_object();
		if (!*out) {
			http_reply_error(req, 500, "out_of_memory", "out of memory", NULL);
			return false;
		}
		return true;
	}
	if (req->body_len == 0) {
		cot_seterr(&eb, COT_ERR_INVALID, "request body is empty");
		cot_sethint(&eb, "Send a JSON object with Content-Type: application/json.");
		return api_bad_request(req, &eb);
	}
	if (cot_json_parse_object(req->body, req->body_len, out, &eb))
		return api_bad_request(req, &eb);
	return true;
}

bool api_path_id(http_req *req, int i, const char *what, long long *out)
{
	const char *s = req->params[i];
	char *end;
	long long v = s[0] >= '1' && s[0] <= '9' && strlen(s) <= 18 ? strtoll(s, &end, 10) : 0;
	if (v <= 0 || *end) {
		char msg[200];
		snprintf(msg, sizeof msg, "%s id \"%.40s\" is not a positive integer", what, s);
		http_reply_error(req, 400, "invalid", msg, NULL);
		return false;
	}
	*out = v;
	return true;
}

bool api_bearer(http_req *req, char hash_param[API_HASH_PARAM_LEN])
{
	const char *h = http_header(req, "Authorization");
	const char *tok = h && strncasecmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL;
	size_t n = tok ? strlen(tok) : 0;
	bool good = n >= 16 && n <= 256;
	for (size_t i = 0; good && i < n; i++)
		good = (tok[i] >= 'A' && tok[i] <= 'Z') || (tok[i] >= 'a' && tok[i] <= 'z') ||
		       (tok[i] >= '0' && tok[i] <= '9') || tok[i] == '-' || tok[i] == '_';
	if (!good) {
		http_reply_error(req, 401, "unauthorized",
		                 h ? "malformed Authorization header" : "missing Authorization header",
		                 "Send \"Authorization: Bearer <key>\" with your account key or host token.");
		return false;
	}
	unsigned char md[HASH_SHA256_LEN];
	if (hash_sha256(tok, n, md)) {
		http_reply_error(req, 500, "internal_error", "could not hash the credential", NULL);
		return false;
	}
	hash_param[0] = '\\';
	hash_param[1] = 'x';
	hash_hex(md, sizeof md, hash_param + 2);
	return true;
}

static const dbc_stmt st_account_auth = {
	"account_auth",
	"SELECT k.account_id FROM account_key k JOIN account a ON a.id = k.account_id"
	" WHERE k.key_hash = $1::bytea AND NOT k.revoked AND NOT a.disabled",
	1
};

bool api_account(http_req *req, long long *account_id)
{
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return false;
	const char *params[] = { hp };
	PGresult *r = api_exec(req, &st_account_auth, params, NULL);
	if (!r)
		return false;
	bool found = PQntuples(r) == 1;
	if (found)
		*account_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	if (!found)
		http_reply_error(req, 401, "unauthorized", "account key is not valid",
		                 "Log in again to get a new account key.");
	return found;
}

PGresult *api_exec(http_req *req, const dbc_stmt *stmt, const char *const *params, const char *on_conflict)
{
	PGresult *r;
	char state[6];
	cot_errbuf eb = { 0 };
	cot_err rc = dbc_exec(stmt, params, &r, state, &eb);
	if (!rc)
		return r;
	if (strcmp(state, "23505") == 0)
		http_reply_error(req, 409, "already_exists",
		                 on_conflict ? on_conflict : "the object already exists", NULL);
	else if (strncmp(state, "23", 2) == 0 || strncmp(state, "22", 2) == 0)
		http_reply_error(req, 400, "invalid", eb.msg, NULL);
	else
		http_reply_error(req, 503, "database_error", eb.msg,
		                 eb.hint[0] ? eb.hint : "Try again later.");
	return NULL;
}

void api_reply_row(http_req *req, const dbc_stmt *stmt, const char *const *params, const char *missing)
{
	PGresult *r = api_exec(req, stmt, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) == 1)
		http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
	else
		http_reply_error(req, 404, "not_found", missing, NULL);
	PQclear(r);
}

int api_relay_result(http_req *req, const PGresult *r)
{
	if (PQntuples(r) != 1 || PQnfields(r) != 2) {
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
		return 500;
	}
	int status = atoi(PQgetvalue(r, 0, 0));
	http_reply_raw(req, status, PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1));
	return status;
}

void api_relay(http_req *req, const dbc_stmt *stmt, const char *const *params)
{
	PGresult *r = api_exec(req, stmt, params, NULL);
	if (!r)
		return;
	api_relay_result(req, r);
	PQclear(r);
}

bool api_query_int(http_req *req, const char *name, long long lo, long long hi, long long *out)
{
	const char *s = http_query(req, name);
	if (!s)
		return true;
	char *end = NULL;
	long long v = s[0] >= '0' && s[0] <= '9' && strlen(s) <= 18 ? strtoll(s, &end, 10) : -1;
	if (v < lo || v > hi || !end || *end) {
		char msg[160];
		snprintf(msg, sizeof msg, "query argument \"%s\" must be an integer from %lld to %lld", name,
		         lo, hi);
		http_reply_error(req, 400, "invalid", msg, NULL);
		return false;
	}
	*out = v;
	return true;
}

bool api_is_news(api_news *n, const char *key)
{
	pthread_mutex_lock(&n->mu);
	bool news = strcmp(n->last, key) != 0;
	if (news)
		snprintf(n->last, sizeof n->last, "%s", key);
	pthread_mutex_unlock(&n->mu);
	return news;
}

api_poll api_long_poll(http_req *req, unsigned long gen, int look)
{
	if (look >= 8)
		return API_POLL_ANSWER;
	if (http_hold(req, gen))
		return API_POLL_HELD;
	if (http_wake_gen(req) != gen && http_now() < req->hold_until)
		return API_POLL_AGAIN;
	return API_POLL_ANSWER;
}

void api_float8_literal(const double *v, size_t n, char *buf, size_t cap)
{
	size_t o = (size_t)snprintf(buf, cap, "{");
	for (size_t i = 0; i < n && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%.17g", i ? "," : "", v[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, "}");
}
