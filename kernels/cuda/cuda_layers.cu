/* cotrain CUDA backend: the layers' kernels.  See cuda_layers.h. */
#include "kernels/cuda/cuda_layers.h"

#include "kernels/gpu_abi.h"

#include <cublas_v2.h>

#define GELU_BETA 0.7978845608028654f /* sqrt(2/pi), as kernels/gelu.c */
#define GELU_KAPPA 0.044715f

static inline int blocks_for(long n, int threads)
{
	long b = (n + threads - 1) / threads;
	return (int)(b < 65535L * 32 ? b : 65535L * 32);
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* A block-wide sum or max (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result.  sh holds 32 floats. */
template <bool MAX> __device__ float block_reduce(float v, float *sh)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = MAX ? warp_max(v) : warp_sum(v);
	__syncthreads(); /* sh may still be read by a previous reduction */
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	float r = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.0f);
	return MAX ? warp_max(r) : warp_sum(r);
}

__global__ void to_bf16_k(__nv_bfloat16 *dst, const float *src, long n)
{
	long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x, n4 = n / 4;
	for (long i = tid; i < n4; i += stride) {
		float4 v = ((const float4 *)src)[i];
		((__nv_bfloat162 *)dst)[2 * i] = __floats2bfloat162_rn(v.x, v.y);
		((__nv_bfloat162 *)dst)[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
	}
	for (long i = n4 * 4 + tid; i < n; i += stride)
		dst[i] = __float2bfloat16_rn(src[i]);
}

/* elements an operand of rows x cols (leading dimension ld) spans, over a
 * batch of stride st */
static long extent(int rows, int cols, int ld, long st, int batch)
{
	return (batch > 1 ? (long)(batch - 1) * st : 0) + (long)(rows - 1) * ld + cols;
}

cublasStatus_t cu_gemm(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, long sa, const float *B, int ldb, long sb, float beta, float *C, int ldc, long sc,
                       int batch)
{
	/* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	const void *a = A, *b = B;
	cudaDataType_t type = CUDA_R_32F;
	cublasComputeType_t ct = x->precision == KERN_PREC_BF16   ? CUBLAS_COMPUTE_32F_FAST_16BF
	                         : x->precision == KERN_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
	                                                          : CUBLAS_COMPUTE_32F_PEDANTIC;
	long na = extent(ta ? K : M, ta ? M : K, lda, sa, batch), nb = extent(tb ? N : K, tb ? K : N, ldb, sb, batch);
	/* bf16: round the operands into the scratch (float4 loads: 16-byte
	 * aligned operands), then a bf16 product with fp32 accumulation */
	if (x->precision == KERN_PREC_BF16 && x->a16 && (size_t)na <= x->cap && (size_t)nb <= x->cap &&
	    (uintptr_t)A % 16 == 0 && (uintptr_t)B % 16 == 0) {
		to_bf16_k<<<blocks_for((na + 3) / 4, 256), 256, 0, x->s>>>(x->a16, A, na);
		to_bf16_k<<<blocks_for((nb + 3) / 4, 256), 256, 0, x->s>>>(x->b16, B, nb);
		a = x->a16;
		b = x->b16;
		type = CUDA_R_16BF;
		ct = CUBLAS_COMPUTE_32F;
	}
	if (batch <= 1)
		return cublasGemmEx(x->h, ob, oa, N, M, K, &alpha, b, type, ldb, a, type, lda, &beta, C, CUDA_R_32F, ldc,
		                    ct, CUBLAS_GEMM_DEFAULT);
	return cublasGemmStridedBatchedEx(x->h, ob, oa, N, M, K, &alpha, b, type, ldb, sb, a, type, lda, sa, &beta, C,
	                                  CUDA_R_32F, ldc, sc, batch, ct, CUBLAS_GEMM_DEFAULT);
}
cublasStatus_t cu_gemm_a16(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha,
                           const __nv_bfloat16 *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	long nb = extent(tb ? N : K, tb ? K : N, ldb, 0, 1);
	if (!x->b16 || (size_t)nb > x->cap || (uintptr_t)B % 16)
		return CUBLAS_STATUS_INVALID_VALUE;
	to_bf16_k<<<blocks_for((nb + 3) / 4, 256), 256, 0, x->s>>>(x->b16, B, nb);
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	return cublasGemmEx(x->h, ob, oa, N, M, K, &alpha, x->b16, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
	                    CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

__global__ void rows_bias_k(float *out, const float *res, const float *bias, long n, int C)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
		out[i] = (res ? res[i] : 0.0f) + (bias ? bias[i % C] : 0.0f);
}

void cu_rows_bias(cudaStream_t s, float *out, const float *res, const float *bias, int N, int C)
{
	long n = (long)N * C;
	rows_bias_k<<<blocks_for(n, 256), 256, 0, s>>>(out, res, bias, n, C);
}

/* one warp per row, two passes as the CPU (mean, then the centred squares) */
__global__ void layernorm_fwd_k(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int N, int C, float eps)
{
	int row = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= N)
		return;
	const float *x = inp + (size_t)row * C;
	float sum = 0.0f;
	for (int i = lane; i < C; i += 32)
		sum += x[i];
	float m = warp_sum(sum) / C;
	float v = 0.0f;
	for (int i = lane; i < C; i += 32) {
		float d = x[i] - m;
		v += d * d;
	}
	float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
	float *o = out + (size_t)row * C;
	for (int i = lane; i < C; i += 32)
		o[i] = (x[i] - m) * r * w[i] + b[i];
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = r;
	}
}

