/* cotrain kernels: bidirectional (unmasked) multi-head self-attention, the
 * encoders' attention.
 *
 * Same layout as kernels/attention.h: qkv[B,T,3C] holds q, k, v for each
 * token, head h of NH owning channels [h*hd, (h+1)*hd) of each, hd = C/NH;
 *   att[b,h,t,:] = softmax_j( q_t . k_j / sqrt(hd) ), every j in [0, T)
 *   out[b,t,h*hd:(h+1)*hd] = sum_j att[b,h,t,j] v_j
 * No padding mask: every sample is full length (kernels/masking.h builds
 * them so).  Each (sample, head) pair is one task running the backend's
 * single-threaded products, as the causal attention does, so results do not
 * depend on the thread count. */
#ifndef KERN_ATTENTION_FULL_H
#define KERN_ATTENTION_FULL_H

#include <stdint.h>

/* out[B,T,C]; att[B,NH,T,T] receives the probabilities (kept for backward).
 * lens[B] (NULL: every sample full) limits sample b's keys to [0, lens[b]):
 * the padding after them gets probability 0 (Hugging Face's attention_mask
 * for right-padded inputs); 1 <= lens[b] <= T.  The backward needs no
 * lengths: a zero probability passes no gradient. */
void kern_attention_full_forward(float *out, float *att, const float *qkv, const int32_t *lens, int B, int T,
                                 int C, int NH);

/* dqkv[B,T,3C] = gradient given dout[B,T,C] and the forward's qkv and att,
 * dqkv's old contents ignored; datt[B,NH,T,T] is scratch. */
void kern_attention_full_backward_set(float *dqkv, float *datt, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH);

/* Relative positions (Hugging Face's position_embedding_type relative_key
 * and relative_key_query): the same attention with each score
 *   s[t,j] = q_t . k_j / sqrt(hd) + rs (q_t . D[t-j+T-1] [+ k_j . D[t-j+T-1]])
 * where D[2T-1, hd] (dist) is one distance embedding shared by the heads,
 * key_query (0 or 1) adds the key term, and rs is 1 for ALBERT (whose
 * AlbertAttention adds the term after the 1/sqrt(hd) scale) and 1/sqrt(hd)
 * for BERT (BertSelfAttention adds it before).  Shapes and lens as
 * kern_attention_full_forward; dist must not be NULL (absolute positions
 * use the two calls above, which these leave unchanged). */
void kern_attention_full_rel_forward(float *out, float *att, const float *qkv, const float *dist,
                                     const int32_t *lens, int B, int T, int C, int NH, float rs,
                                     int key_query);

/* dqkv[B,T,3C] = gradient given dout[B,T,C] and the forward's qkv and att,
 * dqkv's old contents ignored; ddist[2T-1, hd] += the distance embedding's
 * gradient (accumulated, as parameter gradients are), summed over samples
 * and heads in a fixed order, so the result does not depend on the thread
 * count; datt[B,NH,T,T] is scratch and holds d(scores) afterwards. */
void kern_attention_full_rel_backward(float *dqkv, float *ddist, float *datt, const float *dout,
                                      const float *qkv, const float *dist, const float *att, int B, int T,
                                      int C, int NH, float rs, int key_query);

#endif
