/* cotrain kernels: the GPT-style model, its parameters and its passes.
 *
 * A decoder-only transformer: token + position embeddings, n_layer pre-LN
 * blocks (x += attn(ln_1(x)); x += mlp(ln_2(x))), a final LayerNorm and an
 * output head tied to the token embedding, trained on next-token
 * cross-entropy.  GELU uses the tanh approximation.
 *
 * Cross-layer sharing (ALBERT): the n_layer blocks draw on n_shared <=
 * n_layer parameter sets; block l uses set l * n_shared / n_layer (integer
 * division), so consecutive blocks share: L=6, S=2 gives sets 0,0,0,1,1,1.
 * S = L is an ordinary GPT; S = 1 is ALBERT's all-shared model.  A shared
 * set's gradient is the sum of the gradients of the blocks using it.
 *
 * This is GPT-2 exactly (doc/model.md; kernels/hf_gpt2.h exports it under
 * Hugging Face's names): LayerNorm eps 1e-5, c_attn's columns are q, k, v,
 * each C wide, head h owning channels [h*hd, (h+1)*hd) of each, scores
 * scaled by 1/sqrt(hd), the head has no bias.
 *
 * Parameters live in one flat float buffer described by named views (llm.c
 * style, GPT-2 names; h.s counts parameter sets, not layers), in this order:
 *   wte [V,C], wpe [T,C],
 *   for each set s: h.s.ln_1.weight [C], h.s.ln_1.bias [C],
 *     h.s.attn.c_attn.weight [C,3C], h.s.attn.c_attn.bias [3C],
 *     h.s.attn.c_proj.weight [C,C], h.s.attn.c_proj.bias [C],
 *     h.s.ln_2.weight [C], h.s.ln_2.bias [C],
 *     h.s.mlp.c_fc.weight [C,F], h.s.mlp.c_fc.bias [F],
 *     h.s.mlp.c_proj.weight [F,C], h.s.mlp.c_proj.bias [C],
 *   ln_f.weight [C], ln_f.bias [C]
 * with V vocab, T seq_len, C d_model, F d_ff.  Linear weights are [in, out]
 * (GPT-2's Conv1D layout): y = x W + b.  The views are contiguous, with no
 * gaps, so the buffer holds exactly kern_param_count floats.  Gradients and
 * the optimizer's moments use the same layout.
 *
 * A config whose arch is albert or bert is a bidirectional encoder instead
 * (kernels/encoder.h): same struct, same flat buffers, so the optimizers,
 * checkpoints and averaging work on it unchanged; its passes are
 * kern_enc_forward / kern_enc_backward_scaled, and kern_forward refuses it. */
#ifndef KERN_MODEL_H
#define KERN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

/* Bounds checked by kern_config_validate. */
#define KERN_MAX_LAYERS 256
#define KERN_MAX_DIM 16384 /* d_model, d_ff */
#define KERN_MAX_SEQ 8192
#define KERN_MAX_VOCAB 262144
#define KERN_MAX_PARAMS ((size_t)1 << 32)

/* The architecture: the decoder (this file) or a bidirectional encoder
 * (kernels/encoder.h).  A zeroed config is a GPT. */
typedef enum { KERN_ARCH_GPT = 0, KERN_ARCH_ALBERT = 1, KERN_ARCH_BERT = 2 } kern_arch;

