/* cotrain client: resumable, verified downloads (see download.h). */
#include "client/download.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "shared/common/hash.h"

typedef struct {
	const cl_download_req *r;
	int fd;
	int64_t offset;      /* bytes in the part before this transfer */
	int64_t written;     /* bytes written in this transfer */
	int restarted;       /* the server ignored Range: we truncated */
	int checked;         /* status and range checked at the first body byte */
	int64_t range_start; /* from Content-Range, -1 when absent */
	cot_err rc;          /* why the write callback stopped the transfer */
	cot_errbuf *eb;
	CURL *curl;
} xfer;

static size_t on_header(char *buf, size_t size, size_t n, void *arg)
{
	xfer *x = arg;
	size_t len = size * n;
	char line[256];
	if (len < sizeof line && len > 14 && strncasecmp(buf, "Content-Range:", 14) == 0) {
		memcpy(line, buf, len);
		line[len] = '\0';
		long long a;
		if (sscanf(line + 14, " bytes %lld-", &a) == 1)
			x->range_start = a;
	}
	/* A new response (e.g. after 100 Continue) starts over. */
	if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0)
		x->range_start = -1;
	return len;
}

static size_t on_body(char *buf, size_t size, size_t n, void *arg)
{
	xfer *x = arg;
	size_t len = size * n;
	if (x->r->cancel && *x->r->cancel) {
		x->rc = cot_seterr(x->eb, COT_ERR_TIMEOUT, "download of %s was cancelled", x->r->sha256);
		return 0;
	}
	if (!x->checked) {
		long code = 0;
		curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
		if (code != 200 && code != 206)
			return len; /* an error page: discard, judged after */
		x->checked = 1;
		if (x->offset > 0 && (code == 200 || x->range_start != x->offset)) {
			/* Range ignored or answered for other bytes: start over. */
			if (ftruncate(x->fd, 0) < 0 || lseek(x->fd, 0, SEEK_SET) < 0) {
				x->rc = cot_seterr(x->eb, COT_ERR_IO,
				                   "could not truncate partial download: %s",
				                   strerror(errno));
				return 0;
			}
			x->offset = 0;
			x->restarted = 1;
			if (code == 206 && x->range_start != 0) {
				x->rc = cot_seterr(x->eb, COT_ERR_NETWORK,
				                   "server answered a different byte range than asked for %s",
				                   x->r->sha256);
				return 0;
			}
		}
	}
	if (x->offset + x->written + (int64_t)len > x->r->size) {
		x->rc = cot_seterr(x->eb, COT_ERR_TOO_LARGE,
		                   "server sent more than the %lld bytes announced for file %s",
		                   (long long)x->r->size, x->r->sha256);
		return 0;
	}
	size_t off = 0;
	while (off < len) {
		ssize_t w = write(x->fd, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = w < 0 ? errno : ENOSPC;
			x->rc = cot_seterr(x->eb, COT_ERR_IO, "could not write downloaded data: %s",
			                   strerror(e));
			if (e == ENOSPC || e == EDQUOT)
				cot_sethint(x->eb, "Free disk space or lower disk_max; the download resumes "
				                   "where it stopped.");
			return 0;
		}
		off += (size_t)w;
	}
	x->written += (int64_t)len;
	return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	xfer *x = arg;
	return x->r->cancel && *x->r->cancel;
}

static cot_err verify_and_install(const cl_download_req *r, const char *part, cot_errbuf *eb)
{
	char got[HASH_SHA256_HEX_LEN + 1];
	long long size = 0;
	cot_err rc = hash_file_sha256_hex(part, got, &size, eb);
	if (rc)
		return cot_seterr(eb, COT_ERR_IO, "could not read downloaded file \"%s\"", part);
	if (size != r->size || strcmp(got, r->sha256) != 0) {
		unlink(part);
		if (size != r->size)
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "downloaded file %s has %lld bytes, expected %lld", r->sha256, size,
			                (long long)r->size);
		else
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "downloaded file has sha256 %s, expected %s",
			                got, r->sha256);
		cot_sethint(eb, "The partial file was deleted; it will be fetched again.");
		return rc;
	}
	int fd = open(part, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	if (rename(part, r->dest_path) < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not move \"%s\" to \"%s\": %s", part, r->dest_path,
		                  strerror(errno));
	char dir[PATH_MAX];
	snprintf(dir, sizeof dir, "%s", r->dest_path);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		int dfd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return COT_OK;
}

