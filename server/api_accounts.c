/* cotrain-server: accounts: create, log in, who am I, log out.
 *
 * Passwords are stored with shared/password (PBKDF2-HMAC-SHA256, iterations
 * from --kdf-iterations); account keys are 32 random bytes in base64url, of
 * which only the sha256 is stored, one row per log-in, revocable. */
#include "server/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "server/auth_limit.h"
#include "server/dbconn.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/database/password.h"

#define KEY_BYTES 32
#define KEY_CHARS API_ACCOUNT_KEY_CHARS

/* A fresh account key into key and its hash parameter; false when no random
 * key could be drawn. */
static bool draw_key(char key[KEY_CHARS], char hp[API_HASH_PARAM_LEN])
{
	unsigned char md[HASH_SHA256_LEN];
	if (hash_random_token(KEY_BYTES, key, KEY_CHARS) || hash_sha256(key, strlen(key), md))
		return false;
	hp[0] = '\\';
	hp[1] = 'x';
	hash_hex(md, sizeof md, hp + 2);
	return true;
}

/* draw_key, answering 500 when it fails. */
static bool new_key(http_req *req, char key[KEY_CHARS], char hp[API_HASH_PARAM_LEN])
{
	if (draw_key(key, hp))
		return true;
	http_reply_error(req, 500, "internal_error", "could not draw a random key", NULL);
	return false;
}

static void reply_key(http_req *req, int status, const char *account_id, const char *key)
{
	http_reply_json(req, status,
	                json_pack("{s:I, s:s}", "account_id", (json_int_t)strtoll(account_id, NULL, 10),
	                          "account_key", key));
}

static const dbc_stmt st_create = {
	"account_create",
	"WITH a AS (INSERT INTO account (email, name, password_hash, cross_project_id)"
	"           VALUES ($1, $2, $3, $4) RETURNING id)"
	" INSERT INTO account_key (account_id, key_hash) SELECT id, $5::bytea FROM a"
	" RETURNING account_id",
	5
};

/* Set *e to an error and return false. */
static bool refuse(api_account_error *e, int status, const char *code, const char *hint, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));
static bool refuse(api_account_error *e, int status, const char *code, const char *hint, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	e->status = status;
	e->code = code;
	snprintf(e->hint, sizeof e->hint, "%s", hint ? hint : "");
	return false;
}

static bool length_ok(api_account_error *e, const char *field, const char *s, size_t min, size_t max)
{
	size_t n = strlen(s);
	if (n >= min && n <= max)
		return true;
	return refuse(e, 400, "invalid", NULL, "field \"%s\" must be %zu to %zu bytes long (got %zu)", field,
	              min, max, n);
}

bool api_account_new(http_req *req, const char *email, const char *name, const char *password,
                     long long *account_id, char key[API_ACCOUNT_KEY_CHARS], api_account_error *e)
{
	memset(e, 0, sizeof *e);
	if (!length_ok(e, "email", email, 3, 254) || !length_ok(e, "name", name, 1, 100) ||
	    !length_ok(e, "password", password, 8, PASSWORD_MAX_LEN))
		return false;
	if (!strchr(email, '@'))
		return refuse(e, 400, "invalid", NULL, "field \"email\" is not an email address");
	cot_errbuf eb = { 0 };
	if (!api_text_check("name", name, &eb) || !api_text_check("email", email, &eb))
		return refuse(e, 400, "invalid", eb.hint, "%s", eb.msg);
	char phash[PASSWORD_HASH_MAX], cpid_raw[16], cpid[33], hp[API_HASH_PARAM_LEN];
	switch (auth_limit_take(req, &e->retry_after)) {
	case AUTH_LIMIT_OK:
		break;
	case AUTH_LIMIT_RATE:
		return refuse(e, 429, "too_many_requests",
		              "Wait for the time Retry-After says, then try again.",
		              "too many log-ins or sign-ups from this address");
	default:
		return refuse(e, 503, "unavailable", "Try again in a moment.",
		              "the server is busy with other log-ins");
	}
	cot_err hrc = password_hash(password, req->cfg->kdf_iterations, phash, sizeof phash, &eb);
	auth_limit_leave();
	if (hrc || hash_random(cpid_raw, sizeof cpid_raw))
		return refuse(e, 500, "internal_error", NULL, "could not hash the password");
	hash_hex((unsigned char *)cpid_raw, sizeof cpid_raw, cpid);
	if (!draw_key(key, hp))
		return refuse(e, 500, "internal_error", NULL, "could not draw a random key");
	const char *params[] = { email, name, phash, cpid, hp };
	PGresult *r;
	char state[6];
	if (dbc_exec(&st_create, params, &r, state, &eb)) {
		if (strcmp(state, "23505") == 0)
			return refuse(e, 409, "already_exists", "Log in with it, or use another address.",
			              "an account with this email address already exists");
		if (strncmp(state, "23", 2) == 0 || strncmp(state, "22", 2) == 0)
			return refuse(e, 400, "invalid", NULL, "%s", eb.msg);
		return refuse(e, 503, "database_error", eb.hint[0] ? eb.hint : "Try again later.", "%s",
		              eb.msg);
	}
	*account_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return true;
}