typedef struct {
	int n_layer;  /* L, blocks applied */
	int n_shared; /* S, parameter sets, 1 <= S <= L */
	int n_head;   /* divides d_model */
	int d_model;  /* C */
	int seq_len;  /* T, tokens per sample (every sample is full length) */
	int vocab;    /* V, 256 for the byte tokenizer */
	int d_ff;     /* F, MLP width, usually 4 * d_model */
	/* Encoders only (kernels/encoder.h); 0 and ignored for a GPT. */
	int arch;                            /* kern_arch */
	int d_embed;                         /* E: ALBERT's factorised embedding width; BERT: d_model */
	int type_vocab;                      /* segment types, 2 */
	int cls_id, sep_id, mask_id, pad_id; /* special tokens, distinct, < vocab */
	/* The tokenizer's unknown piece ([UNK]), which masking never picks as a
	 * target or a replacement; -1 when it has none (the byte tokenizer).  A
	 * subword project's special ids come from its tokenizer's pieces
	 * (server/project_tokenizer.h). */
	int unk_id;
	/* How the encoder sees token order (kern_position): absolute position
	 * embeddings added to the input (0, every model before the option), or
	 * a learned distance embedding per parameter set that the attention
	 * scores read (encoder.h).  0 for a GPT. */
	int position;
} kern_config;

/* An encoder's position signal, Hugging Face's position_embedding_type:
 * absolute, relative_key (scores += q_i . D[i-j]) or relative_key_query
 * (scores += q_i . D[i-j] + k_j . D[i-j]). */
typedef enum {
	KERN_POS_ABSOLUTE = 0,
	KERN_POS_RELATIVE_KEY = 1,
	KERN_POS_RELATIVE_KEY_QUERY = 2,
} kern_position;

/* The default config of the tests and of the kernel benchmark's "demo"
 * model: 4 layers (unshared), 4 heads, width 256, sequence 256, vocabulary
 * 256, d_ff 1024 (3.3M parameters).  The demo project itself
 * (packaging/demo/project.json) is smaller: 4 layers (unshared), 4 heads,
 * width 128, d_ff 512, sequence 128, vocabulary 256 (0.84M parameters),
 * trained in local mode on rounds of 1,024 samples in microbatches of 8,
 * AdamW with a warm-up of 2 of 32 steps. */
void kern_config_default(kern_config *c);

/* COT_OK, or COT_ERR_INVALID with a detail naming the offending field (sizes
 * out of bounds, n_shared > n_layer, d_model not a multiple of n_head, a
 * parameter count above KERN_MAX_PARAMS). */
cot_err kern_config_validate(const kern_config *c, cot_errbuf *eb);

/* The parameter set used by block l: l * n_shared / n_layer. */
int kern_layer_set(const kern_config *c, int l);

/* "gpt", "albert", "bert", or NULL for an unknown value. */
const char *kern_arch_name(int arch);
/* The kern_arch named name, or -1. */
int kern_arch_parse(const char *name);
/* "absolute", "relative_key", "relative_key_query" (Hugging Face's names),
 * or NULL for an unknown value. */
const char *kern_position_name(int position);
/* The kern_position named name, or -1. */
int kern_position_parse(const char *name);

/* Number of parameters (floats) of a valid config. */
size_t kern_param_count(const kern_config *c);

/* FLOPs of one training step (forward and backward) on one sample of
 * seq_len tokens, counting the matrix products exactly, 2 per multiply-add,
 * and nothing else (LayerNorm, softmax, GELU, embeddings are not counted):
 *   forward  F = L (2T(3C^2 + C^2 + 2CF) + 2CT(T+1)) + 2TCV
 * where 2CT(T+1) is the causal attention (q k^T and att v, only the
 * T(T+1)/2 unmasked scores of each head), and 2TCV the tied head; the
 * backward does twice the forward's products (input and weight gradients,
 * the attention's four products), so the total is 3F.  Per token this is
 * close to the usual 6N + 6LCT. */
double kern_flops_per_sample(const kern_config *c);

typedef struct {
	char name[64];
	size_t offset; /* in floats, into the flat buffer */
	size_t numel;
	int ndim;
	int shape[4];
} kern_view;

/* Append the view name of ndim (1 or 2) dimensions d0 [x d1] at offset
 * *off as view *k, written only when out is not NULL and *k < max; advance
 * *k and *off.  The layout helper of kern_param_views (model.c and
 * encoder.c). */
