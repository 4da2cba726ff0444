/* cotrain CUDA backend: multi-head attention, causal (the GPT) or over
 * every key (the encoders), fused in the manner of FlashAttention-2 (Dao,
 * 2023), for bf16 mode.
 *
 * No [T, T] matrix reaches device memory: each block of 128 queries walks
 * the tiles of 64 keys at or before it (causal; else every tile), keeping
 * a running maximum and sum of its rows' exponentials (the online
 * softmax), and the backward recomputes the
 * probabilities from the logsumexp the forward saved.  Products run on the
 * tensor cores (mma.sync m16n8k16: bf16 operands, fp32 accumulation); q, k,
 * v, the probabilities and the gradient's dO and dS are bf16 as operands,
 * everything else fp32.  The backward is two kernels (dK and dV by key
 * block, dQ by query block), so every output element is written by one
 * thread in an order fixed by the shape: no atomics, the same bits on every
 * run.
 *
 * Shapes it takes: head size 64, T a multiple of 128 (GPT-2 small, the
 * sahaj shape, the demo model); cu_flash_fits says so, and the materialised
 * path in cuda_layers.cu computes the rest. */
#ifndef COTRAIN_CUDA_FLASH_H
#define COTRAIN_CUDA_FLASH_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* whether the fused kernels take this shape in this precision */
bool cu_flash_fits(int precision, int T, int C, int NH);

/* out [B,T,C] (fp32, and in bf16 into out16 unless NULL) = the attention
 * of q, k, v in qkvp (bf16, each [B,NH,T,64], as cu_qkv_split16 leaves
 * them); lse [B*NH*T] gets each query row's logsumexp of its scaled scores,
 * in base 2 (what the backward reads). */
void cu_flash_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *lse, const __nv_bfloat16 *qkvp,
                  int B, int T, int C, int NH, bool causal);

/* dqkv [B,T,3C] (set, fp32) from dout [B,T,C] and the forward's out, qkvp
 * and lse; scratch: D [B*NH*T] floats and dO16 [B*T*C] bf16. */
void cu_flash_bwd(cudaStream_t s, float *dqkv, const float *dout, const float *out, const __nv_bfloat16 *qkvp,
                  const float *lse, float *D, __nv_bfloat16 *dO16, int B, int T, int C, int NH, bool causal);

#endif
