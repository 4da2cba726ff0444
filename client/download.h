/* cotrain client: fetching one file with libcurl, resumably and verified.
 *
 * The bytes go to <downloads_dir>/<sha256>.part.  A part left by an earlier
 * attempt (a dropped connection, a kill -9, a reboot) is resumed with an
 * HTTP Range request; a server that ignores the range (200 instead of 206)
 * or answers a different range makes the download start over.  The body may
 * not exceed the expected size (nor max_bytes): the transfer is cut as soon
 * as it does.  When the part is complete its sha256 is checked; a mismatch
 * deletes it (so the next attempt fetches it again from zero).  A verified
 * file is fsynced and renamed to dest_path.  Only http and https URLs are
 * followed, with no redirects. */
#ifndef CL_DOWNLOAD_H
#define CL_DOWNLOAD_H

#include <stdint.h>

#include "shared/common/error.h"

typedef struct {
	const char *url;           /* absolute http(s) URL */
	const char *sha256;        /* expected, 64 lowercase hex digits */
	int64_t size;              /* expected size in bytes (>= 0) */
	int64_t max_bytes;         /* refuse anything larger */
	const char *bearer;        /* Authorization: Bearer ..., or NULL */
	int64_t rate_limit;        /* bytes/s, 0 = unlimited */
	int timeout_s;             /* give up when no byte arrives for this long */
	const char *downloads_dir; /* where the .part lives (created if missing) */
	const char *dest_path;     /* where the verified file goes */
	volatile int *cancel;      /* when non-NULL and set, stop (COT_ERR_TIMEOUT) */
} cl_download_req;

typedef struct {
	int64_t resumed_from; /* bytes already there when the attempt began */
	int64_t fetched;      /* bytes received in this attempt */
	long http_status;
} cl_download_info;

/* Download r->url as described above.  Returns COT_OK when dest_path holds
 * the verified file.  Errors: COT_ERR_INVALID (bad request fields, or a URL
 * that is not http/https), COT_ERR_TOO_LARGE (size over max_bytes, or the
 * server sends more than size), COT_ERR_CORRUPT (sha256 or size mismatch;
 * the part was deleted), COT_ERR_NOT_FOUND (404), COT_ERR_AUTH (401/403),
 * COT_ERR_NETWORK (connection, timeout, 5xx, other status: retry later, the
 * part is kept), COT_ERR_IO (disk full, unwritable folder; the part is kept
 * when sound).  info may be NULL. */
cot_err cl_download(const cl_download_req *r, cl_download_info *info, cot_errbuf *eb);

/* The size of the file at url, from a HEAD request (for a file named by
 * its sha256 without a size).  COT_ERR_NOT_FOUND, COT_ERR_NETWORK. */
cot_err cl_download_size(const char *url, const char *bearer, int timeout_s, int64_t *size, cot_errbuf *eb);

#endif
