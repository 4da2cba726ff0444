/* cotrain kernels: a subword tokenizer in Hugging Face's layout.
 *
 * From a SentencePiece model (kernels/spm.h), the tokenizer.json that the
 * `tokenizers` library reads (what transformers' convert_slow_tokenizer
 * makes of an ALBERT spiece.model):
 *
 *   model           Unigram: "vocab" [[piece, score], ...] in id order and
 *                   "unk_id"; BPE: "vocab" {piece: id} and "merges", every
 *                   pair of pieces whose concatenation is a piece, ranked by
 *                   that piece's id (SentencePiece's BPE merges in the order
 *                   it learnt them)
 *   normalizer      "Precompiled" with the model's own NFKC (and case
 *                   folding) table, or none for the identity rule
 *   pre_tokenizer   Metaspace ("▁", a space prepended to the text)
 *   decoder         Metaspace
 *   post_processor  TemplateProcessing "[CLS] $A [SEP]" and
 *                   "[CLS] $A [SEP] $B:1 [SEP]:1" when the model has both
 *                   pieces, else none
 *   added_tokens    the model's unknown, control and user-defined pieces
 *                   ("[MASK]", "\n", ...), matched before normalisation;
 *                   the ones whose name is in brackets are special
 *
 * hf_tokenizer_write also writes the SentencePiece model itself as
 * spiece.model (the name transformers' ALBERT tokenizer looks for), a
 * tokenizer_config.json naming the special tokens and the same roles in
 * special_tokens_map.json, so the folder loads with or without the
 * `tokenizers` library. */
#ifndef KERN_HF_TOKENIZER_H
#define KERN_HF_TOKENIZER_H

#include <jansson.h>

#include "kernels/spm.h"

/* tokenizer.json of m as a new JSON object in *out (the caller decrefs it;
 * NULL on error).  COT_ERR_CORRUPT (a model this cannot read),
 * COT_ERR_NOMEM, COT_ERR_UNSUPPORTED (a word or char model). */
cot_err hf_tokenizer_json(const spm_model *m, json_t **out, cot_errbuf *eb);

/* Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and
 * spiece.model of m into
 * the folder dir (which exists); model_max_length goes into the config.
 * COT_ERR_IO naming the file, and hf_tokenizer_json's errors. */
cot_err hf_tokenizer_write(const spm_model *m, const char *dir, int model_max_length, cot_errbuf *eb);

#endif