void cu_layernorm_fwd(cudaStream_t s, float *out, float *mean, float *rstd, const float *inp, const float *w,
                      const float *b, int N, int C, float eps)
{
	layernorm_fwd_k<<<blocks_for((long)N * 32, 256), 256, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
}

/* dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), added */
__global__ void layernorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *w,
                                const float *mean, const float *rstd, int N, int C)
{
	int row = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= N)
		return;
	const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
	float m = mean[row], r = rstd[row], s1 = 0.0f, s2 = 0.0f;
	for (int i = lane; i < C; i += 32) {
		float dn = dy[i] * w[i];
		s1 += dn;
		s2 += dn * (x[i] - m) * r;
	}
	float md = warp_sum(s1) / C, mdx = warp_sum(s2) / C;
	float *dx = dinp + (size_t)row * C;
	for (int i = lane; i < C; i += 32) {
		float xh = (x[i] - m) * r;
		dx[i] += r * (dy[i] * w[i] - md - xh * mdx);
	}
}

enum { COLSUM_CHUNK = 256, COLSUM_TX = 32, COLSUM_TY = 8 };

static int colsum_chunks(int N) { return (N + COLSUM_CHUNK - 1) / COLSUM_CHUNK; }

size_t cu_colsum_scratch(int N, int C) { return 2 * (size_t)colsum_chunks(N) * C; }

/* Partial column sums over one chunk of rows, in a fixed order: thread
 * (x, y) sums rows y, y + 8, ... of column x; then row 0 of the block adds
 * the 8 in order.  LN also sums a * xhat (LayerNorm's weight gradient)
 * into the second half of part. */
template <bool LN>
__global__ void colsum_partial_k(float *part, const float *a, const float *x, const float *mean, const float *rstd,
                                 int N, int C)
{
	__shared__ float sh[2][COLSUM_TY][COLSUM_TX + 1];
	int j = blockIdx.x * COLSUM_TX + threadIdx.x, r0 = blockIdx.y * COLSUM_CHUNK;
	int r1 = min(N, r0 + COLSUM_CHUNK);
	float acc = 0.0f, accx = 0.0f;
	if (j < C)
		for (int r = r0 + threadIdx.y; r < r1; r += COLSUM_TY) {
			float v = a[(size_t)r * C + j];
			acc += v;
			if (LN)
				accx += v * (x[(size_t)r * C + j] - mean[r]) * rstd[r];
		}
	sh[0][threadIdx.y][threadIdx.x] = acc;
	sh[1][threadIdx.y][threadIdx.x] = accx;
	__syncthreads();
	if (threadIdx.y == 0 && j < C) {
		float s = 0.0f, sx = 0.0f;
		for (int y = 0; y < COLSUM_TY; y++) {
			s += sh[0][y][threadIdx.x];
			sx += sh[1][y][threadIdx.x];
		}
		part[(size_t)blockIdx.y * C + j] = s;
		if (LN)
			part[((size_t)gridDim.y + blockIdx.y) * C + j] = sx;
	}
}