void api_account_create(http_req *req)
{
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *email = NULL, *name = NULL, *password = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_str(body, "email", true, 3, 254, &email, &eb) ||
	    cot_json_str(body, "name", true, 1, 100, &name, &eb) ||
	    cot_json_str(body, "password", true, 8, PASSWORD_MAX_LEN, &password, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	long long id;
	char key[API_ACCOUNT_KEY_CHARS];
	api_account_error e;
	if (!api_account_new(req, email, name, password, &id, key, &e)) {
		http_reply_error(req, e.status, e.code, e.message, e.hint[0] ? e.hint : NULL);
		if (e.retry_after > 0 && (e.status == 429 || e.status == 503)) {
			char ra[16];
			snprintf(ra, sizeof ra, "%d", e.retry_after);
			http_add_header(req, "Retry-After", ra);
		}
		goto out;
	}
	http_reply_json(req, 201, json_pack("{s:I, s:s}", "account_id", (json_int_t)id, "account_key", key));
out:
	json_decref(body);
}

static const dbc_stmt st_lookup = {
	"account_lookup", "SELECT id, password_hash, disabled FROM account WHERE lower(email) = lower($1)", 1
};
static const dbc_stmt st_new_key = {
	"account_new_key",
	"INSERT INTO account_key (account_id, key_hash) VALUES ($1, $2::bytea) RETURNING account_id", 2
};

void api_account_login(http_req *req)
{
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *email = NULL, *password = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_str(body, "email", true, 1, 254, &email, &eb) ||
	    cot_json_str(body, "password", true, 1, PASSWORD_MAX_LEN, &password, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (!auth_limit_enter(req))
		goto out;
	const char *params[] = { email };
	PGresult *r = api_exec(req, &st_lookup, params, NULL);
	if (!r) {
		auth_limit_leave();
		goto out;
	}
	bool match = false;
	char id[32] = "";
	if (PQntuples(r) == 1) {
		snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
		bool disabled = PQgetvalue(r, 0, 2)[0] == 't';
		if (password_verify(password, PQgetvalue(r, 0, 1), &match, &eb) || disabled)
			match = false;
	} else {
		/* Spend the same time on an unknown email, so timing does not tell
		 * which emails have accounts. */
		char dummy[PASSWORD_HASH_MAX];
		password_hash(password, req->cfg->kdf_iterations, dummy, sizeof dummy, NULL);
	}
	auth_limit_leave();
	PQclear(r);
	if (!match) {
		http_reply_error(req, 401, "unauthorized", "wrong email or password", NULL);
		goto out;
	}
	char key[KEY_CHARS], hp[API_HASH_PARAM_LEN];
	if (!new_key(req, key, hp))
		goto out;
	const char *kparams[] = { id, hp };
	r = api_exec(req, &st_new_key, kparams, NULL);
	if (!r)
		goto out;
	reply_key(req, 200, id, key);
	PQclear(r);
out:
	json_decref(body);
}

/* The account as GET /v1/account shows it: cpid is the cross-project id the
 * stats export publishes, md5(cross_project_id || lower(email)). */
#define ACCOUNT_JSON \
	"json_build_object('id', a.id, 'email', a.email, 'name', a.name," \
	"                  'team_id', a.team_id, 'created_at', a.created_at," \
	"                  'prefs', a.prefs, 'show_hosts', a.show_hosts," \
	"                  'cpid', md5(a.cross_project_id || lower(a.email)))::text"

static const dbc_stmt st_get = { "account_get",
	                         "SELECT " ACCOUNT_JSON
	                         "  FROM account_key k JOIN account a ON a.id = k.account_id"
	                         " WHERE k.key_hash = $1::bytea AND NOT k.revoked AND NOT a.disabled",
	                         1 };

void api_account_get(http_req *req)
{
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	const char *params[] = { hp };
	PGresult *r = api_exec(req, &st_get, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) == 1)
		http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
	else
		http_reply_error(req, 401, "unauthorized", "account key is not valid",
		                 "Log in again to get a new account key.");
	PQclear(r);
}

static const dbc_stmt st_logout = { "account_logout",
	                            "UPDATE account_key k SET revoked = true FROM account a"
	                            " WHERE a.id = k.account_id AND k.key_hash = $1::bytea AND NOT k.revoked "
	                            "AND NOT a.disabled"
	                            " RETURNING k.account_id",
	                            1 };

void api_account_logout(http_req *req)
{
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	const char *params[] = { hp };
	PGresult *r = api_exec(req, &st_logout, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) == 1)
		http_reply_json(req, 200, json_pack("{s:b}", "revoked", 1));
	else
		http_reply_error(req, 401, "unauthorized", "account key is not valid", NULL);
	PQclear(r);
}

