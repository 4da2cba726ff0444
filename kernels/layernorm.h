/* cotrain kernels: layer normalisation over the last dimension. */
#ifndef KERN_LAYERNORM_H
#define KERN_LAYERNORM_H

#define KERN_LN_EPS 1e-5f /* PyTorch's nn.LayerNorm default */

/* For each of the N rows of inp[N,C]:
 *   out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
 * with the biased variance; mean[N] and rstd[N] are saved for backward. */
void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C);

/* The same with epsilon eps (BERT and ALBERT use 1e-12); the backward
 * needs no epsilon, only the saved rstd. */
void kern_layernorm_forward_eps(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                const float *bias, int N, int C, float eps);

/* Accumulate: dinp[N,C] += d/dinp, dweight[C] += sum dout * xhat,
 * dbias[C] += sum dout, given dout[N,C] and the forward's inp, mean, rstd.
 * dinp must not overlap dout or inp (the parameter sums read them while
 * other rows of dinp are written). */
void kern_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C);

#endif
