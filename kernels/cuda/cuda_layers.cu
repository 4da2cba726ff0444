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

void cu_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, long n)
{
	to_bf16_k<<<blocks_for((n + 3) / 4, 256), 256, 0, s>>>(dst, src, n);
}

cublasStatus_t cu_gemm_bf16(const cu_gemm_ctx *x, bool ta, bool tb, int M, int N, int K, float alpha,
                            const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta, float *C,
                            int ldc)
{
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	return cublasGemmEx(x->h, ob, oa, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
	                    CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

__global__ void rows_bias_k(float *out, const float *res, const float *bias, long n, int C)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
		out[i] = (res ? res[i] : 0.0f) + (bias ? bias[i % C] : 0.0f);
}

/* rows_bias_k on float4s (C a multiple of 4, under 2^31 of them) */
__global__ void rows_bias4_k(float4 *out, const float4 *res, const float4 *bias, int n4, int C4)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
		float4 r = res ? res[i] : make_float4(0, 0, 0, 0), b = bias ? bias[i % C4] : make_float4(0, 0, 0, 0);
		out[i] = make_float4(r.x + b.x, r.y + b.y, r.z + b.z, r.w + b.w);
	}
}

/* whether float4 kernels may take these pointers */
static bool aligned16(const void *a, const void *b = NULL, const void *c = NULL)
{
	return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

void cu_rows_bias(cudaStream_t s, float *out, const float *res, const float *bias, int N, int C)
{
	long n = (long)N * C;
	if (C % 4 == 0 && n / 4 < (1L << 31) && aligned16(out, res, bias))
		rows_bias4_k<<<blocks_for(n / 4, 256), 256, 0, s>>>((float4 *)out, (const float4 *)res,
		                                                     (const float4 *)bias, (int)(n / 4), C / 4);
	else
		rows_bias_k<<<blocks_for(n, 256), 256, 0, s>>>(out, res, bias, n, C);
}

/* one warp per row, two passes as the CPU (mean, then the centred squares) */
__global__ void layernorm_fwd_k(float *out, __nv_bfloat16 *out16, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int N, int C, float eps)
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
	for (int i = lane; i < C; i += 32) {
		float y = (x[i] - m) * r * w[i] + b[i];
		if (out)
			out[(size_t)row * C + i] = y;
		if (out16)
			out16[(size_t)row * C + i] = __float2bfloat16_rn(y);
	}
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = r;
	}
}

/* Four bf16 from four floats, stored in 8 bytes */
__device__ __forceinline__ void st_bf16x4(__nv_bfloat16 *p, float4 v)
{
	__nv_bfloat162 o[2] = { __floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w) };
	*(uint2 *)p = *(uint2 *)o;
}

/* layernorm_fwd_k with the row held in registers: C = 128 NV, each lane
 * NV float4s */
template <int NV>
__global__ void layernorm_fwd4_k(float *out, __nv_bfloat16 *out16, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int N, float eps)
{
	const int C = 128 * NV;
	int row = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= N)
		return;
	const float4 *x = (const float4 *)(inp + (size_t)row * C);
	float4 v[NV];
	float sum = 0.0f;
#pragma unroll
	for (int k = 0; k < NV; k++) {
		v[k] = x[lane + 32 * k];
		sum += (v[k].x + v[k].y) + (v[k].z + v[k].w);
	}
	float m = warp_sum(sum) / C, var = 0.0f;
#pragma unroll
	for (int k = 0; k < NV; k++) {
		float a = v[k].x - m, bb = v[k].y - m, c = v[k].z - m, d = v[k].w - m;
		var += (a * a + bb * bb) + (c * c + d * d);
	}
	float r = 1.0f / sqrtf(warp_sum(var) / C + eps);
#pragma unroll
	for (int k = 0; k < NV; k++) {
		int i = lane + 32 * k;
		float4 w4 = ((const float4 *)w)[i], b4 = ((const float4 *)b)[i];
		float4 y = make_float4((v[k].x - m) * r * w4.x + b4.x, (v[k].y - m) * r * w4.y + b4.y,
		                       (v[k].z - m) * r * w4.z + b4.z, (v[k].w - m) * r * w4.w + b4.w);
		if (out)
			((float4 *)(out + (size_t)row * C))[i] = y;
		if (out16)
			st_bf16x4(out16 + (size_t)row * C + 4 * i, y);
	}
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = r;
	}
}

