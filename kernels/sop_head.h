/* cotrain kernels: the encoders' sentence-order head on the [CLS] rows:
 * BERT's pooler and NSP classifier, ALBERT's pooler and SOP classifier,
 * both two-way:
 *   pooled = tanh(cls W_p + b_p)   cls[B,H], W_p[H,H]
 *   logits = pooled W_s + b_s      W_s[H,2] */
#ifndef KERN_SOP_HEAD_H
#define KERN_SOP_HEAD_H

void kern_sop_head_forward(float *pooled, float *logits, const float *cls, const float *wp, const float *bp,
                           const float *ws, const float *bs, int B, int H);

/* Given dlogits[B,2], set dcls[B,H] (old contents ignored) and add into the
 * weights' gradients; dpooled[B,H] is scratch. */
void kern_sop_head_backward_set(float *dcls, float *dwp, float *dbp, float *dws, float *dbs, float *dpooled,
                                const float *dlogits, const float *pooled, const float *cls, const float *wp,
                                const float *ws, int B, int H);

#endif
