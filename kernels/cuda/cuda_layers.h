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
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Where the products run: the handle (on stream s), the precision
 * (KERN_PREC_*), and for bf16 two scratch buffers of cap elements each
 * that hold the operands rounded to bf16 (NULL or too small: cuBLAS's own
 * fp32-to-bf16 path, several times slower). */
struct cu_gemm_ctx {
	cublasHandle_t h;
	cudaStream_t s;
	int precision;
	__nv_bfloat16 *a16, *b16;
	size_t cap;
};

/* The products: row-major as kernels/backend.h (element (i, j) at
 * [i * ld + j]), C = alpha op(A) op(B) + beta C, in fp32 or tf32 on the
 * fp32 operands, or in bf16 on the operands rounded to bf16 (fp32
 * accumulation and output).  batch > 1 runs a strided batch (strides in
 * floats). */
cublasStatus_t cu_gemm(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, long sa, const float *B, int ldb, long sb, float beta,
                       float *C, int ldc, long sc, int batch);

/* out[n, :] = (res ? res[n, :] : 0) + bias[:] (bias may be NULL: a copy or zeros) */
void cu_rows_bias(cudaStream_t s, float *out, const float *res, const float *bias, int N, int C);

/* LayerNorm (eps as the CPU's): out, mean[N], rstd[N] from inp[N, C]; out
 * in fp32, or bf16 into out16, or both (either may be NULL) */
void cu_layernorm_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *mean, float *rstd,
                      const float *inp, const float *w, const float *b, int N, int C, float eps);
/* dinp += ..., and dw += sum_n dout * xhat, db += sum_n dout (scratch: at
 * least cu_colsum_scratch(N, C) floats); dinp16 (may be NULL) gets dinp's
 * new values in bf16 */
void cu_layernorm_bwd(cudaStream_t s, float *dinp, __nv_bfloat16 *dinp16, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, const float *mean,
                      const float *rstd, int N, int C, float *scratch);

/* floats of scratch a column sum over N rows of width C needs */
size_t cu_colsum_scratch(int N, int C);
/* out[j] += sum_n a[n, j], in a fixed order */
void cu_colsum_add(cudaStream_t s, float *out, const float *a, int N, int C, float *scratch);

void cu_gelu_fwd(cudaStream_t s, float *out, const float *inp, long n);
/* pre[rows, N] += bias (the product's bias, added after it), then
 * out = gelu(pre): the MLP's first half after its product (out in fp32,
 * out16 in bf16: either may be NULL) */
void cu_bias_gelu_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *pre, const float *bias,
                      int rows, int N);
/* dinp = dout * gelu'(inp), and in bf16 into dinp16 (may be NULL) */
void cu_gelu_bwd(cudaStream_t s, float *dinp, __nv_bfloat16 *dinp16, const float *inp, const float *dout,
                 long n);

/* Bytes of one element of the attention's saved q, k, v and
 * probabilities: 4 (fp32), or 2 in bf16 mode, where they are stored in bf16
 * and multiplied as they are. */
size_t cu_att_elem(int precision);

/* Multi-head attention, causal (kernels/attention.c's values) or over
 * every key (attention_full.c's, every sample full length), on
 * qkv [B,T,3C] into out [B,T,C], saving qkvp (3*B*T*C elements: q, k, v
 * as [B,NH,T,hd]) and att (the probabilities [B,NH,T,T]), each of
 * cu_att_elem bytes; yp is fp32 scratch of B*T*C.  bias[3C] (may be NULL)
 * is added to qkv on the way (the c_attn projection's bias). */
cublasStatus_t cu_attention_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                const float *qkv, const float *bias, int B, int T, int C, int NH,
                                bool causal);
/* q, k, v of qkv [B,T,3C] (+ bias[3C], may be NULL) into qkvp in bf16,
 * each [B,NH,T,hd] (what the fused attention, cuda_flash.h, reads) */
void cu_qkv_split16(cudaStream_t s, __nv_bfloat16 *qkvp, const float *qkv, const float *bias, int B, int T,
                    int C, int NH);