void cu_layernorm_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *mean, float *rstd, const float *inp,
                      const float *w, const float *b, int N, int C, float eps)
{
	int g = blocks_for((long)N * 32, 256);
	if (aligned16(out, out16, inp) && aligned16(w, b)) {
		switch (C) {
		case 256:
			layernorm_fwd4_k<2><<<g, 256, 0, s>>>(out, out16, mean, rstd, inp, w, b, N, eps);
			return;
		case 512:
			layernorm_fwd4_k<4><<<g, 256, 0, s>>>(out, out16, mean, rstd, inp, w, b, N, eps);
			return;
		case 768:
			layernorm_fwd4_k<6><<<g, 256, 0, s>>>(out, out16, mean, rstd, inp, w, b, N, eps);
			return;
		case 1024:
			layernorm_fwd4_k<8><<<g, 256, 0, s>>>(out, out16, mean, rstd, inp, w, b, N, eps);
			return;
		}
	}
	layernorm_fwd_k<<<g, 256, 0, s>>>(out, out16, mean, rstd, inp, w, b, N, C, eps);
}

/* dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), added */
__global__ void layernorm_bwd_k(float *dinp, __nv_bfloat16 *dinp16, const float *dout, const float *inp,
                                const float *w, const float *mean, const float *rstd, int N, int C)
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
		float d = dx[i] + r * (dy[i] * w[i] - md - xh * mdx);
		dx[i] = d;
		if (dinp16)
			dinp16[(size_t)row * C + i] = __float2bfloat16_rn(d);
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

/* layernorm_bwd_k with the row's x and dy held in registers (C = 128 NV) */
template <int NV>
__global__ void layernorm_bwd4_k(float *dinp, __nv_bfloat16 *dinp16, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int N)
{
	const int C = 128 * NV;
	int row = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= N)
		return;
	const float4 *x4 = (const float4 *)(inp + (size_t)row * C), *dy4 = (const float4 *)(dout + (size_t)row * C),
	             *w4 = (const float4 *)w;
	float m = mean[row], r = rstd[row], s1 = 0.0f, s2 = 0.0f;
	float4 xh[NV], dn[NV];
#pragma unroll
	for (int k = 0; k < NV; k++) {
		int i = lane + 32 * k;
		float4 x = x4[i], dy = dy4[i], ww = w4[i];
		xh[k] = make_float4((x.x - m) * r, (x.y - m) * r, (x.z - m) * r, (x.w - m) * r);
		dn[k] = make_float4(dy.x * ww.x, dy.y * ww.y, dy.z * ww.z, dy.w * ww.w);
		s1 += (dn[k].x + dn[k].y) + (dn[k].z + dn[k].w);
		s2 += (dn[k].x * xh[k].x + dn[k].y * xh[k].y) + (dn[k].z * xh[k].z + dn[k].w * xh[k].w);
	}
	float md = warp_sum(s1) / C, mdx = warp_sum(s2) / C;
	float4 *dx4 = (float4 *)(dinp + (size_t)row * C);
#pragma unroll
	for (int k = 0; k < NV; k++) {
		int i = lane + 32 * k;
		float4 d = dx4[i];
		d.x += r * (dn[k].x - md - xh[k].x * mdx);
		d.y += r * (dn[k].y - md - xh[k].y * mdx);
		d.z += r * (dn[k].z - md - xh[k].z * mdx);
		d.w += r * (dn[k].w - md - xh[k].w * mdx);
		dx4[i] = d;
		if (dinp16)
			st_bf16x4(dinp16 + (size_t)row * C + 4 * i, d);
	}
}

