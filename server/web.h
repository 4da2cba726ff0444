/* cotrain-server: the web site's files, embedded at build time from web/
 * (web/embed-web.sh), so the server needs no install path to serve them. */
#ifndef COT_SERVER_WEB_H
#define COT_SERVER_WEB_H

#include <stddef.h>

typedef struct {
	const char *name; /* base name: "leaderboard.html", "app.js" */
	const char *content_type;
	const unsigned char *data;
	size_t len;
} web_file;

extern const web_file web_files[];
extern const int web_n_files;

/* The file of that base name, or NULL. */
const web_file *web_find(const char *name);

struct http_req;

/* Answer req with the HTML template of that base name, each {{names[i]}}
 * replaced by values[i] escaped for HTML text and attributes (& < > " '),
 * with the site's security headers and Cache-Control: no-store (the pages
 * made this way carry a form token or an account key).  A template that is
 * missing, or no memory, gives a 500. */
void web_reply_template(struct http_req *req, int status, const char *file, const char *const *names,
                        const char *const *values, int n);

#endif
