/* cotrain-server: the web site (doc/web.md).  Pages are static HTML; their
 * scripts fetch the JSON API and build the DOM with textContent only, so
 * nothing a user typed is ever parsed as markup.  Every answer carries a
 * Content-Security-Policy that allows only the site's own scripts and
 * styles, and no inline script. */
#include "server/credit.h"
#include "server/web.h"

#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "server/http.h"

#define WEB_CSP \
	"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;" \
	" connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

const web_file *web_find(const char *name)
{
	for (int i = 0; i < web_n_files; i++)
		if (strcmp(web_files[i].name, name) == 0)
			return &web_files[i];
	return NULL;
}

/* The security headers every page carries. */
static void add_security_headers(struct MHD_Response *r)
{
	MHD_add_response_header(r, "Content-Security-Policy", WEB_CSP);
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
}

static void serve(http_req *req, const web_file *f)
{
	struct MHD_Response *r =
	        MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, f->content_type);
	add_security_headers(r);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "public, max-age=300");
	http_reply_response(req, 200, r);
}

/* Append s escaped for HTML to out (of capacity cap, length *len); false
 * when it does not fit. */
static bool append_escaped(char *out, size_t cap, size_t *len, const char *s)
{
	for (; *s; s++) {
		const char *e = NULL;
		switch (*s) {
		case '&':
			e = "&amp;";
			break;
		case '<':
			e = "&lt;";
			break;
		case '>':
			e = "&gt;";
			break;
		case '"':
			e = "&quot;";
			break;
		case '\'':
			e = "&#39;";
			break;
		}
		size_t n = e ? strlen(e) : 1;
		if (*len + n >= cap)
			return false;
		memcpy(out + *len, e ? e : s, n);
		*len += n;
	}
	return true;
}

void web_reply_template(http_req *req, int status, const char *file, const char *const *names,
                        const char *const *values, int n)
{
	const web_file *f = web_find(file);
	size_t extra = 0;
	for (int i = 0; i < n; i++)
		extra += 6 * strlen(values[i]) + 1;
	size_t cap = (f ? f->len : 0) * 2 + extra + 1, len = 0;
	char *out = f ? malloc(cap) : NULL;
	bool ok = out != NULL;
	const char *p = f ? (const char *)f->data : "", *end = p + (f ? f->len : 0);
	while (ok && p < end) {
		const char *open = strstr(p, "{{");
		const char *close = open ? strstr(open, "}}") : NULL;
		if (!open || !close)
			open = close = end;
		size_t lit = (size_t)(open - p);
		ok = len + lit < cap;
		if (ok) {
			memcpy(out + len, p, lit);
			len += lit;
		}
		if (!ok || open == end)
			break;
		int k = -1;
		for (int i = 0; i < n && k < 0; i++)
			if (strlen(names[i]) == (size_t)(close - open - 2) &&
			    memcmp(open + 2, names[i], (size_t)(close - open - 2)) == 0)
				k = i;
		ok = k >= 0 && append_escaped(out, cap, &len, values[k]); /* an unknown name is a bug */
		p = close + 2;
	}
	struct MHD_Response *r = ok ? MHD_create_response_from_buffer(len, out, MHD_RESPMEM_MUST_FREE) : NULL;
	if (!r) {
		free(out);
		http_reply_error(req, 500, "internal_error", "could not make the page", NULL);
		return;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
	add_security_headers(r);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	http_reply_response(req, status, r);
}

void web_page(http_req *req)
{
	static const struct {
		const char *path, *file;
	} pages[] = {
		{ "/", "index.html" },
		{ "/dashboard", "dashboard.html" },
		{ "/leaderboard", "leaderboard.html" },
		{ "/user", "user.html" },
		{ "/team", "team.html" },
		{ "/host", "host.html" },
	};
	for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++)
		if (strcmp(req->path, pages[i].path) == 0) {
			const web_file *f = web_find(pages[i].file);
			if (f) {
				serve(req, f);
				return;
			}
		}
	http_reply_error(req, 404, "not_found", "no such page", NULL);
}

void web_static(http_req *req)
{
	const web_file *f = web_find(req->params[0]);
	if (!f || strstr(f->name, ".html")) {
		http_reply_error(req, 404, "not_found", "no such file", NULL);
		return;
	}
	serve(req, f);
}