void cu_layernorm_bwd(cudaStream_t s, float *dinp, __nv_bfloat16 *dinp16, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, const float *mean, const float *rstd, int N, int C,
                      float *scratch)
{
	int g = blocks_for((long)N * 32, 256);
	bool v4 = aligned16(dinp, dinp16, dout) && aligned16(inp, w);
	if (v4 && C == 256)
		layernorm_bwd4_k<2><<<g, 256, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N);
	else if (v4 && C == 512)
		layernorm_bwd4_k<4><<<g, 256, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N);
	else if (v4 && C == 768)
		layernorm_bwd4_k<6><<<g, 256, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N);
	else if (v4 && C == 1024)
		layernorm_bwd4_k<8><<<g, 256, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N);
	else
		layernorm_bwd_k<<<g, 256, 0, s>>>(dinp, dinp16, dout, inp, w, mean, rstd, N, C);
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

__global__ void gelu_bwd_k(float *dinp, __nv_bfloat16 *dinp16, const float *inp, const float *dout, long n)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float x = inp[i], x2 = x * x;
		float t = tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
		float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
		dinp[i] = dout[i] * d;
		if (dinp16)
			dinp16[i] = __float2bfloat16_rn(dout[i] * d);
	}
}

/* pre[i] += bias[i % N]; out[i] = gelu(pre[i]) (in fp32 and or bf16) */
__global__ void bias_gelu_k(float *out, __nv_bfloat16 *out16, float *pre, const float *bias, long n, int N)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		float x = pre[i] + bias[i % N];
		pre[i] = x;
		float y = 0.5f * x * (1.0f + tanhf(GELU_BETA * (x + GELU_KAPPA * x * x * x)));
		if (out)
			out[i] = y;
		if (out16)
			out16[i] = __float2bfloat16_rn(y);
	}
}

__device__ __forceinline__ float gelu(float x)
{
	return 0.5f * x * (1.0f + tanhf(GELU_BETA * (x + GELU_KAPPA * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x)
{
	float x2 = x * x, t = tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
}

/* bias_gelu_k on float4s (N a multiple of 4, under 2^31 of them) */
__global__ void bias_gelu4_k(float4 *out, __nv_bfloat16 *out16, float4 *pre, const float4 *bias, int n4, int N4)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
		float4 x = pre[i], b = bias[i % N4];
		x = make_float4(x.x + b.x, x.y + b.y, x.z + b.z, x.w + b.w);
		pre[i] = x;
		float4 y = make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
		if (out)
			out[i] = y;
		if (out16)
			st_bf16x4(out16 + 4L * i, y);
	}
}

/* gelu_bwd_k on float4s */
__global__ void gelu_bwd4_k(float4 *dinp, __nv_bfloat16 *dinp16, const float4 *inp, const float4 *dout, int n4)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
		float4 x = inp[i], dy = dout[i];
		float4 d = make_float4(dy.x * gelu_grad(x.x), dy.y * gelu_grad(x.y), dy.z * gelu_grad(x.z),
		                       dy.w * gelu_grad(x.w));
		dinp[i] = d;
		if (dinp16)
			st_bf16x4(dinp16 + 4L * i, d);
	}
}

void cu_bias_gelu_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *pre, const float *bias, int rows,
                      int N)
{
	long n = (long)rows * N;
	if (N % 4 == 0 && n / 4 < (1L << 31) && aligned16(out, out16, pre) && aligned16(bias))
		bias_gelu4_k<<<blocks_for(n / 4, 256), 256, 0, s>>>((float4 *)out, out16, (float4 *)pre,
		                                                     (const float4 *)bias, (int)(n / 4), N / 4);
	else
		bias_gelu_k<<<blocks_for(n, 256), 256, 0, s>>>(out, out16, pre, bias, n, N);
}

void cu_gelu_fwd(cudaStream_t s, float *out, const float *inp, long n)
{
	gelu_fwd_k<<<blocks_for(n, 256), 256, 0, s>>>(out, inp, n);
}

