/* cotrain kernels: subword tokenizers (SentencePiece), behind a C API.
 *
 * A small shim over libsentencepiece's C++ API (kernels/spm_shim.cc is the
 * only C++ file): train a Unigram or BPE model on text, load one from its
 * serialized bytes (the ".model" file, a protobuf), encode text to ids,
 * decode ids to text, and look pieces up.  The model bytes are what the file
 * store keeps and what clients verify by sha256; nothing here touches files.
 *
 * Training is reproducible: the same text and the same options give the same
 * model bytes (fixed random seed, a fixed thread count, every sentence used
 * in input order, no sampling).  Errors follow PostgreSQL's message style;
 * SentencePiece's own reason is kept in the detail. */
#ifndef KERN_SPM_H
#define KERN_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* error.h is C: its functions too */
#endif

#include "shared/common/error.h"

#define SPM_VOCAB_MIN 8
#define SPM_VOCAB_MAX (1 << 20)   /* pieces; ids fit 32 bits, shards widen past 65536 */
#define SPM_SPECIAL_MAX 32        /* user special tokens */
#define SPM_SPECIAL_LEN_MAX 32    /* bytes of one */
#define SPM_TRAIN_SEED 20240601u  /* SentencePiece's random seed while training */
#define SPM_TRAIN_THREADS 2       /* fixed, so that the result never depends on the host */
#define SPM_SENTENCE_MAX 16384    /* bytes of a training line; longer lines are cut */
#define SPM_MODEL_MAX (64u << 20) /* bytes of a model file cotrain loads */

typedef enum { SPM_UNIGRAM, SPM_BPE } spm_type;

/* Normalisation flags (--normalize nfkc,lowercase,keep-accents).  Accents
 * are always kept: SentencePiece has no accent stripping, and KEEP_ACCENTS
 * only says so explicitly.  LOWERCASE needs NFKC (SentencePiece's nfkc_cf);
 * with neither, text is used as it is (identity). */
#define SPM_NORM_NFKC 1u
#define SPM_NORM_LOWERCASE 2u
#define SPM_NORM_KEEP_ACCENTS 4u

typedef struct {
	spm_type type;
	int vocab;          /* pieces in all, specials included */
	unsigned normalize; /* SPM_NORM_* */
	/* Special tokens ("[CLS]", ...); n_special <= SPM_SPECIAL_MAX.  "[UNK]"
	 * becomes the unknown piece (id 0; "<unk>" when not given) and "[PAD]"
	 * the padding piece (id 1); the others are user-defined pieces, matched
	 * in text as a whole (so "[MASK]" typed in text encodes to the mask id),
	 * with the ids after newline, tab and carriage return, in the order
	 * given.  Look them up by name with spm_piece_id. */
	const char *const *special;
	int n_special;
} spm_train_opts;

typedef struct spm_model spm_model;

/* Parse a comma-separated list of special tokens ("[CLS],[SEP],[MASK]")
 * into out[0..*n) (pointers into buf, a copy of s the caller provides with
 * strlen(s) + 1 bytes).  Each token: 1 to SPM_SPECIAL_LEN_MAX bytes, printable
 * ASCII without spaces; no duplicates; at most SPM_SPECIAL_MAX.
 * COT_ERR_INVALID otherwise. */
cot_err spm_parse_special(const char *s, char *buf, const char *out[SPM_SPECIAL_MAX], int *n, cot_errbuf *eb);

/* Parse "nfkc,lowercase,keep-accents" (any subset, any order; "" or "none"
 * for none) into SPM_NORM_* flags.  COT_ERR_INVALID for an unknown word or
 * lowercase without nfkc. */
cot_err spm_parse_normalize(const char *s, unsigned *flags, cot_errbuf *eb);

/* Train a model on text[0..len), read as lines (each line one sentence;
 * empty lines skipped, lines longer than SPM_SENTENCE_MAX cut there at a
 * character boundary).  The text must be valid UTF-8 (the caller checks).
 * On success *model is a malloc'd buffer of *model_len bytes (the caller
 * frees it).  COT_ERR_INVALID for bad options and for what SentencePiece
 * refuses (a vocabulary larger than the text allows, no text), with its
 * reason in the detail; COT_ERR_NOMEM. */
cot_err spm_train(const char *text, size_t len, const spm_train_opts *o, unsigned char **model,
                  size_t *model_len, cot_errbuf *eb);

/* Load a model from its serialized bytes (copied).  COT_ERR_CORRUPT when the
 * bytes are not a SentencePiece model; COT_ERR_NOMEM.  Free with spm_free. */
cot_err spm_load(const void *bytes, size_t len, spm_model **out, cot_errbuf *eb);
void spm_free(spm_model *m);

/* The number of pieces (ids are 0..size-1). */
int spm_vocab_size(const spm_model *m);

/* The id of a piece ("[MASK]", "▁the"), or -1 when the model has no such
 * piece.  The encoder's [CLS] A [SEP] B [SEP] samples get their ids here. */
int spm_piece_id(const spm_model *m, const char *piece);

/* The piece of an id (NUL-terminated, owned by m), or NULL for an id out
 * of range.  Scores and piece types: kernels/spm_proto.h. */
const char *spm_piece(const spm_model *m, int id);

/* The model's serialized bytes (owned by m), for writers that read its
 * pieces' scores and types, normaliser and trainer settings
 * (kernels/spm_proto.h). */
const unsigned char *spm_bytes(const spm_model *m, size_t *len);

/* Encode text[0..len) (UTF-8) into a malloc'd array *ids of *n ids (the
 * caller frees it; NULL when *n is 0).  COT_ERR_INVALID when SentencePiece
 * refuses the text, COT_ERR_NOMEM. */
cot_err spm_encode(const spm_model *m, const char *text, size_t len, int32_t **ids, size_t *n,
                   cot_errbuf *eb);

/* Decode ids[0..n) into a malloc'd NUL-terminated *text of *len bytes (the
 * caller frees it).  COT_ERR_INVALID names the first id out of range;
 * COT_ERR_NOMEM. */
cot_err spm_decode(const spm_model *m, const int32_t *ids, size_t n, char **text, size_t *len,
                   cot_errbuf *eb);

#ifdef __cplusplus
}
#endif

#endif
