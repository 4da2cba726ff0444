/* cotrain client: the file cache (see shard_cache.h). */
#include "client/shard_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/download.h"
#include "shared/common/filestore.h"

cot_err cl_cache_path(const char *cache_dir, const char *sha, char *buf, size_t len, cot_errbuf *eb)
{
	cot_err rc = fs_path(cache_dir, sha, buf, len, eb);
	if (rc)
		return rc;
	char sub[PATH_MAX];
	snprintf(sub, sizeof sub, "%s/%.2s", cache_dir, sha);
	if ((mkdir(cache_dir, 0700) < 0 && errno != EEXIST) || (mkdir(sub, 0700) < 0 && errno != EEXIST))
		return cot_seterr(eb, COT_ERR_IO, "could not create cache directory \"%s\": %s", sub,
		                  strerror(errno));
	return COT_OK;
}

int cl_cache_has(const char *cache_dir, const char *sha, int64_t size)
{
	char path[PATH_MAX];
	if (fs_path(cache_dir, sha, path, sizeof path, NULL))
		return 0;
	struct stat st;
	if (stat(path, &st) < 0)
		return 0;
	if (!S_ISREG(st.st_mode) || st.st_size != size) {
		unlink(path);
		return 0;
	}
	utimensat(AT_FDCWD, path, NULL, 0);
	return 1;
}

typedef struct {
	char sha[65];
	int64_t size;
	time_t mtime;
} entry;

static int by_age(const void *a, const void *b)
{
	const entry *x = a, *y = b;
	return (x->mtime > y->mtime) - (x->mtime < y->mtime);
}

/* Every cached file; *n entries in a malloc'd array (NULL when empty). */
static entry *list(const char *cache_dir, size_t *n, int64_t *total)
{
	entry *v = NULL;
	size_t cap = 0;
	*n = 0;
	*total = 0;
	DIR *d = opendir(cache_dir);
	if (!d)
		return NULL;
	for (struct dirent *e; (e = readdir(d));) {
		if (strlen(e->d_name) != 2)
			continue;
		char sub[PATH_MAX];
		if (snprintf(sub, sizeof sub, "%s/%s", cache_dir, e->d_name) >= (int)sizeof sub)
			continue;
		DIR *s = opendir(sub);
		if (!s)
			continue;
		for (struct dirent *f; (f = readdir(s));) {
			if (!fs_sha_valid(f->d_name))
				continue;
			char path[PATH_MAX];
			struct stat st;
			if (snprintf(path, sizeof path, "%s/%s", sub, f->d_name) >= (int)sizeof path)
				continue;
			if (stat(path, &st) < 0)
				continue;
			if (*n == cap) {
				size_t nc = cap ? cap * 2 : 64;
				entry *nv = realloc(v, nc * sizeof *nv);
				if (!nv)
					break;
				v = nv;
				cap = nc;
			}
			memcpy(v[*n].sha, f->d_name, sizeof v[*n].sha); /* fs_sha_valid: 64 + NUL */
			v[*n].size = st.st_size;
			v[*n].mtime = st.st_mtime;
			*total += st.st_size;
			(*n)++;
		}
		closedir(s);
	}
	closedir(d);
	return v;
}

int64_t cl_cache_bytes(const char *cache_dir)
{
	size_t n;
	int64_t total;
	free(list(cache_dir, &n, &total));
	return total;
}

int64_t cl_cache_trim(const char *cache_dir, int64_t max_bytes, const char *const *pinned, int npinned)
{
	size_t n;
	int64_t total, freed = 0;
	entry *v = list(cache_dir, &n, &total);
	if (!v)
		return 0;
	qsort(v, n, sizeof *v, by_age);
	for (size_t i = 0; i < n && total > max_bytes; i++) {
		int pin = 0;
		for (int k = 0; k < npinned; k++)
			if (pinned[k] && strcmp(pinned[k], v[i].sha) == 0)
				pin = 1;
		if (pin)
			continue;
		char path[PATH_MAX];
		if (fs_path(cache_dir, v[i].sha, path, sizeof path, NULL) == COT_OK && unlink(path) == 0) {
			total -= v[i].size;
			freed += v[i].size;
		}
	}
	free(v);
	return freed;
}

cot_err cl_cache_fetch(const cl_fetch_env *env, const char *base, const char *bearer, const char *sha,
                       int64_t size, char *dest, size_t destlen, int64_t *got_size, cot_errbuf *eb)
{
	char url[2048];
	snprintf(url, sizeof url, "%s/files/%s", base, sha);
	cot_err rc;
	if (size < 0 && (rc = cl_download_size(url, bearer, env->timeout_s, &size, eb)))
		return rc;
	if (got_size)
		*got_size = size;
	if ((rc = cl_cache_path(env->cache_dir, sha, dest, destlen, eb)) ||
	    cl_cache_has(env->cache_dir, sha, size))
		return rc;
	cl_download_req r = { .url = url,
		              .sha256 = sha,
		              .size = size,
		              .max_bytes = env->max_file_bytes,
		              .bearer = bearer,
		              .timeout_s = env->timeout_s,
		              .downloads_dir = env->downloads_dir,
		              .dest_path = dest,
		              .rate_limit = env->rate_limit,
		              .cancel = env->cancel };
	cl_download_info info;
	return cl_download(&r, &info, eb);
}
