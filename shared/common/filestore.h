/* cotrain: the content-addressed file store.
 *
 * Files (dataset shards and manifests, checkpoints) live under a store
 * folder, normally <data dir>/files, named by the sha256 of their bytes:
 *
 *   <store>/<first two hex digits>/<64 lowercase hex digits>
 *
 * A file is written to a temporary file in <store>/tmp/, hashed (OpenSSL EVP
 * sha256) while it is written, fsynced, then renamed into place, and the
 * folder fsynced; a reader therefore sees either no file or the whole file.
 * Putting bytes that are already stored returns the same name and only
 * refreshes the stored file's time (the garbage collector, server/file_gc.h,
 * spares files stored within its grace period).  Stored files are never modified; the database table `file` indexes
 * the ones in use, and a file that no row references is garbage that may be
 * deleted.
 *
 * Every function takes the store folder and creates it (and its
 * sub-folders, mode 0755) when missing.  Stored files are mode 0644. */
#ifndef COT_FILESTORE_H
#define COT_FILESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define FS_SHA_HEX_LEN 64 /* characters in a hex sha256, without the NUL */

/* True when s is exactly 64 lowercase hex digits. */
int fs_sha_valid(const char *s);

/* Write the path of the file named sha into buf (len bytes, NUL included).
 * COT_ERR_INVALID when sha is not a valid name, COT_ERR_TOO_LARGE when buf
 * is too small.  Pure: touches no file. */
cot_err fs_path(const char *store_dir, const char *sha, char *buf, size_t len, cot_errbuf *eb);

/* A file being written.  Open, write any number of times, then either
 * commit or abort; both free the writer. */
typedef struct fs_writer fs_writer;

/* Start a new file in the store.  On success *out owns a temporary file.
 * Errors: COT_ERR_IO (cannot create the folders or the file), COT_ERR_NOMEM. */
cot_err fs_writer_open(const char *store_dir, fs_writer **out, cot_errbuf *eb);

/* Append len bytes.  COT_ERR_IO on a failed write (the writer stays open;
 * abort it). */
cot_err fs_writer_write(fs_writer *w, const void *buf, size_t len, cot_errbuf *eb);

/* Finish the file: fsync, rename to its name, fsync the folder.  Writes the
 * hex sha256 (65 bytes with the NUL) into sha_hex and the byte count into
 * *size (either may be NULL).  Frees w whatever happens; on error the
 * temporary file is removed and nothing is stored.  COT_ERR_IO. */
cot_err fs_writer_commit(fs_writer *w, char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb);

/* Throw the file away and free w.  NULL is allowed. */
void fs_writer_abort(fs_writer *w);

/* Store len bytes from buf; as fs_writer_commit for the results. */
cot_err fs_put_buffer(const char *store_dir, const void *buf, size_t len, char sha_hex[FS_SHA_HEX_LEN + 1],
                      uint64_t *size, cot_errbuf *eb);

/* Store a copy of the regular file at path (streamed, any size); as
 * fs_writer_commit for the results.  COT_ERR_IO when path cannot be opened
 * or read, or is not a regular file. */
cot_err fs_put_file(const char *store_dir, const char *path, char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size,
                    cot_errbuf *eb);

/* Check that the stored file named sha exists and that its bytes hash to
 * sha; its size goes to *size (may be NULL).  COT_ERR_INVALID for a bad
 * name, COT_ERR_NOT_FOUND when absent, COT_ERR_CORRUPT on a hash mismatch,
 * COT_ERR_IO when it cannot be read. */
cot_err fs_verify(const char *store_dir, const char *sha, uint64_t *size, cot_errbuf *eb);

/* Read the whole stored file named sha (at most max bytes) into a malloc'd
 * *buf of *len bytes (the caller frees it), checking that its bytes hash to
 * sha.  Errors as fs_verify, and COT_ERR_TOO_LARGE over max, COT_ERR_NOMEM;
 * *buf is NULL on error. */
cot_err fs_read_verified(const char *store_dir, const char *sha, size_t max, unsigned char **buf, size_t *len,
                         cot_errbuf *eb);

#endif
