/* cotrain-server: the web site (doc/web.md).  Pages are static HTML; their
 * scripts fetch the JSON API and build the DOM with textContent only, so
 * nothing a user typed is ever parsed as markup.  Every answer carries a
 * Content-Security-Policy that allows only the site's own scripts and
 * styles, and no inline script. */
#include "server/credit.h"
#include "server/web.h"

#include <string.h>

#include <microhttpd.h>

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

static void serve(http_req *req, const web_file *f)
{
	struct MHD_Response *r =
	        MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, f->content_type);
	MHD_add_response_header(r, "Content-Security-Policy", WEB_CSP);
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "public, max-age=300");
	http_reply_response(req, 200, r);
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