/* out[j] += the chunks' partials in chunk order (outx likewise, LN) */
__global__ void colsum_final_k(float *out, float *outx, const float *part, int nchunks, int C)
{
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= C)
		return;
	float s = 0.0f, sx = 0.0f;
	for (int k = 0; k < nchunks; k++) {
		s += part[(size_t)k * C + j];
		if (outx)
			sx += part[((size_t)nchunks + k) * C + j];
	}
	out[j] += s;
	if (outx)
		outx[j] += sx;
}

void cu_colsum_add(cudaStream_t s, float *out, const float *a, int N, int C, float *scratch)
{
	int nch = colsum_chunks(N);
	dim3 grid((C + COLSUM_TX - 1) / COLSUM_TX, nch), block(COLSUM_TX, COLSUM_TY);
	colsum_partial_k<false><<<grid, block, 0, s>>>(scratch, a, NULL, NULL, NULL, N, C);
	colsum_final_k<<<(C + 255) / 256, 256, 0, s>>>(out, NULL, scratch, nch, C);
}

void cu_layernorm_bwd(cudaStream_t s, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, const float *mean, const float *rstd, int N, int C, float *scratch)
{
	layernorm_bwd_k<<<blocks_for((long)N * 32, 256), 256, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
	int nch = colsum_chunks(N);
	dim3 grid((C + COLSUM_TX - 1) / COLSUM_TX, nch), block(COLSUM_TX, COLSUM_TY);
	colsum_partial_k<true><<<grid, block, 0, s>>>(scratch, dout, inp, mean, rstd, N, C);
	colsum_final_k<<<(C + 255) / 256, 256, 0, s>>>(db, dw, scratch, nch, C);
}

__global__ void gelu_fwd_k(float *out, const float *inp, long n)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float x = inp[i];
		out[i] = 0.5f * x * (1.0f + tanhf(GELU_BETA * (x + GELU_KAPPA * x * x * x)));
	}
}

__global__ void gelu_bwd_k(float *dinp, const float *inp, const float *dout, long n)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float x = inp[i], x2 = x * x;
		float t = tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
		float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
		dinp[i] = dout[i] * d;
	}
}

/* pre[i] += bias[i % N]; out[i] = gelu(pre[i]) */
__global__ void bias_gelu_k(float *out, float *pre, const float *bias, long n, int N)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float x = pre[i] + bias[i % N];
		pre[i] = x;
		out[i] = 0.5f * x * (1.0f + tanhf(GELU_BETA * (x + GELU_KAPPA * x * x * x)));
	}
}

void cu_bias_gelu_fwd(cudaStream_t s, float *out, float *pre, const float *bias, int rows, int N)
{
	long n = (long)rows * N;
	bias_gelu_k<<<blocks_for(n, 256), 256, 0, s>>>(out, pre, bias, n, N);
}

void cu_gelu_fwd(cudaStream_t s, float *out, const float *inp, long n)
{
	gelu_fwd_k<<<blocks_for(n, 256), 256, 0, s>>>(out, inp, n);
}

void cu_gelu_bwd(cudaStream_t s, float *dinp, const float *inp, const float *dout, long n)
{
	gelu_bwd_k<<<blocks_for(n, 256), 256, 0, s>>>(dinp, inp, dout, n);
}

/* Element conversions for the attention's storage type (fp32, or bf16 in
 * bf16 mode): loads and stores through fp32. */
__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* index i of [B,T,3C] (c3 = which * C + h * hd + d) <-> [which][B][NH][T][hd] */
__device__ __forceinline__ long qkv_perm(long i, int T, int C, int NH, long BTC)
{
	int C3 = 3 * C, hd = C / NH;
	long bt = i / C3;
	int c3 = (int)(i % C3), which = c3 / C, h = (c3 % C) / hd, d = c3 % hd;
	long b = bt / T, t = bt % T;
	return which * BTC + ((b * NH + h) * T + t) * hd + d;
}

/* split: dst[perm(i)] = src[i] + bias[i % 3C] (bias may be NULL);
 * merge: dst[i] = src[perm(i)] */
template <bool MERGE, typename D, typename S>
__global__ void qkv_perm_k(D *dst, const S *src, const float *bias, int B, int T, int C, int NH)
{
	long n = (long)B * T * 3 * C, BTC = (long)B * T * C;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		long p = qkv_perm(i, T, C, NH, BTC);
		if (MERGE)
			st(dst + i, ld(src + p));
		else
			st(dst + p, ld(src + i) + (bias ? bias[i % (3 * C)] : 0.0f));
	}
}