static const dbc_stmt st_update = { "account_update",
	                            "UPDATE account a SET name = coalesce($2, a.name),"
	                            "       cross_project_id = coalesce($3, a.cross_project_id),"
	                            "       show_hosts = coalesce($4::boolean, a.show_hosts)"
	                            " WHERE a.id = $1 AND NOT a.disabled RETURNING " ACCOUNT_JSON,
	                            4 };

/* A BOINC cross-project id: 32 hex digits (BOINC draws them as md5 hex),
 * written into out in lowercase, as BOINC stores them. */
static bool cross_project_id_ok(const char *s, char out[33])
{
	size_t n = 0;
	for (; s[n]; n++) {
		char c = s[n];
		if (n == 32 || !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
			return false;
		out[n] = (char)(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
	}
	out[n] = '\0';
	return n == 32;
}

void api_account_update(http_req *req)
{
	long long account;
	if (!api_account(req, &account))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *name = NULL, *cpid = NULL;
	cot_errbuf eb = { 0 };
	const json_t *sh = json_object_get(body, "show_hosts");
	if (cot_json_str(body, "name", false, 1, 100, &name, &eb) ||
	    cot_json_str(body, "cross_project_id", false, 0, 64, &cpid, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (sh && !json_is_boolean(sh)) {
		http_reply_error(req, 400, "invalid", "field \"show_hosts\" must be true or false", NULL);
		goto out;
	}
	const char *known[] = { "name", "cross_project_id", "show_hosts" };
	const char *key;
	json_t *v;
	json_object_foreach(body, key, v)
	{
		bool found = false;
		for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
			found |= strcmp(key, known[i]) == 0;
		if (!found) {
			char msg[200];
			snprintf(msg, sizeof msg, "field \"%.100s\" cannot be changed here", key);
			http_reply_error(req, 400, "invalid", msg,
			                 "The fields are name, cross_project_id and show_hosts.");
			goto out;
		}
	}
	if (name && !api_text_ok(req, "name", name))
		goto out;
	char cp[33];
	if (cpid && !cross_project_id_ok(cpid, cp)) {
		http_reply_error(req, 400, "invalid",
		                 "field \"cross_project_id\" is not a BOINC cross-project id",
		                 "A cross-project id is 32 hexadecimal digits; BOINC clients keep it as "
		                 "<cross_project_id> in each project of client_state.xml.");
		goto out;
	}
	char acc[24];
	snprintf(acc, sizeof acc, "%lld", account);
	const char *params[] = { acc, name, cpid ? cp : NULL,
		                 sh ? (json_is_true(sh) ? "true" : "false") : NULL };
	api_reply_row(req, &st_update, params, "the account does not exist");
out:
	json_decref(body);
}
