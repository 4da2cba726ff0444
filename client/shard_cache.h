/* cotrain client: the bounded cache of downloaded files (checkpoints and
 * dataset shards), <state_dir>/cache/<aa>/<sha256>, the layout of
 * shared/common/filestore.h.  A file enters only by rename after its sha256 was
 * checked (download.c), so whatever is in the cache is whole.  Using a file
 * refreshes its modification time; trimming deletes the least recently used
 * files, never a pinned one (a file of a current work unit), until the cache
 * fits its byte budget (the disk_max preference). */
#ifndef CL_SHARD_CACHE_H
#define CL_SHARD_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

/* Path of the cached file named sha into buf; creates <cache>/<aa>/.
 * COT_ERR_INVALID for a bad name, COT_ERR_IO, COT_ERR_TOO_LARGE. */
cot_err cl_cache_path(const char *cache_dir, const char *sha, char *buf, size_t len, cot_errbuf *eb);

/* 1 when the file is cached with exactly size bytes (and marks it used);
 * a cached file of another size is deleted and 0 returned. */
int cl_cache_has(const char *cache_dir, const char *sha, int64_t size);

/* Where and how files named by their sha256 are fetched from a server. */
typedef struct {
	const char *cache_dir, *downloads_dir;
	int64_t max_file_bytes;
	int timeout_s;
	volatile int *cancel;
	int64_t rate_limit; /* bytes/s, 0 = unlimited (the download_limit preference) */
} cl_fetch_env;

/* Make sure <base>/files/<sha> (size bytes; size < 0: ask the server with
 * HEAD first) is in the cache, downloading it when it is not; its path goes
 * into dest and its size into *got_size (may be NULL).  Errors as
 * cl_download. */
cot_err cl_cache_fetch(const cl_fetch_env *env, const char *base, const char *bearer, const char *sha,
                       int64_t size, char *dest, size_t destlen, int64_t *got_size, cot_errbuf *eb);

/* Bytes the cache holds now. */
int64_t cl_cache_bytes(const char *cache_dir);

/* Delete least recently used files, skipping the npinned names in pinned,
 * until the cache holds at most max_bytes.  Returns the bytes freed. */
int64_t cl_cache_trim(const char *cache_dir, int64_t max_bytes, const char *const *pinned, int npinned);

#endif