/* i over [B,T,C] (c = h * hd + d) <-> [B][NH][T][hd] */
template <bool MERGE, typename D, typename S>
__global__ void heads_perm_k(D *dst, const S *src, int B, int T, int C, int NH)
{
	long n = (long)B * T * C;
	int hd = C / NH;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		long bt = i / C, b = bt / T, t = bt % T;
		int c = (int)(i % C), h = c / hd, d = c % hd;
		long p = ((b * NH + h) * T + t) * hd + d;
		if (MERGE)
			st(dst + i, ld(src + p));
		else
			st(dst + p, ld(src + i));
	}
}

/* one warp per row of scores: softmax of the first r % T + 1, zeros past */
template <typename A> __global__ void softmax_causal_k(A *att, long rows, int T)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	A *p = att + row * T;
	int n = (int)(row % T) + 1;
	float mx = -INFINITY;
	for (int j = lane; j < n; j += 32)
		mx = fmaxf(mx, ld(p + j));
	mx = warp_max(mx);
	float sum = 0.0f;
	for (int j = lane; j < n; j += 32)
		sum += expf(ld(p + j) - mx);
	float inv = 1.0f / warp_sum(sum);
	for (int j = lane; j < T; j += 32)
		st(p + j, j < n ? expf(ld(p + j) - mx) * inv : 0.0f);
}

/* dP -> dS = scale * P * (dP - sum P dP), zeros past the mask, in place */
template <typename A> __global__ void softmax_causal_bwd_k(A *datt, const A *att, long rows, int T, float scale)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	A *d = datt + row * T;
	const A *p = att + row * T;
	int n = (int)(row % T) + 1;
	float dot = 0.0f;
	for (int j = lane; j < n; j += 32)
		dot += ld(p + j) * ld(d + j);
	dot = warp_sum(dot);
	for (int j = lane; j < T; j += 32)
		st(d + j, j < n ? scale * ld(p + j) * (ld(d + j) - dot) : 0.0f);
}

static cublasStatus_t gemm_typed(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha,
                                 const void *A, int lda, long sa, const void *B, int ldb, long sb, float beta,
                                 void *C, cudaDataType_t ctype, int ldc, long sc, int batch)
{
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	return cublasGemmStridedBatchedEx(x->h, ob, oa, N, M, K, &alpha, B, CUDA_R_16BF, ldb, sb, A, CUDA_R_16BF, lda,
	                                  sa, &beta, C, ctype, ldc, sc, batch, CUBLAS_COMPUTE_32F,
	                                  CUBLAS_GEMM_DEFAULT);
}

size_t cu_att_elem(int precision) { return precision == KERN_PREC_BF16 ? 2 : 4; }

#define TRY_BLAS(call) \
	do { \
		cublasStatus_t s_ = (call); \
		if (s_ != CUBLAS_STATUS_SUCCESS) \
			return s_; \
	} while (0)

