/* cotrain: the content-addressed file store (see filestore.h). */
#include "shared/common/filestore.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "shared/common/hash.h"

#define FS_CHUNK (1u << 16) /* bytes read at a time */

struct fs_writer {
	char store[PATH_MAX];
	char tmp_path[PATH_MAX];
	int fd;
	uint64_t size;
	EVP_MD_CTX *md;
};

int fs_sha_valid(const char *s) { return s && hash_is_sha256_hex(s); }

cot_err fs_path(const char *store_dir, const char *sha, char *buf, size_t len, cot_errbuf *eb)
{
	if (!fs_sha_valid(sha))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "invalid file name \"%.80s\": expected 64 lowercase hex digits",
		                  sha ? sha : "(null)");
	int n = snprintf(buf, len, "%s/%.2s/%s", store_dir, sha, sha);
	if (n < 0 || (size_t)n >= len)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "path of stored file %s is too long", sha);
	return COT_OK;
}

/* mkdir that accepts an existing folder. */
static cot_err ensure_dir(const char *path, cot_errbuf *eb)
{
	if (mkdir(path, 0755) == 0 || errno == EEXIST)
		return COT_OK;
	return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", path, strerror(errno));
}

/* Create the store folder and its parent (the data dir) when missing. */
static cot_err ensure_store(const char *store_dir, cot_errbuf *eb)
{
	char parent[PATH_MAX];
	if (strlen(store_dir) >= sizeof parent - 8)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "store directory path is too long");
	strcpy(parent, store_dir);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent) {
		*slash = '\0';
		struct stat st;
		if (stat(parent, &st) != 0) {
			cot_err rc = ensure_dir(parent, eb);
			if (rc)
				return rc;
		}
	}
	return ensure_dir(store_dir, eb);
}

static void fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
}

cot_err fs_writer_open(const char *store_dir, fs_writer **out, cot_errbuf *eb)
{
	*out = NULL;
	if (strlen(store_dir) > PATH_MAX - 100)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "store directory path is too long");
	cot_err rc = ensure_store(store_dir, eb);
	if (rc)
		return rc;
	fs_writer *w = calloc(1, sizeof *w);
	if (!w)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	w->fd = -1;
	snprintf(w->store, sizeof w->store, "%s", store_dir);
	snprintf(w->tmp_path, sizeof w->tmp_path, "%s/tmp", store_dir);
	rc = ensure_dir(w->tmp_path, eb);
	if (rc) {
		free(w);
		return rc;
	}
	snprintf(w->tmp_path, sizeof w->tmp_path, "%s/tmp/put-XXXXXX", store_dir);
	w->fd = mkostemp(w->tmp_path, O_CLOEXEC);
	if (w->fd < 0) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not create temporary file in \"%s/tmp\": %s",
		                store_dir, strerror(errno));
		free(w);
		return rc;
	}
	w->md = EVP_MD_CTX_new();
	if (!w->md || EVP_DigestInit_ex(w->md, EVP_sha256(), NULL) != 1) {
		fs_writer_abort(w);
		return cot_seterr(eb, COT_ERR_NOMEM, "could not start a sha256 digest");
	}
	*out = w;
	return COT_OK;
}

cot_err fs_writer_write(fs_writer *w, const void *buf, size_t len, cot_errbuf *eb)
{
	const unsigned char *p = buf;
	if (len && EVP_DigestUpdate(w->md, buf, len) != 1)
		return cot_seterr(eb, COT_ERR_INTERNAL, "sha256 digest update failed");
	while (len) {
		ssize_t n = write(w->fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return cot_seterr(eb, COT_ERR_IO, "could not write to file \"%s\": %s", w->tmp_path,
			                  strerror(errno));
		}
		p += n;
		len -= (size_t)n;
		w->size += (uint64_t)n;
	}
	return COT_OK;
}

void fs_writer_abort(fs_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		unlink(w->tmp_path);
	}
	EVP_MD_CTX_free(w->md);
	free(w);
}

cot_err fs_writer_commit(fs_writer *w, char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb)
{
	unsigned char digest[EVP_MAX_MD_SIZE];
	unsigned int dlen = 0;
	char hex[FS_SHA_HEX_LEN + 1], dir[PATH_MAX], dest[PATH_MAX];
	cot_err rc = COT_OK;

	if (EVP_DigestFinal_ex(w->md, digest, &dlen) != 1 || dlen != 32) {
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "sha256 digest failed");
		goto fail;
	}
	hash_hex(digest, 32, hex);
	if (fchmod(w->fd, 0644) != 0 || fsync(w->fd) != 0) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not sync file \"%s\": %s", w->tmp_path,
		                strerror(errno));
		goto fail;
	}
	if (close(w->fd) != 0) {
		w->fd = -1;
		unlink(w->tmp_path);
		rc = cot_seterr(eb, COT_ERR_IO, "could not close file \"%s\": %s", w->tmp_path,
		                strerror(errno));
		goto fail;
	}
	w->fd = -1;
	int n1 = snprintf(dir, sizeof dir, "%s/%.2s", w->store, hex);
	int n2 = snprintf(dest, sizeof dest, "%s/%s", dir, hex);
	if (n1 < 0 || n2 < 0 || (size_t)n2 >= sizeof dest) {
		unlink(w->tmp_path);
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "store directory path is too long");
		goto fail;
	}
	rc = ensure_dir(dir, eb);
	if (rc) {
		unlink(w->tmp_path);
		goto fail;
	}
	/* Already stored: the store is content-addressed, and files only ever
	 * appear there whole (by rename), so the bytes are the same.  Its time
	 * is refreshed: the collector never takes a file stored within its
	 * grace period, and this one is about to be named again. */
	struct stat st;
	if (stat(dest, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == w->size &&
	    utimensat(AT_FDCWD, dest, NULL, 0) == 0) {
		unlink(w->tmp_path);
	} else if (rename(w->tmp_path, dest) != 0) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not rename \"%s\" to \"%s\": %s", w->tmp_path, dest,
		                strerror(errno));
		unlink(w->tmp_path);
		goto fail;
	} else {
		fsync_dir(dir);
	}
	if (sha_hex)
		memcpy(sha_hex, hex, sizeof hex);
	if (size)
		*size = w->size;
