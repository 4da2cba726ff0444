/* cotrain: which tokens a stream microbatch is made of (doc/dataset.md,
 * "Training samples"; doc/project-file.md).
 *
 * One place for the mapping that the client's compute, the replay trainer of
 * the equivalence test and anything else that recomputes a work unit must
 * agree on, bit for bit:
 *
 *   stream microbatch g is microbatch m = g % mb_per_epoch of epoch
 *   g / mb_per_epoch; it is samples [m*B, (m+1)*B) of the epoch, with B the
 *   project's microbatch_size; sample j is tokens [j*T, j*T + T + 1) of the
 *   dataset's token stream (T = seq_len): inputs the first T, targets the
 *   last T.  So the microbatch reads the B*T + 1 tokens starting at
 *   m*B*T, inputs in[i] = tok[m*B*T + i] and targets tgt[i] = tok[m*B*T + i + 1]
 *   for i in [0, B*T).
 *
 * Tokens come from spans (the shards a caller has loaded), each a run of the
 * stream [first, first + n); spans need not be sorted and a microbatch may
 * straddle several.  Pure: no I/O, no allocation. */
#ifndef COT_MICROBATCH_H
#define COT_MICROBATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "shared/common/error.h"

/* A run of the token stream: tokens[0..n) are stream positions
 * [first, first + n), each `width` bytes as a shard stores them (0 or 1:
 * one byte, the byte tokenizer; 2 or 4: a little-endian u16 or u32 id of a
 * subword tokenizer).  The tokens are borrowed, never freed here. */
typedef struct {
	uint64_t first;
	uint64_t n;
	const unsigned char *tokens;
	int width;
} mb_span;

/* The project's geometry: microbatches per epoch, samples per microbatch
 * (microbatch_size) and tokens per sample (seq_len). */
typedef struct {
	int64_t mb_per_epoch;
	int64_t B;
	int64_t T;
} mb_shape;

/* Microbatches per epoch of a stream of n_tokens tokens:
 * floor(floor((n_tokens - 1) / T) / B), as cotrain-admin records it; 0 when
 * the stream holds no full microbatch or T or B is below 1. */
int64_t mb_per_epoch(uint64_t n_tokens, int64_t T, int64_t B);

/* COT_OK when s is usable (every field >= 1 and mb_per_epoch*B*T + 1 fits
 * in 2^62), else COT_ERR_INVALID naming the field. */
cot_err mb_shape_check(const mb_shape *s, cot_errbuf *eb);

/* Stream position of the first token of stream microbatch g (g >= 0, s
 * checked): (g % mb_per_epoch) * B * T.  It reads B*T + 1 tokens from there. */
uint64_t mb_first_token(const mb_shape *s, int64_t g);

/* The token at stream position pos, or -1 when no span holds it. */
int mb_token_at(const mb_span *spans, int nspans, uint64_t pos);

/* Fill in[B*T] and tgt[B*T] with the inputs and targets of stream
 * microbatch g (layout above: sample-major, T tokens per sample).  in and
 * tgt may both be NULL: then it only checks that the spans hold every token
 * the microbatch reads.  COT_ERR_INVALID for a bad shape or g < 0, and when
 * a token is missing (the detail names the position and the microbatch);
 * the outputs are then partly written. */
cot_err mb_fill(const mb_shape *s, const mb_span *spans, int nspans, int64_t g, int32_t *in, int32_t *tgt,
                cot_errbuf *eb);

#endif