void kern_view_append(kern_view *out, int max, int *k, size_t *off, const char *name, int ndim, int d0,
                      int d1);

/* Fill out[0..max) with the named tensors of c, in buffer order, and return
 * their number (GPT: 2 + 12 n_shared + 2; encoders: encoder.h), also when out is NULL or max is too
 * small (then nothing or only the first max are written).  c must be valid. */
int kern_param_views(const kern_config *c, kern_view *out, int max);

struct kern_acts;
struct kern_enc_acts;
struct kern_gpu_bind;

typedef struct kern_model {
	kern_config config;
	size_t n_params;
	int n_views;
	kern_view *views; /* n_views entries, owned by the model */
	float *params;    /* n_params each, same layout */
	float *grads;
	float *m, *v;                   /* optimizer moments */
	long step;                      /* optimizer steps taken */
	int max_batch;                  /* largest B for kern_forward; 0: no activations */
	struct kern_acts *acts;         /* private */
	struct kern_enc_acts *enc_acts; /* private, encoders (encoder.c) */
	struct kern_gpu_bind *gpu;      /* private: the GPU it computes on, or NULL (gpu.h) */
} kern_model;

/* Allocate a model for config c with activation memory for batches of up to
 * max_batch samples (0 allocates none: enough for an optimizer or a
 * checkpoint, not for kern_forward).  Parameters, gradients and moments start
 * at zero; call kern_model_init or load a checkpoint.  On success the caller
 * owns *out (kern_model_free); on error *out is NULL.  COT_ERR_INVALID (bad
 * config or max_batch), COT_ERR_NOMEM. */
cot_err kern_model_create(const kern_config *c, int max_batch, kern_model **out, cot_errbuf *eb);
void kern_model_free(kern_model *m);

/* Deterministic initialisation from seed, the same on every machine: weights
 * N(0, 0.02) (wte, wpe and the linear weights), the two residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)) as in
 * GPT-2, LayerNorm weights 1, biases 0; draws in view order from the
 * generator of rng.h.  Zeroes grads and moments and sets step to 0. */
void kern_model_init(kern_model *m, uint64_t seed);

/* Forward pass on B samples (1 <= B <= max_batch) of seq_len tokens each:
 * tokens[B*T], targets[B*T] (the next tokens) or NULL for logits only.
 * With targets, *loss_out (if not NULL) receives the mean cross-entropy over
 * the B*T tokens and kern_backward may follow; without, *loss_out is 0.
 * kern_logits(m) then holds the B*T*V logits.  COT_ERR_INVALID for a token
 * or target outside [0, vocab) or a bad B (the detail says which),
 * COT_ERR_CONFLICT for a model created with max_batch 0. */
cot_err kern_forward(kern_model *m, const int32_t *tokens, const int32_t *targets, int B, float *loss_out,
                     cot_errbuf *eb);

/* Logits [B,T,V] of the last forward pass (owned by the model, valid until
 * the next forward), NULL before any. */
const float *kern_logits(const kern_model *m);

/* Backward pass of the last forward (which must have had targets), adding
 * (+=) the gradient of its mean loss into m->grads.  So after k microbatches
 * grads hold the sum of k mean-loss gradients: with microbatches of B
 * samples, that is 1/B times the gradient of the summed per-sample losses
 * (a sample's loss being its mean over T tokens); to get the gradient of the
 * mean over n samples in all, scale by B / n (kern_scale_grads).
 * COT_ERR_CONFLICT when no forward with targets preceded it. */
cot_err kern_backward(kern_model *m, cot_errbuf *eb);

/* As kern_backward, adding scale times the mean-loss gradient: scale = B
 * accumulates the gradient of the sum over samples directly. */
cot_err kern_backward_scaled(kern_model *m, float scale, cot_errbuf *eb);

void kern_zero_grad(kern_model *m);

/* grads *= s, element by element (deterministic). */
void kern_scale_grads(kern_model *m, float s);

#endif
