/* cotrain kernels: the encoders' training samples, built deterministically
 * from the raw token stream: sentence-order pairs and dynamic masking.
 *
 * Sample i of microbatch j (B samples each) consumes exactly
 * kern_mask_raw_per_sample(c) = seq_len - 3 raw tokens, the stream's tokens
 * [(j B + i)(T - 3), (j B + i + 1)(T - 3)) of its epoch, no overlap, no
 * gap; a microbatch consumes B (T - 3).  From them and the key (project
 * seed, epoch, microbatch index j, sample index i) alone:
 *  - the split: the slice's first a tokens are segment A, the rest B, a
 *    drawn uniformly from [n/4, n - n/4] (n = T - 3, n/4 at least 1), so
 *    that a segment's length says nothing about the order;
 *  - the order: with probability 1/2 the two are swapped (SOP label 1):
 *      ids = [CLS] first [SEP] second [SEP]
 *    segment ids 0 up to and including the middle [SEP], 1 after;
 *  - the masking: of the positions holding an ordinary token (not [CLS],
 *    [SEP], [MASK] or [PAD]), round(15%) (at least 1 when there is one) are
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

/* Build the B samples of microbatch `microbatch` of `epoch`: raw holds the
 * B * kern_mask_raw_per_sample(c) stream tokens, each in [0, vocab); ids,
 * segments and labels receive [B, seq_len], sop [B] (kern_enc_batch's
 * layout).  c must be a valid encoder config.  COT_ERR_INVALID (nothing
 * written) for a raw token outside the vocabulary or B < 1; COT_ERR_NOMEM. */
cot_err kern_mask_build(const kern_config *c, uint64_t seed, int64_t epoch, int64_t microbatch, int B,
                        const int32_t *raw, int32_t *ids, int32_t *segments, int32_t *labels, int32_t *sop,
                        cot_errbuf *eb);

#endif