void cu_gelu_bwd(cudaStream_t s, float *dinp, __nv_bfloat16 *dinp16, const float *inp, const float *dout, long n)
{
	if (n % 4 == 0 && n / 4 < (1L << 31) && aligned16(dinp, dinp16, inp) && aligned16(dout))
		gelu_bwd4_k<<<blocks_for(n / 4, 256), 256, 0, s>>>((float4 *)dinp, dinp16, (const float4 *)inp,
		                                                    (const float4 *)dout, (int)(n / 4));
	else
		gelu_bwd_k<<<blocks_for(n, 256), 256, 0, s>>>(dinp, dinp16, inp, dout, n);
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

/* one warp per row of scores: softmax of the first r % T + 1 (causal; else
 * of all T), zeros past */
template <typename A> __global__ void softmax_k(A *att, long rows, int T, bool causal)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	A *p = att + row * T;
	int n = causal ? (int)(row % T) + 1 : T;
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
template <typename A>
__global__ void softmax_bwd_k(A *datt, const A *att, long rows, int T, float scale, bool causal)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	A *d = datt + row * T;
	const A *p = att + row * T;
	int n = causal ? (int)(row % T) + 1 : T;
	float dot = 0.0f;
	for (int j = lane; j < n; j += 32)
		dot += ld(p + j) * ld(d + j);
	dot = warp_sum(dot);
	for (int j = lane; j < T; j += 32)
		st(d + j, j < n ? scale * ld(p + j) * (ld(d + j) - dot) : 0.0f);
}

/* qkv_perm_k's split into bf16, eight elements of a head's row a thread
 * (hd a multiple of 8, under 2^31 groups of eight: index arithmetic in 32
 * bits, 16-byte stores) */
__global__ void qkv_split16_k(__nv_bfloat16 *dst, const float *src, const float *bias, int BT, int T, int C, int NH)
{
	int per_row = 3 * C / 8, hd = C / NH, n8 = BT * per_row;
	long BTC = (long)BT * C;
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n8; j += gridDim.x * blockDim.x) {
		int bt = j / per_row, c3 = (j - bt * per_row) * 8, which = c3 / C, c = c3 - which * C, h = c / hd,
		    d = c - h * hd, b = bt / T, t = bt - b * T;
		const float4 *p = (const float4 *)(src + (long)bt * 3 * C + c3);
		float4 v0 = p[0], v1 = p[1];
		if (bias) {
			const float4 *q = (const float4 *)(bias + c3);
			float4 b0 = q[0], b1 = q[1];
			v0 = make_float4(v0.x + b0.x, v0.y + b0.y, v0.z + b0.z, v0.w + b0.w);
			v1 = make_float4(v1.x + b1.x, v1.y + b1.y, v1.z + b1.z, v1.w + b1.w);
		}
		__nv_bfloat162 o[4] = { __floats2bfloat162_rn(v0.x, v0.y), __floats2bfloat162_rn(v0.z, v0.w),
			                __floats2bfloat162_rn(v1.x, v1.y), __floats2bfloat162_rn(v1.z, v1.w) };
		*(uint4 *)(dst + which * BTC + (((long)b * NH + h) * T + t) * hd + d) = *(uint4 *)o;
	}
}

void cu_qkv_split16(cudaStream_t s, __nv_bfloat16 *qkvp, const float *qkv, const float *bias, int B, int T, int C,
                    int NH)
{
	long n8 = (long)B * T * 3 * C / 8;
	if ((C / NH) % 8 == 0 && n8 < (1L << 31) && (uintptr_t)qkv % 16 == 0 && (uintptr_t)bias % 16 == 0)
		qkv_split16_k<<<blocks_for(n8, 256), 256, 0, s>>>(qkvp, qkv, bias, B * T, T, C, NH);
	else
		qkv_perm_k<false><<<blocks_for(3L * B * T * C, 256), 256, 0, s>>>(qkvp, qkv, bias, B, T, C, NH);
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


/* One warp per row of scores (b, h, i): the relative term added,
 * x_j = S[i, j] + rs (qd[i, i-j+T-1] + kd[j, i-j+T-1]) (kd NULL: none),
 * then the softmax of the row over every key. */
template <typename A>
__global__ void softmax_rel_k(A *att, const float *qd, const float *kd, long rows, int T, float rs)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31, R = 2 * T - 1;
	if (row >= rows)
		return;
	A *p = att + row * T;
	int i = (int)(row % T);
	long key0 = row - i; /* the row of key 0 of this (b, h) */
	const float *q = qd + row * R;
	auto x = [&](int j) {
		int r = i - j + T - 1;
		float rel = q[r] + (kd ? kd[(key0 + j) * R + r] : 0.0f);
		return ld(p + j) + rs * rel;
	};
	float mx = -INFINITY;
	for (int j = lane; j < T; j += 32)
		mx = fmaxf(mx, x(j));
	mx = warp_max(mx);
	float sum = 0.0f;
	for (int j = lane; j < T; j += 32)
		sum += expf(x(j) - mx);
	float inv = 1.0f / warp_sum(sum);
	for (int j = lane; j < T; j += 32)
		st(p + j, expf(x(j) - mx) * inv);
}

