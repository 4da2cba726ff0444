/* cotrain kernels: the encoders' training samples, built deterministically
 * from the raw token stream: sentence-order pairs and dynamic masking.
 *
 * A sample consumes exactly kern_mask_raw_per_sample(c) = seq_len - 3 raw
 * tokens (T = seq_len minus [CLS] and two [SEP]).  Which stream tokens those
 * are is the dataset side's mapping (doc/model.md): today sample i of
 * microbatch j is the GPT's sample, tokens [(j B + i) T, (j B + i) T + T - 3)
 * of its epoch.  From them and the key (project
 * seed, epoch, microbatch index j, sample index i) alone:
 *  - the split: the slice's first a tokens are segment A, the rest B, a
 *    drawn uniformly from [n/4, n - n/4] (n = T - 3, n/4 at least 1), so
 *    that a segment's length says nothing about the order;
 *  - the order: with probability 1/2 the two are swapped (SOP label 1):
 *      ids = [CLS] first [SEP] second [SEP]
 *    segment ids 0 up to and including the middle [SEP], 1 after;
 *  - the masking: of the positions holding an ordinary token (not [CLS],
 *    [SEP], [MASK], [PAD] or the unknown piece c->unk_id), round(15%) (at least 1 when there is one) are
 *    drawn without replacement; each gets its original token as MLM label
 *    and its input replaced by [MASK] with probability 0.8, by a uniformly
 *    drawn ordinary token with 0.1, kept with 0.1.  Other labels are
 *    KERN_ENC_IGNORE.
 * The draws come from kern_rng seeded by a hash of the key, in a fixed
 * order, so a replay, a spot check and every peer build the same samples,
 * on any machine and thread count. */
#ifndef KERN_MASKING_H
#define KERN_MASKING_H

#include "kernels/model.h"

#include <stdint.h>

#define KERN_MASK_RATE 0.15

/* Raw stream tokens one sample consumes: seq_len - 3. */
int kern_mask_raw_per_sample(const kern_config *c);

/* Build the B samples of microbatch `microbatch` of `epoch`: sample b's
 * kern_mask_raw_per_sample(c) stream tokens are raw[b * raw_stride ...],
 * each in [0, vocab) (raw_stride >= seq_len - 3: seq_len - 3 for a packed
 * stream, seq_len for the GPT's samples, whose last 3 tokens and target
 * are then left out); ids,
 * segments and labels receive [B, seq_len], sop [B] (kern_enc_batch's
 * layout).  c must be a valid encoder config.  COT_ERR_INVALID (nothing
 * written) for a raw token outside the vocabulary, B < 1 or a stride below
 * seq_len - 3; COT_ERR_NOMEM. */
cot_err kern_mask_build(const kern_config *c, uint64_t seed, int64_t epoch, int64_t microbatch, int B,
                        const int32_t *raw, size_t raw_stride, int32_t *ids, int32_t *segments,
                        int32_t *labels, int32_t *sop, cot_errbuf *eb);

#endif
