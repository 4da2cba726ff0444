/* cotrain-server: GET and HEAD /files/<sha256> from the content-addressed
 * store (shared/common/filestore.h layout).  Files never change under a name, so
 * the ETag is the name itself, If-None-Match answers 304, and responses may
 * be cached for ever.  One byte range per request (206, or 416 when it
 * starts past the end); a list of ranges is answered with the whole file,
 * which RFC 9110 allows.  Names other than 64 lowercase hex digits are 400. */
#include "server/api.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"

/* Parse a Range header against size.  Returns 1 with [*off, *off + *len)
 * for one satisfiable range, 0 to send the whole file (no header, an unknown
 * unit, several ranges or a malformed one), -1 when unsatisfiable. */
static int parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len)
{
	if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
		return 0;
	const char *p = h + 6;
	while (*p == ' ')
		p++;
	char *end;
	if (*p == '-') { /* the last n bytes */
		if (p[1] < '0' || p[1] > '9')
			return 0;
		errno = 0;
		uint64_t n = strtoull(p + 1, &end, 10);
		if (errno || *end)
			return 0;
		if (n == 0 || size == 0)
			return -1;
		if (n > size)
			n = size;
		*off = size - n;
		*len = n;
		return 1;
	}
	if (*p < '0' || *p > '9')
		return 0;
	errno = 0;
	uint64_t a = strtoull(p, &end, 10);
	if (errno || *end != '-')
		return 0;
	p = end + 1;
	uint64_t b = UINT64_MAX;
	if (*p) {
		if (*p < '0' || *p > '9')
			return 0;
		b = strtoull(p, &end, 10);
		if (errno || *end || b < a)
			return 0;
	}
	if (a >= size)
		return -1;
	if (b >= size)
		b = size - 1;
	*off = a;
	*len = b - a + 1;
	return 1;
}

/* Does an If-None-Match header name this file?  Entity tags here are the
 * quoted name; weak comparison, so W/"..." matches too. */
static bool etag_matches(const char *inm, const char *sha)
{
	if (!inm)
		return false;
	const char *s = inm;
	while (*s == ' ')
		s++;
	if (strcmp(s, "*") == 0)
		return true;
	return strstr(inm, sha) != NULL;
}

static void add_headers(struct MHD_Response *r, const char *etag)
{
	MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
	MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "public, max-age=31536000, immutable");
}

void files_get(http_req *req)
{
	const char *sha = req->params[0];
	if (!hash_is_sha256_hex(sha)) {
		http_reply_error(req, 400, "invalid", "file name is not a sha256",
		                 "File names are 64 lowercase hexadecimal digits.");
		return;
	}
	char path[4200];
	cot_errbuf eb = { 0 };
	if (fs_path(req->cfg->files_dir, sha, path, sizeof path, &eb)) {
		http_reply_cot(req, COT_ERR_INTERNAL, &eb);
		return;
	}
	char msg[120];
	snprintf(msg, sizeof msg, "file %s does not exist", sha);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			http_reply_error(req, 404, "not_found", msg, NULL);
		else
			http_reply_error(req, 500, "io_error", "could not open the file", NULL);
		return;
	}
	struct stat stbuf;
	if (fstat(fd, &stbuf) || !S_ISREG(stbuf.st_mode)) {
		close(fd);
		http_reply_error(req, 404, "not_found", msg, NULL);
		return;
	}
	uint64_t size = (uint64_t)stbuf.st_size;
	char etag[HASH_SHA256_HEX_LEN + 3];
	snprintf(etag, sizeof etag, "\"%s\"", sha);

	struct MHD_Response *r;
	if (etag_matches(http_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH), sha)) {
		close(fd);
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
		if (r) {
			add_headers(r, etag);
			http_reply_response(req, MHD_HTTP_NOT_MODIFIED, r);
		}
		return;
	}

	uint64_t off = 0, len = size;
	int range = parse_range(http_header(req, MHD_HTTP_HEADER_RANGE), size, &off, &len);
	if (range < 0) {
		close(fd);
		char cr[48];
		snprintf(cr, sizeof cr, "bytes */%" PRIu64, size);
		http_reply_error(req, MHD_HTTP_RANGE_NOT_SATISFIABLE, "range_not_satisfiable",
		                 "the requested range starts past the end of the file", NULL);
		http_add_header(req, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
		return;
	}
	if (len == 0) {
		close(fd);
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	} else {
		r = MHD_create_response_from_fd_at_offset64(len, fd, off); /* owns fd */
		if (!r)
			close(fd);
	}
	if (!r)
		return;
	/* The server's egress per file, which tests of peer-served
	 * checkpoints count (doc/design.md, "Checkpoints from peers"). */
	log_debug("file %s: sending %" PRIu64 " bytes from offset %" PRIu64, sha, len, off);
	add_headers(r, etag);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
	if (range > 0) {
		char cr[80];
		snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, off, off + len - 1, size);
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
		http_reply_response(req, MHD_HTTP_PARTIAL_CONTENT, r);
	} else {
		http_reply_response(req, MHD_HTTP_OK, r);
	}
}