/* The relative term's gradient, gathered from dS [B*NH, T, T] (unscaled):
 * by query (KEY false) dq_rel[row = (bh, t), r] = rs dS[bh, t, t-r+T-1],
 * by key (KEY true) dk_rel[(bh, j), r] = rs dS[bh, j+r-T+1, j], zero where
 * the other index falls outside 0..T-1. */
template <bool KEY, typename A, typename D>
__global__ void rel_grad_k(D *out, const A *dS, long BHT, int T, float rs)
{
	int R = 2 * T - 1;
	for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < BHT * R;
	     idx += (long)gridDim.x * blockDim.x) {
		long row = idx / R, base = (row - row % T) * T; /* (bh, 0, 0) */
		int t = (int)(row % T), r = (int)(idx % R);
		int i = KEY ? t + r - T + 1 : t, j = KEY ? t : t - r + T - 1;
		st(out + idx, i >= 0 && i < T && j >= 0 && j < T ? rs * ld(dS + base + (long)i * T + j) : 0.0f);
	}
}


/* The materialised attention's forward, relative terms included where
 * dist is given (over every key then: cu_attention_rel_fwd). */
static cublasStatus_t attention_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                    const float *qkv, const float *bias, int B, int T, int C, int NH, bool causal,
                                    const float *dist, const __nv_bfloat16 *dist16, float *qd, float *kd, float rs)
{
	int hd = C / NH, BH = B * NH, R = 2 * T - 1;
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
		if (dist) { /* q D^T and k D^T over every (b, h, t): [B*NH*T, 2T-1] */
			TRY_BLAS(gemm_typed(x, false, true, (int)rows, R, hd, 1.0f, q, hd, 0, dist16, hd, 0, 0.0f, qd,
			                    CUDA_R_32F, R, 0, 1));
			if (kd)
				TRY_BLAS(gemm_typed(x, false, true, (int)rows, R, hd, 1.0f, k, hd, 0, dist16, hd, 0, 0.0f, kd,
				                    CUDA_R_32F, R, 0, 1));
			softmax_rel_k<<<gs, 256, 0, s>>>(p, qd, kd, rows, T, rs);
		} else {
			softmax_k<<<gs, 256, 0, s>>>(p, rows, T, causal);
		}
		TRY_BLAS(gemm_typed(x, false, false, T, hd, T, 1.0f, p, T, sa, v, hd, sq, 0.0f, yp, CUDA_R_32F, hd, sq,
		                    BH));
	} else {
		float *q = (float *)qkvp, *k = q + BTC, *v = q + 2 * BTC, *p = (float *)att;
		qkv_perm_k<false><<<gq, 256, 0, s>>>(q, qkv, bias, B, T, C, NH);
		TRY_BLAS(cu_gemm(x, false, true, T, T, hd, scale, q, hd, sq, k, hd, sq, 0.0f, p, T, sa, BH));
		if (dist) {
			TRY_BLAS(cu_gemm(x, false, true, (int)rows, R, hd, 1.0f, q, hd, 0, dist, hd, 0, 0.0f, qd, R, 0, 1));
			if (kd)
				TRY_BLAS(cu_gemm(x, false, true, (int)rows, R, hd, 1.0f, k, hd, 0, dist, hd, 0, 0.0f, kd, R, 0,
				                 1));
			softmax_rel_k<<<gs, 256, 0, s>>>(p, qd, kd, rows, T, rs);
		} else {
			softmax_k<<<gs, 256, 0, s>>>(p, rows, T, causal);
		}
		TRY_BLAS(cu_gemm(x, false, false, T, hd, T, 1.0f, p, T, sa, v, hd, sq, 0.0f, yp, hd, sq, BH));
	}
	heads_perm_k<true><<<blocks_for(BTC, 256), 256, 0, s>>>(out, yp, B, T, C, NH);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cu_attention_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                const float *qkv, const float *bias, int B, int T, int C, int NH, bool causal)
{
	return attention_fwd(x, out, att, qkvp, yp, qkv, bias, B, T, C, NH, causal, NULL, NULL, NULL, NULL, 0.0f);
}