cot_err cl_download(const cl_download_req *r, cl_download_info *info, cot_errbuf *eb)
{
	cl_download_info dummy;
	if (!info)
		info = &dummy;
	memset(info, 0, sizeof *info);
	if (!hash_is_sha256_hex(r->sha256))
		return cot_seterr(eb, COT_ERR_INVALID, "invalid sha256 \"%.80s\"", r->sha256);
	if (strncmp(r->url, "http://", 7) != 0 && strncmp(r->url, "https://", 8) != 0)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "refusing to download from \"%.200s\": only http and https URLs are "
		                  "allowed",
		                  r->url);
	if (r->size < 0 || r->size > r->max_bytes) {
		cot_seterr(eb, COT_ERR_TOO_LARGE, "file %s is %lld bytes, more than the %lld bytes allowed",
		           r->sha256, (long long)r->size, (long long)r->max_bytes);
		cot_sethint(eb, "Raise max_file_bytes in the configuration if the project really needs files "
		                "this large.");
		return COT_ERR_TOO_LARGE;
	}
	if (mkdir(r->downloads_dir, 0700) < 0 && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", r->downloads_dir,
		                  strerror(errno));
	char part[PATH_MAX];
	if (snprintf(part, sizeof part, "%s/%s.part", r->downloads_dir, r->sha256) >= (int)sizeof part)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "downloads path is too long");
	int fd = open(part, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open \"%s\": %s", part, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not stat \"%s\": %s", part, strerror(errno));
	}
	int64_t have = st.st_size;
	if (have > r->size) { /* cannot be ours: start over */
		if (ftruncate(fd, 0) < 0) {
			close(fd);
			return cot_seterr(eb, COT_ERR_IO, "could not truncate \"%s\": %s", part,
			                  strerror(errno));
		}
		have = 0;
	}
	info->resumed_from = have;
	if (have == r->size) { /* complete already: only verify */
		close(fd);
		return verify_and_install(r, part, eb);
	}
	if (lseek(fd, have, SEEK_SET) < 0) {
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not seek in \"%s\": %s", part, strerror(errno));
	}

	CURL *c = curl_easy_init();
	if (!c) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "could not start a transfer");
	}
	xfer x = { .r = r, .fd = fd, .offset = have, .range_start = -1, .eb = eb, .curl = c };
	struct curl_slist *hdrs = NULL;
	char auth[400];
	if (r->bearer && r->bearer[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->bearer);
		hdrs = curl_slist_append(hdrs, auth);
	}
	char errbuf[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(c, CURLOPT_URL, r->url);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
	curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(r->timeout_s > 0 ? r->timeout_s : 60));
	if (r->rate_limit > 0) {
		curl_easy_setopt(c, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)r->rate_limit);
		/* libcurl checks the rate only between bursts of up to 100 reads of
		 * one buffer each: with the default 16 KiB buffer and a fast link, a
		 * few MB arrive uncapped.  Smaller reads keep a burst near half a
		 * second's worth. */
		int64_t buf = r->rate_limit / 200;
		curl_easy_setopt(c, CURLOPT_BUFFERSIZE,
		                 (long)(buf < 1024    ? 1024
		                        : buf > 16384 ? 16384
		                                      : buf));
	}
	if (have > 0)
		curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)have);
	CURLcode cc = curl_easy_perform(c);
	long code = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(c);
	info->http_status = code;
	info->fetched = x.written;
	int fsync_err = fsync(fd) < 0 ? errno : 0;
	close(fd);

	if (x.rc)
		return x.rc;
	if (cc != CURLE_OK) {
		cot_seterr(eb, COT_ERR_NETWORK, "could not download %s: %s", r->url,
		           errbuf[0] ? errbuf : curl_easy_strerror(cc));
		cot_sethint(eb, "The download resumes from byte %lld on the next attempt.",
		            (long long)(x.offset + x.written));
		return COT_ERR_NETWORK;
	}
	if (code == 416) { /* our part is not a prefix of it */
		unlink(part);
		return cot_seterr(eb, COT_ERR_NETWORK, "server refused the byte range for %s; starting over",
		                  r->url);
	}
	if (code == 404)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "file %s is not on the server (404)", r->url);
	if (code == 401 || code == 403)
		return cot_seterr(eb, COT_ERR_AUTH, "server refused file %s (%ld)", r->url, code);
	if (code != 200 && code != 206)
		return cot_seterr(eb, COT_ERR_NETWORK, "server answered %ld for %s", code, r->url);
	if (fsync_err)
		return cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", part, strerror(fsync_err));
	if (x.offset + x.written < r->size)
		return cot_seterr(eb, COT_ERR_NETWORK, "download of %s ended after %lld of %lld bytes",
		                  r->url, (long long)(x.offset + x.written), (long long)r->size);
	return verify_and_install(r, part, eb);
}

cot_err cl_download_size(const char *url, const char *bearer, int timeout_s, int64_t *size, cot_errbuf *eb)
{
	CURL *c = curl_easy_init();
	if (!c)
		return cot_seterr(eb, COT_ERR_NOMEM, "could not start a request");
	struct curl_slist *h = NULL;
	char auth[512];
	if (bearer && bearer[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
		h = curl_slist_append(h, auth);
	}
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)(timeout_s > 0 ? timeout_s : 60));
	CURLcode cc = curl_easy_perform(c);
	long code = 0;
	curl_off_t len = -1;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (cc != CURLE_OK)
		return cot_seterr(eb, COT_ERR_NETWORK, "could not reach %s: %s", url, curl_easy_strerror(cc));
	if (code == 404)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "%s is not on the server", url);
	if (code != 200 || len < 0)
		return cot_seterr(eb, COT_ERR_NETWORK, "server answered HTTP %ld without a size to HEAD %s",
		                  code, url);
	*size = (int64_t)len;
	return COT_OK;
}
