/* cotrain: a byte dataset's text, read back from its shards.
 *
 * A dataset imported with the byte tokenizer keeps its text exactly (token
 * = byte), so its shards are the text: this reads the stream's first bytes
 * back from the file store, checking every shard (shard_read: its entries,
 * its tokens' sha256) and that the text is valid UTF-8, to train a
 * tokenizer on.  Touches no database: the caller lists the shards. */
#ifndef COT_DATASET_TEXT_H
#define COT_DATASET_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"
#include "shared/common/filestore.h"

/* The most text a tokenizer is trained on: the first bytes of the training
 * part (SentencePiece holds all of it in memory, several times over). */
#define DT_TEXT_MAX (512ull << 20)

typedef struct {
	uint64_t first_token;
	uint64_t n_tokens;
	char sha256[FS_SHA_HEX_LEN + 1];
} dt_shard;

/* Read stream bytes [0, limit) of the byte dataset `name` from its shards
 * s[0..n) (sorted by first_token, contiguous from 0) in the store.  A last
 * character cut by the limit is dropped.  On success *text is a malloc'd,
 * NUL-terminated buffer of *len bytes (the caller frees it).  Errors:
 * COT_ERR_INVALID (the text is not valid UTF-8, naming the shard and the
 * stream offset; no text), COT_ERR_CORRUPT (a damaged shard, shards that
 * leave a gap), COT_ERR_IO, COT_ERR_TOO_LARGE (limit over DT_TEXT_MAX),
 * COT_ERR_NOMEM. */
cot_err dt_read_text(const char *store_dir, const char *name, const dt_shard *s, size_t n, uint64_t limit,
                     char **text, size_t *len, cot_errbuf *eb);

/* The length of the longest valid UTF-8 (RFC 3629) prefix of p[0..n); when
 * it is n the whole buffer is valid.  *cut is set when the bytes after that
 * prefix are the start of a valid sequence cut off by the end of p. */
size_t dt_utf8_prefix(const unsigned char *p, size_t n, int *cut);

#endif
