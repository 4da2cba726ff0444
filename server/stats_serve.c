/* cotrain-server: the statistics export served under /stats/ (doc/credit.md,
 * "Stats export"), so stats sites fetch tables.xml, user.gz, team.gz,
 * host.gz ... from the server that writes them (--stats-dir).
 *
 * Each file is answered with an entity tag made of its inode, size and
 * modification time, its Last-Modified, and Cache-Control for an hour; a
 * request whose If-None-Match names the tag (or, without If-None-Match, whose
 * If-Modified-Since is not older than the file) gets 304 and no body.  The
 * export replaces its folder in one step (export_stats.c), so a file opened
 * here is always whole. */
#include "server/credit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

/* A name the export writes: [a-z0-9_]{1,40} then .xml or .gz; nothing else
 * (no path, no dot files) is ever opened. */
static const char *content_type_of(const char *name)
{
	size_t n = strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_");
	if (n == 0 || n > 40)
		return NULL;
	if (strcmp(name + n, ".xml") == 0)
		return "application/xml; charset=utf-8";
	if (strcmp(name + n, ".gz") == 0)
		return "application/gzip";
	return NULL;
}

/* Does an If-None-Match list hold etag (weak comparison) or "*"? */
static bool none_match(const char *inm, const char *etag)
{
	const char *bare = etag + 1; /* without its opening quote: W/"x" matches "x" */
	size_t n = strlen(bare);
	for (const char *p = inm; *p;) {
		p += strspn(p, " ,\t");
		size_t len = strcspn(p, ",");
		const char *t = p;
		if (len >= 2 && strncmp(t, "W/", 2) == 0)
			t += 2, len -= 2;
		while (len > 0 && (t[len - 1] == ' ' || t[len - 1] == '\t'))
			len--;
		if ((len == 1 && *t == '*') || (len == n + 1 && *t == '"' && strncmp(t + 1, bare, n) == 0))
			return true;
		p += strcspn(p, ",");
	}
	return false;
}

/* HTTP date text (RFC 9110 IMF-fixdate) to unix seconds, or -1. */
static time_t http_date(const char *s)
{
	struct tm tm = { 0 };
	const char *end = s ? strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm) : NULL;
	return end && *end == '\0' ? timegm(&tm) : (time_t)-1;
}

static void add_cache_headers(struct MHD_Response *r, const char *etag, const char *modified)
{
	MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
	MHD_add_response_header(r, MHD_HTTP_HEADER_LAST_MODIFIED, modified);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "public, max-age=3600");
}

void stats_get(http_req *req)
{
	const char *name = req->params[0], *type = content_type_of(name);
	const char *dir = req->cfg->stats_dir;
	char msg[120];
	snprintf(msg, sizeof msg, "no statistics file \"%.60s\"", name);
	if (!dir) {
		http_reply_error(req, 404, "not_found", "this server does not export statistics",
		                 "Its operator starts cotrain-server with --stats-dir DIR to publish them.");
		return;
	}
	if (!type) {
		http_reply_error(req, 404, "not_found", msg, "The export holds tables.xml and *.gz files.");
		return;
	}
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (fd < 0 && e != ENOENT && e != ENOTDIR && e != ELOOP)
			http_reply_error(req, 500, "io_error", "could not open the statistics file", NULL);
		else
			http_reply_error(req, 404, "not_found", msg,
			                 "The export is written every --stats-interval seconds; the first "
			                 "may "
			                 "not be written yet.");
		return;
	}
	char etag[96], modified[64];
	snprintf(etag, sizeof etag, "\"%llx-%llx-%llx.%lx\"", (unsigned long long)st.st_ino,
	         (unsigned long long)st.st_size, (unsigned long long)st.st_mtim.tv_sec,
	         (unsigned long)st.st_mtim.tv_nsec);
	struct tm tm;
	gmtime_r(&st.st_mtim.tv_sec, &tm);
	strftime(modified, sizeof modified, "%a, %d %b %Y %H:%M:%S GMT", &tm);
	const char *inm = http_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH);
	time_t ims = inm ? (time_t)-1 : http_date(http_header(req, MHD_HTTP_HEADER_IF_MODIFIED_SINCE));
	struct MHD_Response *r;
	if (inm ? none_match(inm, etag) : (ims != (time_t)-1 && st.st_mtim.tv_sec <= ims)) {
		close(fd);
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
		if (r) {
			add_cache_headers(r, etag, modified);
			http_reply_response(req, MHD_HTTP_NOT_MODIFIED, r);
		}
		return;
	}
	r = st.st_size > 0 ? MHD_create_response_from_fd64((uint64_t)st.st_size, fd) /* owns fd */
	                   : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (st.st_size == 0 || !r)
		close(fd);
	if (!r)
		return;
	add_cache_headers(r, etag, modified);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	http_reply_response(req, MHD_HTTP_OK, r);
}
