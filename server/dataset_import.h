/* cotrain: turning text files into a dataset's shards and manifest.
 *
 * ds_import reads its inputs in order: a plain file is one document; a
 * folder contributes every regular file below it, sorted by relative path
 * (byte order, as `LC_ALL=C sort`); an archive (named *.tar, *.tar.gz,
 * *.tgz, *.tar.bz2, *.tbz2, *.tar.xz, *.txz, *.tar.zst or *.zip, whether
 * given directly or found in a folder) contributes its regular entries in
 * archive order.  Names with a component starting with '.' (".git",
 * ".DS_Store"), symbolic links, devices and other non-regular entries are
 * skipped; an archive inside an archive is read as a plain document.
 *
 * Every document must be valid UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF); the first one that is not fails the
 * whole import, naming the document and the byte offset.  Empty documents
 * are skipped.  The token stream is the documents' bytes (the byte-level
 * tokenizer: token = byte value; or their subword ids, ds_import_tokenized)
 * joined by DS_SEPARATOR, cut into shards of
 * shard_tokens tokens (the last may be shorter), each written to the store
 * with shard_write, then a JSON manifest listing them (doc/dataset.md).
 *
 * A held-out part (ds_import_heldout) is the last heldout_tokens tokens of
 * the stream, set aside for evaluation and never handed out as work: the
 * shard holding its first token is cut there, so the held-out tokens fill
 * shards of their own (the training part's last shard may be shorter than
 * shard_tokens), and the manifest records "heldout_tokens".
 *
 * ds_import touches no database: the caller records the result.  On error,
 * shards already written stay in the store as unreferenced garbage. */
#ifndef COT_DATASET_IMPORT_H
#define COT_DATASET_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"
#include "shared/common/filestore.h"
#include "shared/common/shard.h"

#define DS_SEPARATOR "\n\n" /* between consecutive documents */
#define DS_SHARD_TOKENS_DEFAULT (1u << 20)
#define DS_SHARD_TOKENS_MIN 64u
#define DS_SHARD_TOKENS_MAX SHARD_TOKENS_MAX
#define DS_MAX_TOKENS (1ull << 40) /* tokens in one dataset */
#define DS_MAX_FILES 2000000       /* files listed from one folder */
#define DS_MAX_DEPTH 64            /* folder nesting */
#define DS_HELDOUT_FRACTION_DEFAULT 0.02
#define DS_HELDOUT_FRACTION_MAX 0.5
/* The smallest held-out part when there is one: a few evaluation sequences
 * of a typical seq_len (eight of 512 tokens, each with its next token). */
#define DS_HELDOUT_MIN_TOKENS 4104u
/* With a subword tokenizer a document is encoded whole: its most bytes. */
#define DS_DOC_MAX (1ull << 30)

struct spm_model;

/* A subword tokenizer to encode the documents with (kernels/spm.h): each
 * document's text is encoded whole, and consecutive documents are joined by
 * separator, the ids of two newline pieces (what DS_SEPARATOR encodes to). */
typedef struct {
	const struct spm_model *model;
	const char *sha256; /* its name in the file store */
	const char *type;   /* "unigram" or "bpe", for the manifest */
	int32_t separator[2];
} ds_tokenizer;

typedef struct {
	int32_t idx;
	uint64_t first_token;
	uint64_t n_tokens;
	char sha256[FS_SHA_HEX_LEN + 1]; /* the shard file's name */
	uint64_t size;                   /* its bytes */
	char tokens_sha256[FS_SHA_HEX_LEN + 1];
} ds_shard;

typedef struct {
	uint64_t n_tokens;       /* the whole stream, held-out part included */
	uint64_t heldout_tokens; /* its last ones, held out (0: none) */
	uint64_t n_documents;
	uint64_t n_skipped; /* non-regular and hidden entries */
	size_t n_shards;
	ds_shard *shards; /* n_shards, malloc'd */
	char manifest_sha256[FS_SHA_HEX_LEN + 1];
	uint64_t manifest_size;
	int width; /* bytes a token in the shards: 1 (byte), 2 or 4 */
} ds_result;

/* Import inputs[0..n_inputs) as dataset `name` into the store at
 * store_dir, cutting shards of shard_tokens tokens (DS_SHARD_TOKENS_MIN to
 * DS_SHARD_TOKENS_MAX).  On success *out is filled; free it with
 * ds_result_free.  Errors: COT_ERR_INVALID (bad name, size, an input that is
 * not UTF-8, no tokens at all), COT_ERR_CORRUPT (an unreadable archive),
 * COT_ERR_IO, COT_ERR_TOO_LARGE (over DS_MAX_TOKENS, DS_MAX_FILES or
 * DS_MAX_DEPTH), COT_ERR_NOMEM; *out is zeroed on error. */
cot_err ds_import(const char *store_dir, const char *name, uint64_t shard_tokens, const char *const *inputs,
                  size_t n_inputs, ds_result *out, cot_errbuf *eb);

/* The tokens held out of a stream of n_tokens for heldout_fraction (0 to
 * DS_HELDOUT_FRACTION_MAX): 0 for a fraction of 0, else
 * max(ceil(fraction * n_tokens), DS_HELDOUT_MIN_TOKENS).  Pure. */
uint64_t ds_heldout_tokens(uint64_t n_tokens, double heldout_fraction);

/* As ds_import, setting aside the last ds_heldout_tokens(n_tokens,
 * heldout_fraction) tokens as the held-out part (out->heldout_tokens).
 * Besides ds_import's errors, COT_ERR_INVALID for a fraction that is not a
 * number from 0 to DS_HELDOUT_FRACTION_MAX and for a dataset whose held-out
 * part would be more than half of it (too little text for the minimum). */
cot_err ds_import_heldout(const char *store_dir, const char *name, uint64_t shard_tokens,
                          double heldout_fraction, const char *const *inputs, size_t n_inputs, ds_result *out,
                          cot_errbuf *eb);

/* As ds_import_heldout, encoding the documents with the subword tokenizer
 * tok (NULL: the byte tokenizer, exactly ds_import_heldout): shards of
 * u16 ids when its vocabulary has at most 65536 pieces, else u32, naming
 * the tokenizer; the manifest records it (doc/dataset.md).  Besides
 * ds_import_heldout's errors, COT_ERR_INVALID for a tokenizer without a
 * newline piece and COT_ERR_TOO_LARGE for a document over DS_DOC_MAX. */
cot_err ds_import_tokenized(const char *store_dir, const char *name, uint64_t shard_tokens,
                            double heldout_fraction, const ds_tokenizer *tok, const char *const *inputs,
                            size_t n_inputs, ds_result *out, cot_errbuf *eb);

void ds_result_free(ds_result *r);

#endif
