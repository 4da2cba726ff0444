/* cotrain CUDA backend: the kernels only the encoders (ALBERT, BERT) use,
 * beside the GPT's in cuda_layers.h: the embedding with segments, the
 * exact (erf) GELU, the heads' row gathers, the pooler's tanh, and the
 * MLM logits' bias and arg-max.  Each launches on stream s and returns
 * without waiting.  Reductions run in an order fixed by the shape (no
 * atomics): the same bits on every run. */
#ifndef COTRAIN_CUDA_ENCODER_LAYERS_H
#define COTRAIN_CUDA_ENCODER_LAYERS_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* out[b, t, :] = (word[ids] + type[segs]) + pos[t] (pos NULL: no position
 * row, the relative encodings), rows of width E (kernels/embedding.c) */
void cu_embedding_seg_fwd(cudaStream_t s, float *out, const int32_t *ids, const int32_t *segs,
                          const float *word, const float *pos, const float *type, int B, int T, int E);

/* floats of scratch cu_embedding_type_bwd needs for BT rows of width E and
 * TV segment types */
size_t cu_embedding_type_scratch(int BT, int E, int TV);
/* dtype[v, :] += the sum of dout's rows whose segment is v, in row order
 * by chunks of rows */
void cu_embedding_type_bwd(cudaStream_t s, float *dtype, const float *dout, const int32_t *segs, int BT,
                           int E, int TV, float *scratch);

/* BERT's exact GELU, 0.5 x (1 + erf(x / sqrt 2)): pre[rows, N] += bias,
 * out = gelu(pre) (out in fp32, out16 in bf16: either may be NULL) */
void cu_bias_gelu_erf_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *pre, const float *bias,
                          int rows, int N);
/* dinp = dout * gelu'(inp) (the exact form), and in bf16 into dinp16 (may
 * be NULL) */
void cu_gelu_erf_bwd(cudaStream_t s, float *dinp, __nv_bfloat16 *dinp16, const float *inp, const float *dout,
                     long n);

/* dst[i, :] = src[rows[i], :] for i < n, rows of width w; dst16 (may be
 * NULL) gets them in bf16 */
void cu_gather_rows(cudaStream_t s, float *dst, __nv_bfloat16 *dst16, const float *src, const int32_t *rows,
                    int n, int w);
/* dst[rows[i], :] = src[i, :] (rows distinct) */
void cu_scatter_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int w);
/* dst[b, :] = src[b * T, :] (each sample's first row, the [CLS] one) */
void cu_first_rows(cudaStream_t s, float *dst, const float *src, int B, int T, int w);
/* dst[b * T, :] += src[b, :] */
void cu_first_rows_add(cudaStream_t s, float *dst, const float *src, int B, int T, int w);

/* x = tanh(x) in place (the pooler) */
void cu_tanh(cudaStream_t s, float *x, long n);
/* d *= 1 - y^2 (tanh's backward from its output y) */
void cu_tanh_bwd(cudaStream_t s, float *d, const float *y, long n);

/* out[n, j] = bias[j] for j < V, 0 for V <= j < ld: N rows ld apart (the
 * logits before their product adds into them) */
void cu_rows_bias_ld(cudaStream_t s, float *out, const float *bias, int N, int V, int ld);
/* out[n] = the first index of the largest of logits[n, 0 .. V) (rows ld
 * apart) */
void cu_argmax_rows(cudaStream_t s, int32_t *out, const float *logits, int N, int V, int ld);

#endif
