/* cotrain kernels: fill-mask with an encoder (kernels/encoder.h): what the
 * model predicts for each "[MASK]" of a text.
 *
 * On the byte tokenizer and its four special tokens (ids 256 and up) the
 * text is encoded here as [CLS] bytes [SEP], each literal "[MASK]" becoming
 * the model's mask token; a subword model's text comes encoded by its
 * tokenizer (fill_mask_ids; "[MASK]" is one of its pieces).  The sample is
 * padded with [PAD] to seq_len and run as one sample of that length (the
 * padding unseen, kernels/attention_full.h). */
#ifndef KERN_FILL_MASK_H
#define KERN_FILL_MASK_H

#include "kernels/model.h"

#include <stddef.h>
#include <stdint.h>

#define FILL_MAX_MASKS 64
#define FILL_MASK_TEXT "[MASK]"

typedef struct {
	int n_masks;                  /* "[MASK]"s in the text */
	int position[FILL_MAX_MASKS]; /* of each, in the encoded sample */
	int k;                        /* predictions per mask */
	int32_t *token;               /* [n_masks, k], most likely first */
	float *prob;                  /* [n_masks, k] */
} fill_result;

/* Predict the top k (1..vocab) tokens of each "[MASK]" in text[0..len)
 * with m (created with max_batch >= 1).  On success *r holds them (the
 * caller frees with fill_result_free).  COT_ERR_INVALID (the detail says
 * why) for a GPT or an encoder whose special tokens are not above the 256
 * bytes, a text with no "[MASK]" or more than FILL_MAX_MASKS, or one that
 * does not fit seq_len - 2 tokens; COT_ERR_NOMEM; the forward's errors. */
cot_err fill_mask(kern_model *m, const char *text, size_t len, int k, fill_result *r, cot_errbuf *eb);

/* The same for a text already encoded into text_ids[0..n) (the model's
 * vocabulary, mask_id where a prediction is wanted, without [CLS] and
 * [SEP]): a subword model's, whose ids come from its tokenizer.  Positions
 * in r count the [CLS] before the text.  COT_ERR_INVALID for a GPT, an id
 * outside the vocabulary, no mask or more than FILL_MAX_MASKS, more than
 * seq_len - 2 ids; COT_ERR_NOMEM; the forward's errors. */
cot_err fill_mask_ids(kern_model *m, const int32_t *text_ids, size_t n, int k, fill_result *r,
                      cot_errbuf *eb);

void fill_result_free(fill_result *r);

/* The printable form of token t of m's vocabulary into out (at least 8
 * bytes): a printable ASCII byte as itself, another byte as \xNN, a special
 * token as [CLS], [SEP], [MASK] or [PAD]. */
void fill_token_name(const kern_config *c, int32_t t, char out[8]);

#endif
