/* cotrain-server: the web site's sign-up form (doc/web.md, "Joining").
 *
 * GET /signup answers the form with a fresh random token in a hidden field
 * and the same token in a cookie (HttpOnly, SameSite=Strict, Path=/signup):
 * a double-submit token.  POST /signup (application/x-www-form-urlencoded)
 * is taken only when the field equals the cookie and the browser does not
 * say the post came from elsewhere (Origin, Sec-Fetch-Site): another site
 * can neither read nor set the cookie, and a SameSite=Strict cookie is not
 * sent with its post.  The account is made by api_account_new under the
 * API's rules and its limit per address; the answer shows the account key
 * and the exact attach command for the project.  Nothing the user typed is
 * put in a page unescaped (web_reply_template). */
#include "server/api.h"
#include "server/credit.h"
#include "server/web.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "server/dbconn.h"
#include "shared/common/hash.h"

#define FIELD_MAX 1024
#define TOKEN_CHARS 48
#define COOKIE "cotrain_csrf"

typedef struct {
	char csrf[TOKEN_CHARS], project[72];
	char email[FIELD_MAX], name[FIELD_MAX], password[FIELD_MAX];
} signup_form;

/* Decode n bytes of a form value ('+' is a space, %XX a byte) into out of
 * capacity cap.  False for a bad escape, a NUL, or a value too long. */
static bool form_decode(const char *s, size_t n, char *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (c == '+') {
			c = ' ';
		} else if (c == '%') {
			int a = i + 1 < n ? hash_hex_digit(s[i + 1]) : -1,
			    b = i + 2 < n ? hash_hex_digit(s[i + 2]) : -1;
			if (a < 0 || b < 0)
				return false;
			c = (char)(a * 16 + b);
			i += 2;
		}
		if (c == '\0' || k + 1 >= cap)
			return false;
		out[k++] = c;
	}
	out[k] = '\0';
	return true;
}

/* Parse the form body into f.  False with a message in why for a field
 * that cannot be decoded, is too long, is given twice or is not UTF-8. */
static bool parse_form(const char *body, size_t len, signup_form *f, char *why, size_t whylen)
{
	static const char *const keys[] = { "csrf", "project", "email", "name", "password" };
	char *dst[] = { f->csrf, f->project, f->email, f->name, f->password };
	size_t caps[] = { sizeof f->csrf, sizeof f->project, FIELD_MAX, FIELD_MAX, FIELD_MAX };
	bool seen[5] = { false };
	memset(f, 0, sizeof *f);
	const char *p = body, *end = body + len;
	while (p < end) {
		const char *amp = memchr(p, '&', (size_t)(end - p));
		const char *stop = amp ? amp : end;
		const char *eq = memchr(p, '=', (size_t)(stop - p));
		char key[16];
		if (eq && form_decode(p, (size_t)(eq - p), key, sizeof key)) {
			for (int i = 0; i < 5; i++) {
				if (strcmp(key, keys[i]) != 0)
					continue;
				if (seen[i]) {
					snprintf(why, whylen, "field \"%s\" is given twice", keys[i]);
					return false;
				}
				seen[i] = true;
				if (!form_decode(eq + 1, (size_t)(stop - eq - 1), dst[i], caps[i])) {
					snprintf(why, whylen, "field \"%s\" is too long or badly encoded",
					         keys[i]);
					return false;
				}
				json_t *s = json_string(dst[i]); /* Jansson checks UTF-8 */
				if (!s) {
					snprintf(why, whylen, "field \"%s\" is not valid UTF-8", keys[i]);
					return false;
				}
				json_decref(s);
			}
		}
		p = stop + 1;
	}
	return true;
}

/* The site's base URL as the browser reached it, for the attach command:
 * the Host header when it looks like a host name, https when a proxy says
 * so (X-Forwarded-Proto). */
static void base_url(http_req *req, char *out, size_t len)
{
	const char *host = http_header(req, "Host"), *proto = http_header(req, "X-Forwarded-Proto");
	bool good = host && *host && strlen(host) <= 255;
	for (const char *c = host; good && *c; c++)
		good = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
		       strchr(".-:[]", *c);
	snprintf(out, len, "%s://%s", proto && strcmp(proto, "https") == 0 ? "https" : "http",
	         good ? host : "SERVER");
}