fail:
	fs_writer_abort(w);
	return rc;
}

cot_err fs_put_buffer(const char *store_dir, const void *buf, size_t len, char sha_hex[FS_SHA_HEX_LEN + 1],
                      uint64_t *size, cot_errbuf *eb)
{
	fs_writer *w;
	cot_err rc = fs_writer_open(store_dir, &w, eb);
	if (rc)
		return rc;
	rc = fs_writer_write(w, buf, len, eb);
	if (rc) {
		fs_writer_abort(w);
		return rc;
	}
	return fs_writer_commit(w, sha_hex, size, eb);
}

cot_err fs_put_file(const char *store_dir, const char *path, char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size,
                    cot_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open file \"%s\": %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "cannot store \"%s\": not a regular file", path);
	}
	fs_writer *w;
	cot_err rc = fs_writer_open(store_dir, &w, eb);
	if (rc) {
		close(fd);
		return rc;
	}
	unsigned char *chunk = malloc(FS_CHUNK);
	if (!chunk)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	while (chunk) {
		ssize_t n = read(fd, chunk, FS_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\": %s", path,
			                strerror(errno));
			break;
		}
		if (n == 0)
			break;
		rc = fs_writer_write(w, chunk, (size_t)n, eb);
		if (rc)
			break;
	}
	free(chunk);
	close(fd);
	if (rc) {
		fs_writer_abort(w);
		return rc;
	}
	return fs_writer_commit(w, sha_hex, size, eb);
}

/* Open the stored file named sha for reading into *fd, its path in path.
 * COT_ERR_INVALID (bad name), COT_ERR_NOT_FOUND, COT_ERR_IO. */
static cot_err open_stored(const char *store_dir, const char *sha, char path[PATH_MAX], int *fd,
                           cot_errbuf *eb)
{
	cot_err rc = fs_path(store_dir, sha, path, PATH_MAX, eb);
	if (rc)
		return rc;
	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0) {
		if (errno == ENOENT)
			return cot_seterr(eb, COT_ERR_NOT_FOUND, "stored file %s does not exist", sha);
		return cot_seterr(eb, COT_ERR_IO, "could not open file \"%s\": %s", path, strerror(errno));
	}
	return COT_OK;
}

cot_err fs_verify(const char *store_dir, const char *sha, uint64_t *size, cot_errbuf *eb)
{
	char path[PATH_MAX];
	int fd;
	cot_err rc = open_stored(store_dir, sha, path, &fd, eb);
	if (rc)
		return rc;
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(md);
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "could not start a sha256 digest");
	}
	unsigned char *chunk = malloc(FS_CHUNK);
	uint64_t total = 0;
	if (!chunk)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	while (chunk) {
		ssize_t n = read(fd, chunk, FS_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\": %s", path,
			                strerror(errno));
			break;
		}
		if (n == 0)
			break;
		EVP_DigestUpdate(md, chunk, (size_t)n);
		total += (uint64_t)n;
	}
	free(chunk);
	close(fd);
	unsigned char digest[EVP_MAX_MD_SIZE];
	unsigned int dlen = 0;
	if (!rc && (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != 32))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "sha256 digest failed");
	EVP_MD_CTX_free(md);
	if (rc)
		return rc;
	char hex[FS_SHA_HEX_LEN + 1];
	hash_hex(digest, 32, hex);
	if (strcmp(hex, sha) != 0)
		return cot_seterr(eb, COT_ERR_CORRUPT, "stored file \"%s\" is corrupt: its sha256 is %s",
		                  path, hex);
	if (size)
		*size = total;
	return COT_OK;
}

cot_err fs_read_verified(const char *store_dir, const char *sha, size_t max, unsigned char **buf, size_t *len,
                         cot_errbuf *eb)
{
	*buf = NULL;
	*len = 0;
	char path[PATH_MAX];
	int fd;
	cot_err rc = open_stored(store_dir, sha, path, &fd, eb);
	if (rc)
		return rc;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not stat file \"%s\"", path);
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "stored file %s is %lld bytes, more than the %zu allowed", sha,
		                  (long long)st.st_size, max);
	}
	unsigned char *b = malloc((size_t)st.st_size + 1);
	if (!b) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	char hex[FS_SHA_HEX_LEN + 1];
	if (got != (size_t)st.st_size)
		rc = cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\"", path);
	else if (hash_sha256_hex(b, got, hex))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "sha256 digest failed");
	else if (strcmp(hex, sha) != 0)
		rc = cot_seterr(eb, COT_ERR_CORRUPT, "stored file %s is corrupt: its bytes hash to %s", sha,
		                hex);
	if (rc) {
		free(b);
		return rc;
	}
	*buf = b;
	*len = got;
	return COT_OK;
}
