/* cotrain kernels: the bidirectional encoders, ALBERT and BERT, trained on
 * masked language modelling (MLM) and sentence order (SOP; BERT's NSP head).
 *
 * Hugging Face's AlbertForPreTraining / BertForPreTraining exactly
 * (kernels/hf_albert.h exports them under their names):
 *   e   = LayerNorm((word[id] + token_type[seg]) + position[t])   width E
 *   x_0 = e W_proj + b_proj   (ALBERT's factorised embedding, E -> H;
 *                              BERT has none and E = H)
 *   block (post-LN):  a = LayerNorm(x + attn(x) W_o + b_o)
 *                     x' = LayerNorm(a + gelu(a W_1 + b_1) W_2 + b_2)
 *   MLM: kernels/mlm_head.h on the final hidden states; SOP:
 *   kernels/sop_head.h on the [CLS] row (position 0)
 * Attention is unmasked (kernels/attention_full.h), every sample being
 * full length.  With config position relative_key (or relative_key_query)
 * the position row is not added to e, and each set's attention adds a
 * learned distance embedding D[2T-1, H/NH] to its scores, Hugging Face's
 * position_embedding_type of that name: q_i . D[i-j+T-1] (+ k_j . D[...]),
 * after the 1/sqrt(H/NH) scale for ALBERT, before it for BERT, as
 * AlbertAttention and BertSelfAttention do; emb.position stays in the
 * layout (Hugging Face's embeddings hold it too) and gets no gradient.  Every LayerNorm has eps 1e-12; GELU is the tanh form for
 * ALBERT (gelu_new), the exact erf form for BERT (gelu).  Block l uses
 * parameter set kern_layer_set(l) = l * n_shared / n_layer, as the GPT
 * (ALBERT requires n_layer to be a multiple of n_shared, its groups being
 * equal; BERT requires n_shared = n_layer).
 *
 * Parameters, in buffer order (linear weights [in, out], y = x W + b):
 *   emb.word [V,E], emb.position [T,E], emb.token_type [TV,E],
 *   emb.ln.weight [E], emb.ln.bias [E],
 *   (ALBERT) emb.proj.weight [E,H], emb.proj.bias [H],
 *   for each set s: layer.s.attn.qkv.weight [H,3H] (columns q, k, v),
 *     layer.s.attn.qkv.bias [3H], layer.s.attn.out.weight [H,H],
 *     layer.s.attn.out.bias [H], layer.s.attn.ln.weight [H],
 *     layer.s.attn.ln.bias [H], layer.s.ffn.weight [H,F], layer.s.ffn.bias [F],
 *     layer.s.ffn_out.weight [F,H], layer.s.ffn_out.bias [H],
 *     layer.s.ln.weight [H], layer.s.ln.bias [H],
 *     (relative positions) layer.s.attn.distance.weight [2T-1, H/NH],
 *   pooler.weight [H,H], pooler.bias [H], sop.weight [H,2], sop.bias [2],
 *   mlm.dense.weight [H,E], mlm.dense.bias [E], mlm.ln.weight [E],
 *   mlm.ln.bias [E], mlm.bias [V]
 * with V vocab, T seq_len, H d_model, F d_ff, E d_embed, TV type_vocab.
 * kern_model_init initialises it as Hugging Face does: every matrix
 * N(0, 0.02), LayerNorm weights 1, biases 0.
 *
 * The loss of a batch is the mean MLM cross-entropy over its predicted
 * positions plus the mean SOP cross-entropy over its samples (Hugging
 * Face's total_loss); a batch with no predicted position has MLM loss 0. */
#ifndef KERN_ENCODER_H
#define KERN_ENCODER_H

#include "kernels/model.h"

#include <stdint.h>

/* A label that is not predicted (PyTorch's ignore_index). */
#define KERN_ENC_IGNORE (-100)
#define KERN_ENC_LN_EPS 1e-12f

