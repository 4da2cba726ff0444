/* cotrain kernels: the linear layer, y = x W + b, through the backend.
 *
 * Weights are stored [in, out] (GPT-2's Conv1D layout, as in the GPT-2
 * checkpoints whose tensor names the model uses), so the forward product is
 * x[M,K] @ W[K,N] with no transpose. */
#ifndef KERN_MATMUL_H
#define KERN_MATMUL_H

/* out[M,N] = inp[M,K] @ W[K,N] + bias[N]; bias may be NULL.  out must not
 * overlap inp. */
void kern_linear_forward(float *out, const float *inp, const float *W, const float *bias, int M, int K,
                         int N);

/* out[M,N] += inp[M,K] @ W[K,N] + bias[N]: the residual connection fused into
 * the projection that feeds it. */
void kern_linear_forward_add(float *out, const float *inp, const float *W, const float *bias, int M, int K,
                             int N);

/* out[M,N] = res[M,N] + inp[M,K] @ W[K,N] + bias[N]: kern_linear_forward_add
 * on a copy of res, the copy made per tile (no separate pass).  out must not
 * overlap res or inp. */
void kern_linear_forward_residual(float *out, const float *res, const float *inp, const float *W,
                                  const float *bias, int M, int K, int N);

/* kern_linear_forward into out, then gout[M,N] = gelu(out) (the MLP's
 * first half), the GELU applied to each block of out as the product
 * finishes it: the values of kern_gelu_forward on out, bit for bit. */
void kern_linear_forward_gelu(float *out, float *gout, const float *inp, const float *W, const float *bias,
                              int M, int K, int N);

/* Accumulate the gradients of kern_linear_forward given dout[M,N]:
 *   dinp[M,K] += dout @ W^T      (skipped when dinp is NULL)
 *   dW[K,N]   += inp^T @ dout
 *   dbias[N]  += sum over rows of dout   (skipped when dbias is NULL) */
void kern_linear_backward(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                          const float *W, int M, int K, int N);

/* The same, but dinp[M,K] = dout @ W^T, its old contents ignored (no
 * zeroing pass needed); dW and dbias still accumulate. */
void kern_linear_backward_set(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                              const float *W, int M, int K, int N);

/* kern_linear_backward_set, the layer's input being gelu(x): dpre[M,K] =
 * dout @ W^T (scratch), dx[M,K] = dpre * gelu'(x) (kern_gelu_backward_set's
 * values, bit for bit, computed block by block as the product finishes
 * them); dW and dbias accumulate. */
void kern_linear_backward_set_gelu(float *dpre, float *dx, const float *x, float *dW, float *dbias,
                                   const float *dout, const float *inp, const float *W, int M, int K, int N);

/* dst[N] += sum over the M rows of src[M,N], summed in double in row order
 * (deterministic on any thread count). */
void kern_colsum_add(float *dst, const float *src, int M, int N);

#endif
