/* cotrain CUDA backend: the layers' kernels on device buffers, and the
 * matrix products on cuBLAS.  Each function launches on stream s and
 * returns without waiting; errors surface at the next cuda_check.
 *
 * The values are the CPU layers' (kernels/layernorm.c, gelu.c,
 * attention.c, crossentropy.c, embedding.c), computed in fp32 in a
 * different order: within rounding of them, not bit for bit.  Every
 * reduction here (column sums, embedding gradients) runs in an order fixed
 * by the shape alone, with no atomics, so a GPU's results are the same on
 * every run. */
#ifndef COTRAIN_CUDA_LAYERS_H
#define COTRAIN_CUDA_LAYERS_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* The products: row-major as kernels/backend.h (element (i, j) at
 * [i * ld + j]), C = alpha op(A) op(B) + beta C, in the precision's compute
 * type (KERN_PREC_*).  batch > 1 runs a strided batch (strides in floats). */
cublasStatus_t cu_gemm(cublasHandle_t h, int precision, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, long sa, const float *B, int ldb, long sb, float beta,
                       float *C, int ldc, long sc, int batch);

/* out[n, :] = (res ? res[n, :] : 0) + bias[:] (bias may be NULL: a copy or zeros) */
void cu_rows_bias(cudaStream_t s, float *out, const float *res, const float *bias, int N, int C);

/* LayerNorm (eps as the CPU's): out, mean[N], rstd[N] from inp[N, C] */
void cu_layernorm_fwd(cudaStream_t s, float *out, float *mean, float *rstd, const float *inp, const float *w,
                      const float *b, int N, int C, float eps);
/* dinp += ..., and dw += sum_n dout * xhat, db += sum_n dout (scratch: at
 * least cu_colsum_scratch(N, C) floats) */
void cu_layernorm_bwd(cudaStream_t s, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, const float *mean, const float *rstd, int N, int C, float *scratch);

/* floats of scratch a column sum over N rows of width C needs */
size_t cu_colsum_scratch(int N, int C);
/* out[j] += sum_n a[n, j], in a fixed order */
void cu_colsum_add(cudaStream_t s, float *out, const float *a, int N, int C, float *scratch);

void cu_gelu_fwd(cudaStream_t s, float *out, const float *inp, long n);
/* dinp = dout * gelu'(inp) */
void cu_gelu_bwd(cudaStream_t s, float *dinp, const float *inp, const float *dout, long n);

/* qkv [B,T,3,NH,hd] <-> q, k, v each [B,NH,T,hd] (q, k, v contiguous in qkvp) */
void cu_qkv_split(cudaStream_t s, float *qkvp, const float *qkv, int B, int T, int C, int NH);
void cu_qkv_merge(cudaStream_t s, float *dqkv, const float *dqkvp, int B, int T, int C, int NH);
/* y [B,NH,T,hd] <-> [B,T,C] */
void cu_heads_merge(cudaStream_t s, float *out, const float *yp, int B, int T, int C, int NH);
void cu_heads_split(cudaStream_t s, float *yp, const float *y, int B, int T, int C, int NH);
/* rows of T scores, row r masked past r % T: softmax in place, zeros past */
void cu_softmax_causal(cudaStream_t s, float *att, long rows, int T);
/* dP -> dS = scale * P * (dP - sum P dP), zeros past the mask, in place */
void cu_softmax_causal_bwd(cudaStream_t s, float *datt, const float *att, long rows, int T, float scale);

/* lse[n] = logsumexp(logits[n, :]), losses[n] = lse - logits[n, target] */
void cu_crossentropy_fwd(cudaStream_t s, float *losses, float *lse, const float *logits,
                         const int32_t *targets, int N, int V);
/* in place: logits -> scale * (softmax - onehot(target)) */
void cu_crossentropy_bwd(cudaStream_t s, float *logits, const float *lse, const int32_t *targets, int N,
                         int V, float scale);

/* out[b, t, :] = wte[tok] + wpe[t] */
void cu_embedding_fwd(cudaStream_t s, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                      int B, int T, int C);
/* dwpe[t] += sum_b dout[b, t]; dwte[u] += the rows of token u, listed by
 * the host: uniq[n_uniq] tokens, their positions pos[offs[i] .. offs[i+1]) */
void cu_embedding_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout, const int32_t *uniq,
                      const int32_t *offs, const int32_t *pos, int n_uniq, int B, int T, int C);

#endif