cublasStatus_t cu_attention_rel_fwd(const cu_gemm_ctx *x, float *out, void *att, void *qkvp, float *yp,
                                    const float *qkv, const float *bias, const float *dist,
                                    const __nv_bfloat16 *dist16, float *qd, float *kd, int B, int T, int C, int NH,
                                    float rs)
{
	return attention_fwd(x, out, att, qkvp, yp, qkv, bias, B, T, C, NH, false, dist, dist16, qd, kd, rs);
}

/* Its backward.  Without relative terms the softmax's backward folds the
 * score's scale into dS; with them dS stays unscaled (the q . k term takes
 * the scale in its products, the relative one rs), and the relative
 * gradient is gathered from it by distance. */
static cublasStatus_t attention_bwd(const cu_gemm_ctx *x, float *dqkv, const float *dout, const void *qkvp,
                                    const void *att, void *dyp, void *datt, float *dqkvp, int B, int T, int C, int NH,
                                    bool causal, float *ddist, const float *dist, const __nv_bfloat16 *dist16,
                                    void *drel, float rs, bool key_query)
{
	int hd = C / NH, BH = B * NH, R = 2 * T - 1;
	long sq = (long)T * hd, sa = (long)T * T, BTC = (long)B * T * C, rows = (long)BH * T;
	float scale = 1.0f / sqrtf((float)hd), *dq = dqkvp, *dk = dqkvp + BTC, *dv = dqkvp + 2 * BTC;
	float sm_scale = dist ? 1.0f : scale, alpha = dist ? scale : 1.0f;
	int gs = (int)((rows * 32 + 255) / 256), gr = blocks_for(rows * R, 256);
	cudaStream_t s = x->s;
	if (x->precision == KERN_PREC_BF16) {
		const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkvp, *k = q + BTC, *v = q + 2 * BTC,
		                    *p = (const __nv_bfloat16 *)att;
		__nv_bfloat16 *dy = (__nv_bfloat16 *)dyp, *dp = (__nv_bfloat16 *)datt, *dr = (__nv_bfloat16 *)drel;
		heads_perm_k<false><<<blocks_for(BTC, 256), 256, 0, s>>>(dy, dout, B, T, C, NH);
		TRY_BLAS(gemm_typed(x, false, true, T, T, hd, 1.0f, dy, hd, sq, v, hd, sq, 0.0f, dp, CUDA_R_16BF, T, sa,
		                    BH));
		softmax_bwd_k<<<gs, 256, 0, s>>>(dp, p, rows, T, sm_scale, causal);
		TRY_BLAS(gemm_typed(x, false, false, T, hd, T, alpha, dp, T, sa, k, hd, sq, 0.0f, dq, CUDA_R_32F, hd, sq,
		                    BH));
		TRY_BLAS(gemm_typed(x, true, false, T, hd, T, alpha, dp, T, sa, q, hd, sq, 0.0f, dk, CUDA_R_32F, hd, sq,
		                    BH));
		TRY_BLAS(gemm_typed(x, true, false, T, hd, T, 1.0f, p, T, sa, dy, hd, sq, 0.0f, dv, CUDA_R_32F, hd, sq,
		                    BH));
		/* dq += rs dS D by distance, dD += its transpose times q; then k's */
		for (int which = 0; dist && which <= (int)key_query; which++) {
			if (which)
				rel_grad_k<true><<<gr, 256, 0, s>>>(dr, dp, rows, T, rs);
			else
				rel_grad_k<false><<<gr, 256, 0, s>>>(dr, dp, rows, T, rs);
			TRY_BLAS(gemm_typed(x, false, false, (int)rows, hd, R, 1.0f, dr, R, 0, dist16, hd, 0, 1.0f,
			                    which ? dk : dq, CUDA_R_32F, hd, 0, 1));
			TRY_BLAS(gemm_typed(x, true, false, R, hd, (int)rows, 1.0f, dr, R, 0, which ? k : q, hd, 0, 1.0f, ddist,
			                    CUDA_R_32F, hd, 0, 1));
		}
	} else {
		const float *q = (const float *)qkvp, *k = q + BTC, *v = q + 2 * BTC, *p = (const float *)att;
		float *dy = (float *)dyp, *dp = (float *)datt, *dr = (float *)drel;
		heads_perm_k<false><<<blocks_for(BTC, 256), 256, 0, s>>>(dy, dout, B, T, C, NH);
		TRY_BLAS(cu_gemm(x, false, true, T, T, hd, 1.0f, dy, hd, sq, v, hd, sq, 0.0f, dp, T, sa, BH));
		softmax_bwd_k<<<gs, 256, 0, s>>>(dp, p, rows, T, sm_scale, causal);
		TRY_BLAS(cu_gemm(x, false, false, T, hd, T, alpha, dp, T, sa, k, hd, sq, 0.0f, dq, hd, sq, BH));
		TRY_BLAS(cu_gemm(x, true, false, T, hd, T, alpha, dp, T, sa, q, hd, sq, 0.0f, dk, hd, sq, BH));
		TRY_BLAS(cu_gemm(x, true, false, T, hd, T, 1.0f, p, T, sa, dy, hd, sq, 0.0f, dv, hd, sq, BH));
		for (int which = 0; dist && which <= (int)key_query; which++) {
			if (which)
				rel_grad_k<true><<<gr, 256, 0, s>>>(dr, dp, rows, T, rs);
			else
				rel_grad_k<false><<<gr, 256, 0, s>>>(dr, dp, rows, T, rs);
			TRY_BLAS(cu_gemm(x, false, false, (int)rows, hd, R, 1.0f, dr, R, 0, dist, hd, 0, 1.0f, which ? dk : dq,
			                 hd, 0, 1));
			TRY_BLAS(cu_gemm(x, true, false, R, hd, (int)rows, 1.0f, dr, R, 0, which ? k : q, hd, 0, 1.0f, ddist, hd,
			                 0, 1));
		}
	}
	qkv_perm_k<true><<<blocks_for(3 * BTC, 256), 256, 0, s>>>(dqkv, dqkvp, (const float *)NULL, B, T, C, NH);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cu_attention_bwd(const cu_gemm_ctx *x, float *dqkv, const float *dout, const void *qkvp,
                                const void *att, void *dyp, void *datt, float *dqkvp, int B, int T, int C, int NH,
                                bool causal)
{
	return attention_bwd(x, dqkv, dout, qkvp, att, dyp, datt, dqkvp, B, T, C, NH, causal, NULL, NULL, NULL, NULL, 0.0f,
	                     false);
}

cublasStatus_t cu_attention_rel_bwd(const cu_gemm_ctx *x, float *dqkv, float *ddist, const float *dout,
                                    const void *qkvp, const void *att, void *dyp, void *datt, float *dqkvp,
                                    const float *dist, const __nv_bfloat16 *dist16, void *drel, int B, int T, int C,
                                    int NH, float rs, bool key_query)
{
	return attention_bwd(x, dqkv, dout, qkvp, att, dyp, datt, dqkvp, B, T, C, NH, false, ddist, dist, dist16, drel,
	                     rs, key_query);
}

/* one block per row of logits, in one pass: each thread keeps its running
 * max and the sum scaled to it; vec: the first V / 4 * 4 columns read as
 * float4s (ld a multiple of 4, logits 16-byte aligned) */
__global__ void crossentropy_fwd_k(float *losses, float *lse, const float *logits, const int32_t *targets, int V,
                                   int ld, bool vec)
{
	__shared__ float sh[32];
	const float *l = logits + (size_t)blockIdx.x * ld;
	float m = -INFINITY, sum = 0.0f;
	int done = vec ? V / 4 * 4 : 0;
	for (int j = threadIdx.x; j < done / 4; j += blockDim.x) {
		float4 v = ((const float4 *)l)[j];
		float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
		if (vm > m) {
			sum *= expf(m - vm);
			m = vm;
		}
		sum += (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
	}
	for (int j = done + threadIdx.x; j < V; j += blockDim.x) {
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
	for (int j = threadIdx.x; j < ld; j += blockDim.x)
		o[j] = __float2bfloat16_rn(j < V ? scale * (expf(l[j] - z) - (j == tgt ? 1.0f : 0.0f)) : 0.0f);
}

/* crossentropy_bwd16_k on four columns a thread (ld a multiple of 4) */
__global__ void crossentropy_bwd16x4_k(__nv_bfloat16 *d, const float *logits, const float *lse,
                                       const int32_t *targets, int V, int ld, float scale)
{
	const float *l = logits + (size_t)blockIdx.x * ld;
	__nv_bfloat16 *o = d + (size_t)blockIdx.x * ld;
	float z = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];
	for (int j = threadIdx.x; j < ld / 4; j += blockDim.x) {
		float4 v = ((const float4 *)l)[j];
		float e[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
		for (int k = 0; k < 4; k++) {
			int col = 4 * j + k;
			e[k] = col < V ? scale * (expf(e[k] - z) - (col == tgt ? 1.0f : 0.0f)) : 0.0f;
		}
		st_bf16x4(o + 4 * j, make_float4(e[0], e[1], e[2], e[3]));
	}
}

void cu_crossentropy_bwd16(cudaStream_t s, __nv_bfloat16 *dlogits, const float *logits, const float *lse,
                           const int32_t *targets, int N, int V, int ld, float scale)
{
	if (ld % 4 == 0 && aligned16(dlogits, logits))
		crossentropy_bwd16x4_k<<<N, 256, 0, s>>>(dlogits, logits, lse, targets, V, ld, scale);
	else
		crossentropy_bwd16_k<<<N, 256, 0, s>>>(dlogits, logits, lse, targets, V, ld, scale);
}

void cu_crossentropy_fwd(cudaStream_t s, float *losses, float *lse, const float *logits, const int32_t *targets,
                         int N, int V, int ld)
{
	crossentropy_fwd_k<<<N, 256, 0, s>>>(losses, lse, logits, targets, V, ld, ld % 4 == 0 && aligned16(logits));
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

int cu_token_lists(const int32_t *tokens, int BT, int32_t *cnt, int32_t *uniq, int32_t *offs, int32_t *pos)
{
	int nu = 0;
	for (int i = 0; i < BT; i++)
		if (cnt[tokens[i]]++ == 0)
			uniq[nu++] = tokens[i];
	/* offsets in order of first appearance; cnt becomes the write cursor */
	int off = 0;
	for (int u = 0; u < nu; u++) {
		int t = uniq[u], k = cnt[t];
		offs[u] = off;
		cnt[t] = off;
		off += k;
	}
	offs[nu] = off;
	for (int i = 0; i < BT; i++)
		pos[cnt[tokens[i]]++] = i;
	for (int u = 0; u < nu; u++)
		cnt[uniq[u]] = 0;
	return nu;
}

void cu_embedding_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout, const int32_t *uniq,
                      const int32_t *offs, const int32_t *pos, int n_uniq, int B, int T, int C)
{
	if (dwpe)
		embedding_bwd_wpe_k<<<blocks_for((long)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
	if (n_uniq > 0)
		embedding_bwd_wte_k<<<n_uniq, 256, 0, s>>>(dwte, dout, uniq, offs, pos, C);
}