/* True when the browser says the post came from this site, or says nothing
 * (curl, old browsers): Origin, when sent, must be this Host; Sec-Fetch-Site,
 * when sent, same-origin or none. */
static bool same_site(http_req *req)
{
	const char *origin = http_header(req, "Origin"), *site = http_header(req, "Sec-Fetch-Site");
	const char *host = http_header(req, "Host");
	if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
		return false;
	if (!origin)
		return true;
	const char *o = strstr(origin, "://");
	return o && host && strcmp(o + 3, host) == 0 &&
	       (strncmp(origin, "http://", 7) == 0 || strncmp(origin, "https://", 8) == 0);
}

static bool tokens_equal(const char *a, const char *b)
{
	size_t n = strlen(a);
	if (n != strlen(b) || n < 32)
		return false;
	unsigned char d = 0;
	for (size_t i = 0; i < n; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

static const dbc_stmt st_project = {
	"signup_project",
	"SELECT name FROM project WHERE $1 = '' OR name = $1 ORDER BY name = $1 DESC, name LIMIT 1", 1
};

/* The project to attach to: the one named (when it exists), else the first
 * by name; "" when there is none. */
static void project_of(const char *wanted, char *out, size_t len)
{
	const char *params[] = { wanted };
	PGresult *r;
	char state[6];
	cot_errbuf eb = { 0 };
	out[0] = '\0';
	if (strlen(wanted) > 64 || dbc_exec(&st_project, params, &r, state, &eb))
		return;
	if (PQntuples(r) == 1)
		snprintf(out, len, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
}

/* Answer the form (status) with a fresh token, a message and what the user
 * typed (never the password). */
static void reply_form(http_req *req, int status, const char *error, const char *hint, const char *project,
                       const char *email, const char *name)
{
	char token[TOKEN_CHARS], cookie[160];
	if (hash_random_token(32, token, sizeof token)) {
		http_reply_error(req, 500, "internal_error", "could not draw a form token", NULL);
		return;
	}
	const char *names[] = { "error", "hint", "csrf", "project", "email", "name" };
	const char *values[] = { error, hint, token, project, email, name };
	web_reply_template(req, status, "signup.html", names, values, 6);
	snprintf(cookie, sizeof cookie, COOKIE "=%s; Path=/signup; HttpOnly; SameSite=Strict; Max-Age=3600",
	         token);
	http_add_header(req, "Set-Cookie", cookie);
}

void web_signup_form(http_req *req)
{
	const char *p = http_query(req, "project");
	char project[72];
	project_of(p ? p : "", project, sizeof project);
	reply_form(req, 200, "", "", project, "", "");
}

void web_signup_post(http_req *req)
{
	signup_form f;
	char why[160];
	const char *cookie = http_cookie(req, COOKIE);
	if (!same_site(req) || !cookie) {
		reply_form(req, 403, "cross-site form post refused",
		           "Open the sign-up page of this site and send the form from there (with cookies "
		           "allowed for this site).",
		           "", "", "");
		return;
	}
	if (!parse_form(req->body, req->body_len, &f, why, sizeof why)) {
		reply_form(req, 400, why, "", "", "", "");
		return;
	}
	if (!tokens_equal(f.csrf, cookie)) {
		reply_form(req, 403, "cross-site form post refused",
		           "The form's token does not match: open the sign-up page again and resend it.",
		           f.project, f.email, f.name);
		return;
	}
	long long id;
	char key[API_ACCOUNT_KEY_CHARS];
	api_account_error e;
	if (!api_account_new(req, f.email, f.name, f.password, &id, key, &e)) {
		reply_form(req, e.status, e.message, e.hint, f.project, f.email, f.name);
		if (e.retry_after > 0 && (e.status == 429 || e.status == 503)) {
			char ra[16];
			snprintf(ra, sizeof ra, "%d", e.retry_after);
			http_add_header(req, "Retry-After", ra);
		}
		return;
	}
	char base[300], project[72], command[600], ids[24];
	base_url(req, base, sizeof base);
	project_of(f.project, project, sizeof project);
	snprintf(command, sizeof command, "cotrainctl attach %s/projects/%s --key %s", base,
	         project[0] ? project : "PROJECT", key);
	snprintf(ids, sizeof ids, "%lld", id);
	const char *names[] = { "name", "key", "command", "account_id" };
	const char *values[] = { f.name, key, command, ids };
	web_reply_template(req, 201, "signup-done.html", names, values, 4);
}
