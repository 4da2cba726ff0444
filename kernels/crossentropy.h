/* cotrain kernels: the tied output head and the next-token cross-entropy. */
#ifndef KERN_CROSSENTROPY_H
#define KERN_CROSSENTROPY_H

#include <stdint.h>

/* logits[N,V] = x[N,C] @ wte[V,C]^T: the token embedding doubles as the
 * output projection (weight tying, as in GPT-2). */
void kern_head_forward(float *logits, const float *x, const float *wte, int N, int C, int V);

/* dx[N,C] += dlogits @ wte; dwte[V,C] += dlogits^T @ x. */
void kern_head_backward(float *dx, float *dwte, const float *dlogits, const float *x, const float *wte, int N,
                        int C, int V);

/* losses[n] = -log softmax(logits[n,:])[targets[n]] for each of N rows;
 * returns their mean, summed in double in row order.  targets must already
 * be checked to lie in [0, V). */
double kern_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N, int V);

/* dlogits[N,V] += dloss * (softmax(logits[n]) - onehot(targets[n])): dloss
 * is the loss gradient for each row, 1/N for the mean over N rows. */
void kern_crossentropy_backward(float *dlogits, const float *logits, const int32_t *targets, float dloss,
                                int N, int V);
/* The same into dlogits' place, its old contents ignored (no zeroing pass). */
void kern_crossentropy_backward_set(float *dlogits, const float *logits, const int32_t *targets, float dloss,
                                    int N, int V);

#endif
