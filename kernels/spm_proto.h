/* cotrain kernels: reading a SentencePiece model's settings from its bytes.
 *
 * libsentencepiece's public headers do not expose its ModelProto, so the
 * few fields a Hugging Face tokenizer.json needs are read here straight from
 * the protobuf wire format (sentencepiece_model.proto):
 *
 *   ModelProto      1 pieces (repeated), 2 trainer_spec, 3 normalizer_spec
 *   SentencePiece   1 piece (string), 2 score (float), 3 type (enum)
 *   TrainerSpec     3 model_type (1 unigram, 2 bpe, 3 word, 4 char),
 *                   35 byte_fallback, 40 unk_id
 *   NormalizerSpec  1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
 *                   4 remove_extra_whitespaces, 5 escape_whitespaces
 *
 * Unknown fields are skipped; every length is checked against the buffer. */
#ifndef KERN_SPM_PROTO_H
#define KERN_SPM_PROTO_H

#include <stdbool.h>
#include <stddef.h>

#include "shared/common/error.h"

/* SentencePiece's piece types (ModelProto.SentencePiece.Type). */
enum {
	SPM_T_NORMAL = 1,
	SPM_T_UNKNOWN = 2,
	SPM_T_CONTROL = 3,
	SPM_T_USER = 4,
	SPM_T_UNUSED = 5,
	SPM_T_BYTE = 6
};
enum { SPM_M_UNIGRAM = 1, SPM_M_BPE = 2, SPM_M_WORD = 3, SPM_M_CHAR = 4 };

typedef struct {
	const char *piece; /* not NUL-terminated: points into the model bytes */
	size_t len;
	float score;
	int type; /* SPM_T_* */
} spm_proto_piece;

typedef struct {
	int n_pieces;
	spm_proto_piece *pieces; /* malloc'd; the strings point into the bytes */
	int model_type;          /* SPM_M_* */
	int unk_id;
	bool byte_fallback;
	const char *norm_name; /* into the bytes, norm_name_len long */
	size_t norm_name_len;
	const unsigned char *charsmap; /* into the bytes */
	size_t charsmap_len;
	bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
} spm_proto;

/* Parse the model bytes b[0..len), which must outlive *out.  Free with
 * spm_proto_free.  COT_ERR_CORRUPT for a malformed message or a model
 * without pieces, trainer spec or normalizer spec (a file cut short),
 * COT_ERR_NOMEM; *out is zeroed on error. */
cot_err spm_proto_parse(const unsigned char *b, size_t len, spm_proto *out, cot_errbuf *eb);
void spm_proto_free(spm_proto *p);

#endif