/* One batch of B samples of T = seq_len tokens. */
typedef struct {
	const int32_t *ids;      /* [B,T] in [0, vocab) */
	const int32_t *segments; /* [B,T] in [0, type_vocab) */
	/* [B,T]: the token to predict, or KERN_ENC_IGNORE.  NULL: no loss,
	 * and the MLM logits are computed at every position (fill-mask,
	 * export checks). */
	const int32_t *labels;
	const int32_t *sop; /* [B]: 0 in order, 1 swapped; NULL iff labels is */
	/* [B] in 1..T: sample b is its first lengths[b] tokens, padding after
	 * them unseen by attention (fill-mask of a short text); NULL: every
	 * sample is full length, as in training. */
	const int32_t *lengths;
} kern_enc_batch;

typedef struct {
	double loss;     /* mlm_loss + sop_loss */
	double mlm_loss; /* mean over the predicted positions, 0 if none */
	double sop_loss; /* mean over the samples */
	int n_predicted; /* positions with a label */
	int mlm_correct; /* of those, where the arg-max logit is the label */
	int sop_correct; /* samples whose arg-max SOP logit is the label */
} kern_enc_result;

/* Forward pass of an encoder model (created with max_batch >= B).  With
 * labels, *res (if not NULL) receives the losses and counts and
 * kern_enc_backward_scaled may follow; without, *res is zeroed.
 * COT_ERR_INVALID for an id, segment, label or SOP label out of range,
 * labels without sop or the reverse, or a bad B (the detail says which);
 * COT_ERR_CONFLICT for a GPT model or one without activations. */
cot_err kern_enc_forward(kern_model *m, const kern_enc_batch *batch, int B, kern_enc_result *res,
                         cot_errbuf *eb);

/* MLM logits of the last forward, [*rows, V] (owned by the model, valid
 * until the next forward): one row per predicted position in (b, t) order
 * with labels, one per position ([B,T,V]) without; *positions (if not
 * NULL) receives the b*T+t of each row.  NULL before any forward. */
const float *kern_enc_mlm_logits(const kern_model *m, int *rows, const int32_t **positions);

/* SOP logits [B,2] of the last forward, NULL before any. */
const float *kern_enc_sop_logits(const kern_model *m);

/* Add (+=) scale times the gradient of the last forward's loss into
 * m->grads.  COT_ERR_CONFLICT when no forward with labels preceded it. */
cot_err kern_enc_backward_scaled(kern_model *m, float scale, cot_errbuf *eb);

/* One microbatch of the training stream: kern_mask_build's samples from
 * raw (B samples, raw_stride apart) and the key (seed, epoch, microbatch),
 * then kern_enc_forward (*res as there) and kern_enc_backward_scaled(scale),
 * the batch held in the model's own buffers.  Errors as those. */
cot_err kern_enc_train_stream(kern_model *m, const int32_t *raw, size_t raw_stride, int B, uint64_t seed,
                              int64_t epoch, int64_t microbatch, float scale, kern_enc_result *res,
                              cot_errbuf *eb);

/* The batch kern_enc_train_stream trains on: *batch points into m's own
 * buffers (valid until the next call).  Errors as kern_mask_build's;
 * COT_ERR_CONFLICT for a GPT or a model without activations. */
cot_err kern_enc_stream_batch(kern_model *m, const int32_t *raw, size_t raw_stride, int B, uint64_t seed,
                              int64_t epoch, int64_t microbatch, kern_enc_batch *batch, cot_errbuf *eb);

/* Positions one sample predicts (kernels/masking.h): 15% of its T - 3 raw
 * tokens, rounded, at least 1. */
int kern_enc_predicted_per_sample(const kern_config *c);

/* For model.c: the encoder's part of kern_config_validate,
 * kern_param_count, kern_param_views, kern_flops_per_sample, and its
 * activations (kern_model_create / kern_model_free). */
cot_err kern_enc_config_validate(const kern_config *c, cot_errbuf *eb);
size_t kern_enc_param_count(const kern_config *c);
int kern_enc_param_views(const kern_config *c, kern_view *out, int max);
double kern_enc_flops_per_sample(const kern_config *c);
cot_err kern_enc_acts_create(const kern_config *c, int max_batch, struct kern_enc_acts **out, cot_errbuf *eb);
void kern_enc_acts_free(struct kern_enc_acts *a);

#endif
