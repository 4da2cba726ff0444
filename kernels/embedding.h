/* cotrain kernels: token, position (and the encoders' segment) embeddings. */
#ifndef KERN_EMBEDDING_H
#define KERN_EMBEDDING_H

#include <stdint.h>

/* out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :].  wte is [V,C], wpe [T,C] (at
 * least T rows); tokens must already be checked to lie in [0, V). */
void kern_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                            int T, int C);

/* dwte[V,C] += scatter of dout by token; dwpe[T,C] += dout summed over b.
 * Each channel is summed by one thread in (b, t) order: deterministic. */
void kern_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                             int C);

/* The encoders' embedding sum (BERT's order):
 *   out[b,t,:] = (wte[tokens[b,t], :] + wtt[segments[b,t], :]) + wpe[t, :]
 * wtt [type_vocab, C]; tokens and segments already checked.  wpe NULL: no
 * position row (an encoder with relative positions). */
void kern_embedding_seg_forward(float *out, const int32_t *tokens, const int32_t *segments, const float *wte,
                                const float *wpe, const float *wtt, int B, int T, int C);

/* dwte, dwpe as kern_embedding_backward, and dwtt += dout scattered by
 * segment; deterministic in the same way.  dwpe NULL: no position row. */
void kern_embedding_seg_backward(float *dwte, float *dwpe, float *dwtt, const float *dout,
                                 const int32_t *tokens, const int32_t *segments, int B, int T, int C);

#endif
