/* cotrain kernels: text generation, to see what a model has learned.
 *
 * Autoregressive sampling with a model: each step runs the forward pass
 * (batch 1) on the last seq_len tokens and draws the next token from the
 * logits at the last position, greedily or from the top k after a
 * temperature.  Randomness comes from a small portable PRNG (splitmix64)
 * seeded by the caller, so the same model, prompt and options give the
 * same tokens on every machine that computes the same logits. */
#ifndef KERN_GENERATE_H
#define KERN_GENERATE_H

#include <stdint.h>

#include "kernels/model.h"
#include "shared/common/error.h"

#define GEN_MAX_TOKENS (1 << 20) /* tokens one call may generate */

typedef struct {
	int n_tokens;      /* tokens to generate, 0..GEN_MAX_TOKENS */
	int top_k;         /* 1: greedy; 0: the whole vocabulary; else the
	                       k most likely tokens */
	float temperature; /* > 0 divides the logits; 0 means greedy */
	uint64_t seed;     /* PRNG seed; unused when greedy */
} gen_options;

/* splitmix64: a 64-bit state, portable and reproducible. */
typedef struct {
	uint64_t s;
} gen_rng;

void gen_rng_seed(gen_rng *r, uint64_t seed);
uint64_t gen_rng_next(gen_rng *r);
/* A uniform double in [0, 1) with 53 random bits. */
double gen_rng_uniform(gen_rng *r);

/* Draw one token from V logits under o (temperature, top_k; n_tokens and
 * seed are ignored) into *token.  Greedy picks the largest logit, the
 * lowest index on ties; sampling keeps the top_k largest (ties to the lower
 * index) and draws with probabilities softmax(logit / temperature).
 * COT_ERR_INVALID when V < 1, an option is out of range, or a logit is NaN
 * or +Inf (a model that has diverged); COT_ERR_NOMEM. */
cot_err gen_sample(const float *logits, int V, const gen_options *o, gen_rng *rng, int32_t *token,
                   cot_errbuf *eb);

/* Generate o->n_tokens tokens after prompt[0..n_prompt) into
 * out[0..o->n_tokens), which the caller provides.  The prompt must hold at
 * least one token, each in 0..vocab-1; only its last seq_len tokens are
 * seen.  Runs kern_forward on m (made with max_batch >= 1) with batch 1, so m's activations and
 * logits are overwritten; parameters are not touched.  COT_ERR_INVALID for
 * bad arguments (detail says which), errors of kern_forward and gen_sample
 * otherwise; out is then partly written. */
cot_err gen_generate(kern_model *m, const int32_t *prompt, int n_prompt, const gen_options *o, int32_t *out,
                     cot_errbuf *eb);

#endif