/* Its backward: dqkv [B,T,3C] (set) from dout [B,T,C] and what the forward
 * saved; scratch: dyp (B*T*C) and datt ([B,NH,T,T]) of cu_att_elem bytes,
 * dqkvp 3*B*T*C floats. */
cublasStatus_t cu_attention_bwd(const cu_gemm_ctx *x, float *dqkv, const float *dout, const void *qkvp,
                                const void *att, void *dyp, void *datt, float *dqkvp, int B, int T, int C,
                                int NH, bool causal);

/* The encoders' attention with relative positions (kernels/attention_full.h,
 * kern_attention_full_rel_forward): cu_attention_fwd's over every key, each
 * score plus rs (q_i . D[i-j+T-1] (+ k_j . D[i-j+T-1] where kd is given)),
 * D = dist [2T-1, hd] (dist16 its bf16 copy in bf16 mode); qd and kd (NULL:
 * relative_key) are fp32 scratch of B*NH*T*(2T-1). */
cublasStatus_t cu_attention_rel_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                    const float *qkv, const float *bias, const float *dist,
                                    const __nv_bfloat16 *dist16, float *qd, float *kd, int B, int T, int C,
                                    int NH, float rs);
/* Its backward: cu_attention_bwd's dqkv (set), and ddist += the distance
 * embedding's gradient; drel is scratch of B*NH*T*(2T-1) elements of
 * cu_att_elem bytes. */
cublasStatus_t cu_attention_rel_bwd(const cu_gemm_ctx *x, float *dqkv, float *ddist, const float *dout,
                                    const void *qkvp, const void *att, void *dyp, void *datt, float *dqkvp,
                                    const float *dist, const __nv_bfloat16 *dist16, void *drel, int B, int T,
                                    int C, int NH, float rs, bool key_query);

/* Rows of V logits, ld apart (a multiple of 64 keeps the head's products
 * on aligned, fast kernels: GPT-2's 50257 is not even a multiple of 2).
 * lse[n] = logsumexp(logits[n, :]), losses[n] = lse - logits[n, target] */
void cu_crossentropy_fwd(cudaStream_t s, float *losses, float *lse, const float *logits,
                         const int32_t *targets, int N, int V, int ld);
/* in place: logits -> scale * (softmax - onehot(target)) */
void cu_crossentropy_bwd(cudaStream_t s, float *logits, const float *lse, const int32_t *targets, int N,
                         int V, int ld, float scale);

/* The same into a bf16 copy (bf16 mode: what the head's two products read),
 * its columns V .. ld - 1 zeros: a product may then run over all ld */
void cu_crossentropy_bwd16(cudaStream_t s, __nv_bfloat16 *dlogits, const float *logits, const float *lse,
                           const int32_t *targets, int N, int V, int ld, float scale);
/* dst[0 .. n) = src rounded to bf16 (src 16-byte aligned) */
void cu_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, long n);
/* cu_gemm's product on operands already in bf16 (fp32 accumulation and
 * output) */
cublasStatus_t cu_gemm_bf16(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha,
                            const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta,
                            float *C, int ldc);

/* out[b, t, :] = wte[tok] + wpe[t] */
void cu_embedding_fwd(cudaStream_t s, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                      int B, int T, int C);
/* The host's lists cu_embedding_bwd reads, from tokens[BT]: the tokens
 * present in order of first appearance into uniq, and the positions
 * holding each, in increasing order, into pos (token uniq[i]'s are
 * pos[offs[i] .. offs[i+1])): a counting sort.  cnt is zeroed scratch of the
 * vocabulary's size, zeroed again on return.  Returns how many tokens are
 * present. */
int cu_token_lists(const int32_t *tokens, int BT, int32_t *cnt, int32_t *uniq, int32_t *offs, int32_t *pos);
/* dwpe[t] += sum_b dout[b, t] (dwpe NULL: none); dwte[u] += the rows of token u, listed by
 * the host: uniq[n_uniq] tokens, their positions pos[offs[i] .. offs[i+1]) */
void cu_embedding_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout, const int32_t *uniq,
                      const int32_t *offs, const int32_t *pos, int n_uniq, int B, int T, int C);

#endif