cublasStatus_t cu_attention_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                const float *qkv, const float *bias, int B, int T, int C, int NH)
{
	int hd = C / NH, BH = B * NH;
	long sq = (long)T * hd, sa = (long)T * T, BTC = (long)B * T * C, rows = (long)BH * T;
	float scale = 1.0f / sqrtf((float)hd);
	int gq = blocks_for(3 * BTC, 256), gs = (int)((rows * 32 + 255) / 256);
	cudaStream_t s = x->s;
	if (x->precision == KERN_PREC_BF16) {
		/* q, k, v and the probabilities stored in bf16: the products read
		 * them as they are, and the [T, T] traffic halves */
		__nv_bfloat16 *q = (__nv_bfloat16 *)qkvp, *k = q + BTC, *v = q + 2 * BTC, *p = (__nv_bfloat16 *)att;
		qkv_perm_k<false><<<gq, 256, 0, s>>>(q, qkv, bias, B, T, C, NH);
		TRY_BLAS(gemm_typed(x, false, true, T, T, hd, scale, q, hd, sq, k, hd, sq, 0.0f, p, CUDA_R_16BF, T, sa,
		                    BH));
		softmax_causal_k<<<gs, 256, 0, s>>>(p, rows, T);
		TRY_BLAS(gemm_typed(x, false, false, T, hd, T, 1.0f, p, T, sa, v, hd, sq, 0.0f, yp, CUDA_R_32F, hd, sq,
		                    BH));
	} else {
		float *q = (float *)qkvp, *k = q + BTC, *v = q + 2 * BTC, *p = (float *)att;
		qkv_perm_k<false><<<gq, 256, 0, s>>>(q, qkv, bias, B, T, C, NH);
		TRY_BLAS(cu_gemm(x, false, true, T, T, hd, scale, q, hd, sq, k, hd, sq, 0.0f, p, T, sa, BH));
		softmax_causal_k<<<gs, 256, 0, s>>>(p, rows, T);
		TRY_BLAS(cu_gemm(x, false, false, T, hd, T, 1.0f, p, T, sa, v, hd, sq, 0.0f, yp, hd, sq, BH));
	}
	heads_perm_k<true><<<blocks_for(BTC, 256), 256, 0, s>>>(out, yp, B, T, C, NH);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cu_attention_bwd(const cu_gemm_ctx *x, float *dqkv, const float *dout, const void *qkvp,
                                const void *att, void *dyp, void *datt, float *dqkvp, int B, int T, int C, int NH)
{
	int hd = C / NH, BH = B * NH;
	long sq = (long)T * hd, sa = (long)T * T, BTC = (long)B * T * C, rows = (long)BH * T;
	float scale = 1.0f / sqrtf((float)hd), *dq = dqkvp, *dk = dqkvp + BTC, *dv = dqkvp + 2 * BTC;
	int gs = (int)((rows * 32 + 255) / 256);
	cudaStream_t s = x->s;
	if (x->precision == KERN_PREC_BF16) {
		const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkvp, *k = q + BTC, *v = q + 2 * BTC,
		                    *p = (const __nv_bfloat16 *)att;
		__nv_bfloat16 *dy = (__nv_bfloat16 *)dyp, *dp = (__nv_bfloat16 *)datt;
		heads_perm_k<false><<<blocks_for(BTC, 256), 256, 0, s>>>(dy, dout, B, T, C, NH);
		TRY_BLAS(gemm_typed(x, false, true, T, T, hd, 1.0f, dy, hd, sq, v, hd, sq, 0.0f, dp, CUDA_R_16BF, T, sa,
		                    BH));
		softmax_causal_bwd_k<<<gs, 256, 0, s>>>(dp, p, rows, T, scale);
		TRY_BLAS(gemm_typed(x, false, false, T, hd, T, 1.0f, dp, T, sa, k, hd, sq, 0.0f, dq, CUDA_R_32F, hd, sq,
		                    BH));
		TRY_BLAS(gemm_typed(x, true, false, T, hd, T, 1.0f, dp, T, sa, q, hd, sq, 0.0f, dk, CUDA_R_32F, hd, sq,
		                    BH));
		TRY_BLAS(gemm_typed(x, true, false, T, hd, T, 1.0f, p, T, sa, dy, hd, sq, 0.0f, dv, CUDA_R_32F, hd, sq,
		                    BH));
	} else {
		const float *q = (const float *)qkvp, *k = q + BTC, *v = q + 2 * BTC, *p = (const float *)att;
		float *dy = (float *)dyp, *dp = (float *)datt;
		heads_perm_k<false><<<blocks_for(BTC, 256), 256, 0, s>>>(dy, dout, B, T, C, NH);
		TRY_BLAS(cu_gemm(x, false, true, T, T, hd, 1.0f, dy, hd, sq, v, hd, sq, 0.0f, dp, T, sa, BH));
		softmax_causal_bwd_k<<<gs, 256, 0, s>>>(dp, p, rows, T, scale);
		TRY_BLAS(cu_gemm(x, false, false, T, hd, T, 1.0f, dp, T, sa, k, hd, sq, 0.0f, dq, hd, sq, BH));
		TRY_BLAS(cu_gemm(x, true, false, T, hd, T, 1.0f, dp, T, sa, q, hd, sq, 0.0f, dk, hd, sq, BH));
		TRY_BLAS(cu_gemm(x, true, false, T, hd, T, 1.0f, p, T, sa, dy, hd, sq, 0.0f, dv, hd, sq, BH));
	}
	qkv_perm_k<true><<<blocks_for(3 * BTC, 256), 256, 0, s>>>(dqkv, dqkvp, (const float *)NULL, B, T, C, NH);
	return CUBLAS_STATUS_SUCCESS;
}

/* one block per row of logits */
__global__ void crossentropy_fwd_k(float *losses, float *lse, const float *logits, const int32_t *targets, int V,
                                   int ld)
{
	__shared__ float sh[32];
	const float *l = logits + (size_t)blockIdx.x * ld;
	/* one pass: each thread keeps its running max and the sum scaled to it */
	float m = -INFINITY, sum = 0.0f;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float v = l[j];
		if (v > m) {
			sum = sum * expf(m - v) + 1.0f;
			m = v;
		} else {
			sum += expf(v - m);
		}
	}
	float mx = block_reduce<true>(m, sh);
	sum = block_reduce<false>(m == -INFINITY ? 0.0f : sum * expf(m - mx), sh);
	if (threadIdx.x == 0) {
		float z = mx + logf(sum);
		lse[blockIdx.x] = z;
		losses[blockIdx.x] = z - l[targets[blockIdx.x]];
	}
}

