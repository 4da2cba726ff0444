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

#endif
