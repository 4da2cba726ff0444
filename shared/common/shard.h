/* cotrain: dataset shards, written by cotrain-admin and read by clients.
 *
 * A shard holds tokens [first_token, first_token + n_tokens) of one
 * dataset's token stream.  It is a gzip-compressed ustar archive with
 * exactly two regular entries, in this order:
 *
 *   shard.json  {"format": "cotrain-shard", "version": 1,
 *                "dataset": "tiny", "idx": 0, "first_token": 0,
 *                "n_tokens": 1048576, "dtype": "u8", "tokenizer": "byte",
 *                "tokens_sha256": "<hex sha256 of tokens.u8>"}
 *   tokens.u8   the raw tokens, one byte each (byte-level tokenizer:
 *               token = byte value 0..255)
 *
 * A dataset encoded with a subword tokenizer (kernels/spm.h) stores token
 * ids instead: shard.json says "dtype": "u16" (vocabulary up to 65536) or
 * "u32", "tokenizer": "sentencepiece" and "tokenizer_sha256": the model's
 * name in the file store, and the second entry is tokens.u16 or tokens.u32,
 * each id little-endian.
 *
 * Writing is deterministic (mtime 0, uid/gid 0, no owner names, mode 0644,
 * gzip without a timestamp), so the same tokens give the same shard bytes
 * and hence the same name in the content-addressed store.  doc/dataset.md
 * describes the format for other tools. */
#ifndef COT_SHARD_H
#define COT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"
#include "shared/common/filestore.h"

#define SHARD_JSON_MAX (64u << 10)  /* bytes of shard.json we accept */
#define SHARD_TOKENS_MAX (1u << 28) /* tokens in one shard */
#define SHARD_NAME_MAX 64           /* bytes in a dataset name */

typedef struct {
	char dataset[SHARD_NAME_MAX + 1];
	int32_t idx;
	uint64_t first_token;
	uint64_t n_tokens;
	char tokens_sha256[FS_SHA_HEX_LEN + 1];
	/* Bytes a token: 1 (u8, the byte tokenizer; 0 means 1 when writing), 2
	 * (u16) or 4 (u32, little-endian), with the subword tokenizer's model. */
	int width;
	char tokenizer_sha256[FS_SHA_HEX_LEN + 1]; /* "" for the byte tokenizer */
} shard_meta;

/* True when name is a valid dataset name: 1 to 64 characters of
 * [A-Za-z0-9._-], starting with a letter or digit. */
int shard_name_valid(const char *name);

/* Write one shard of n tokens into the store: tokens holds n * width bytes.
 * meta supplies dataset, idx, first_token, width and, for a width above 1,
 * tokenizer_sha256 (n_tokens and tokens_sha256 are computed and written
 * back).  The shard's name (hex sha256 of the archive) goes to sha_hex and
 * its size in bytes to *size (may be NULL).  Errors: COT_ERR_INVALID (n is 0
 * or over SHARD_TOKENS_MAX, bad dataset name), COT_ERR_IO, COT_ERR_NOMEM;
 * nothing is stored on error. */
cot_err shard_write(const char *store_dir, shard_meta *meta, const unsigned char *tokens, size_t n,
                    char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb);

/* Read and check the shard at path: both entries present and alone,
 * shard.json well-formed, n_tokens <= max_tokens (and SHARD_TOKENS_MAX),
 * the tokens entry exactly n_tokens * width bytes hashing to tokens_sha256.
 * On success *meta is filled (width 1, 2 or 4) and *tokens is a malloc'd
 * array of meta->n_tokens * meta->width bytes that the caller frees.  Errors: COT_ERR_IO (cannot open), COT_ERR_CORRUPT
 * (any check above), COT_ERR_TOO_LARGE, COT_ERR_NOMEM; *tokens is NULL on
 * error.  Does not check the archive's own sha256: fs_verify does that. */
cot_err shard_read(const char *path, uint64_t max_tokens, shard_meta *meta, unsigned char **tokens,
                   cot_errbuf *eb);

#endif