__global__ void crossentropy_bwd_k(float *logits, const float *lse, const int32_t *targets, int V, int ld,
                                   float scale)
{
	float *l = logits + (size_t)blockIdx.x * ld;
	float z = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		l[j] = scale * (expf(l[j] - z) - (j == tgt ? 1.0f : 0.0f));
}

__global__ void crossentropy_bwd16_k(__nv_bfloat16 *d, const float *logits, const float *lse, const int32_t *targets,
                                     int V, int ld, float scale)
{
	const float *l = logits + (size_t)blockIdx.x * ld;
	__nv_bfloat16 *o = d + (size_t)blockIdx.x * ld;
	float z = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		o[j] = __float2bfloat16_rn(scale * (expf(l[j] - z) - (j == tgt ? 1.0f : 0.0f)));
}

void cu_crossentropy_bwd16(cudaStream_t s, __nv_bfloat16 *dlogits, const float *logits, const float *lse,
                           const int32_t *targets, int N, int V, int ld, float scale)
{
	crossentropy_bwd16_k<<<N, 256, 0, s>>>(dlogits, logits, lse, targets, V, ld, scale);
}

void cu_crossentropy_fwd(cudaStream_t s, float *losses, float *lse, const float *logits, const int32_t *targets,
                         int N, int V, int ld)
{
	crossentropy_fwd_k<<<N, 256, 0, s>>>(losses, lse, logits, targets, V, ld);
}

void cu_crossentropy_bwd(cudaStream_t s, float *logits, const float *lse, const int32_t *targets, int N, int V,
                         int ld, float scale)
{
	crossentropy_bwd_k<<<N, 256, 0, s>>>(logits, lse, targets, V, ld, scale);
}

__global__ void embedding_fwd_k(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T,
                                int C)
{
	long n = (long)B * T * C;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		long bt = i / C;
		int c = (int)(i % C), t = (int)(bt % T);
		out[i] = wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)t * C + c];
	}
}

__global__ void embedding_bwd_wpe_k(float *dwpe, const float *dout, int B, int T, int C)
{
	long n = (long)T * C;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (int b = 0; b < B; b++)
			s += dout[(size_t)b * n + i];
		dwpe[i] += s;
	}
}

/* block i: token uniq[i]'s rows, in position order */
__global__ void embedding_bwd_wte_k(float *dwte, const float *dout, const int32_t *uniq, const int32_t *offs,
                                    const int32_t *pos, int C)
{
	int u = blockIdx.x, p0 = offs[u], p1 = offs[u + 1];
	float *row = dwte + (size_t)uniq[u] * C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float s = 0.0f;
		for (int p = p0; p < p1; p++)
			s += dout[(size_t)pos[p] * C + c];
		row[c] += s;
	}
}

void cu_embedding_fwd(cudaStream_t s, float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                      int T, int C)
{
	embedding_fwd_k<<<blocks_for((long)B * T * C, 256), 256, 0, s>>>(out, tokens, wte, wpe, B, T, C);
}

void cu_embedding_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout, const int32_t *uniq,
                      const int32_t *offs, const int32_t *pos, int n_uniq, int B, int T, int C)
{
	embedding_bwd_wpe_k<<<blocks_for((long)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
	if (n_uniq > 0)
		embedding_bwd_wte_k<<<n_uniq, 256, 0, s>>>(dwte, dout, uniq, offs, pos, C);
}
