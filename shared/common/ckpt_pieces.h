/* cotrain: a file cut into pieces, each with its own sha256 (the manifest),
 * so that a file fetched piece by piece from peers is checked piece by piece
 * (doc/design.md, "Checkpoints from peers").
 *
 * The server, which holds every checkpoint, builds the manifest from its
 * file store and hands it to a joiner beside the peers to ask
 * (GET /v1/projects/{name}/checkpoints/{sha256}): the joiner trusts it as it
 * trusts the file's sha256 in the project's answer, and refuses any piece a
 * peer sends that does not hash to its entry, before writing it anywhere.
 * The whole file's sha256 is checked again at the end.
 *
 * The piece size is a function of the file size alone (ckpt_piece_size), so
 * a manifest cannot name another: about 64 pieces, a power of two between
 * 64 KiB and 4 MiB.  A 231 MB checkpoint (19M parameters with both moments)
 * has 56 pieces of 4 MiB and a manifest of about 4 KB of JSON. */
#ifndef COT_CKPT_PIECES_H
#define COT_CKPT_PIECES_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "shared/common/error.h"
#include "shared/common/hash.h"

#define CKPT_PIECE_MIN (64u << 10)
#define CKPT_PIECE_MAX (4u << 20)
#define CKPT_PIECES_TARGET 64
/* Files larger than this have no manifest (the file store's own limit is
 * far below; this bounds a manifest to 256 Ki pieces). */
#define CKPT_FILE_MAX (1ull << 40)

typedef struct {
	char sha256[HASH_SHA256_HEX_LEN + 1]; /* the whole file */
	uint64_t size;
	uint32_t piece_size;
	uint32_t n;                             /* pieces: ceil(size / piece_size) */
	unsigned char (*hash)[HASH_SHA256_LEN]; /* n entries, malloc'd */
} ckpt_manifest;

/* The piece size of a file of size bytes (1..CKPT_FILE_MAX). */
uint32_t ckpt_piece_size(uint64_t size);

/* The bytes of piece i of m (the last one may be short). */
uint32_t ckpt_piece_len(const ckpt_manifest *m, uint32_t i);

/* Build the manifest of the file at path, which must hash to sha256:
 * COT_ERR_CORRUPT when it does not, COT_ERR_NOT_FOUND, COT_ERR_IO,
 * COT_ERR_TOO_LARGE above CKPT_FILE_MAX, COT_ERR_INVALID for an empty file.
 * On success *m is the caller's (ckpt_manifest_free). */
cot_err ckpt_manifest_build(const char *path, const char *sha256, ckpt_manifest *m, cot_errbuf *eb);

/* {"sha256", "size", "piece_size", "pieces": ["<hex>", ...]}: a new
 * reference, NULL when memory runs out. */
json_t *ckpt_manifest_to_json(const ckpt_manifest *m);

/* Read a manifest sent by the server, as hostile input: it must name sha256
 * and size (what the project's answer said), the piece size of
 * ckpt_piece_size and exactly the pieces that size needs, each a sha256 in
 * hex.  COT_ERR_INVALID with the detail otherwise; on success *m is the
 * caller's. */
cot_err ckpt_manifest_from_json(const json_t *j, const char *sha256, uint64_t size, ckpt_manifest *m,
                                cot_errbuf *eb);

/* Whether data (len bytes) is piece i of m: the right length and hash. */
bool ckpt_piece_ok(const ckpt_manifest *m, uint32_t i, const void *data, size_t len);

void ckpt_manifest_free(ckpt_manifest *m);

#endif
