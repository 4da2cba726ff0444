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

cublasStatus_t cu_gemm(cublasHandle_t h, int precision, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, long sa, const float *B, int ldb, long sb, float beta, float *C,
                       int ldc, long sc, int batch)
{
	cublasComputeType_t ct = precision == KERN_PREC_BF16   ? CUBLAS_COMPUTE_32F_FAST_16BF
	                         : precision == KERN_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
	                                                       : CUBLAS_COMPUTE_32F_PEDANTIC;
	/* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	if (batch <= 1)
		return cublasGemmEx(h, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C,
		                    CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT);
	return cublasGemmStridedBatchedEx(h, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda,
	                                  sa, &beta, C, CUDA_R_32F, ldc, sc, batch, ct, CUBLAS_GEMM_DEFAULT);
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

void cu_gelu_fwd(cudaStream_t s, float *out, const float *inp, long n)
{
	gelu_fwd_k<<<blocks_for(n, 256), 256, 0, s>>>(out, inp, n);
}

void cu_gelu_bwd(cudaStream_t s, float *dinp, const float *inp, const float *dout, long n)
{
	gelu_bwd_k<<<blocks_for(n, 256), 256, 0, s>>>(dinp, inp, dout, n);
}

/* index i of [B,T,3C] (c3 = which * C + h * hd + d) <-> [which][B][NH][T][hd] */
__device__ __forceinline__ long qkv_perm(long i, int T, int C, int NH, long BTC)
{
	int C3 = 3 * C, hd = C / NH;
	long bt = i / C3;
	int c3 = (int)(i % C3), which = c3 / C, h = (c3 % C) / hd, d = c3 % hd;
	long b = bt / T, t = bt % T;
	return which * BTC + ((b * NH + h) * T + t) * hd + d;
}

template <bool MERGE> __global__ void qkv_perm_k(float *dst, const float *src, int B, int T, int C, int NH)
{
	long n = (long)B * T * 3 * C, BTC = (long)B * T * C;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		long p = qkv_perm(i, T, C, NH, BTC);
		if (MERGE)
			dst[i] = src[p];
		else
			dst[p] = src[i];
	}
}

void cu_qkv_split(cudaStream_t s, float *qkvp, const float *qkv, int B, int T, int C, int NH)
{
	qkv_perm_k<false><<<blocks_for((long)B * T * 3 * C, 256), 256, 0, s>>>(qkvp, qkv, B, T, C, NH);
}

void cu_qkv_merge(cudaStream_t s, float *dqkv, const float *dqkvp, int B, int T, int C, int NH)
{
	qkv_perm_k<true><<<blocks_for((long)B * T * 3 * C, 256), 256, 0, s>>>(dqkv, dqkvp, B, T, C, NH);
}

/* i over [B,T,C] (c = h * hd + d) <-> [B][NH][T][hd] */
template <bool MERGE> __global__ void heads_perm_k(float *dst, const float *src, int B, int T, int C, int NH)
{
	long n = (long)B * T * C;
	int hd = C / NH;
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		long bt = i / C, b = bt / T, t = bt % T;
		int c = (int)(i % C), h = c / hd, d = c % hd;
		long p = ((b * NH + h) * T + t) * hd + d;
		if (MERGE)
			dst[i] = src[p];
		else
			dst[p] = src[i];
	}
}

void cu_heads_merge(cudaStream_t s, float *out, const float *yp, int B, int T, int C, int NH)
{
	heads_perm_k<true><<<blocks_for((long)B * T * C, 256), 256, 0, s>>>(out, yp, B, T, C, NH);
}

void cu_heads_split(cudaStream_t s, float *yp, const float *y, int B, int T, int C, int NH)
{
	heads_perm_k<false><<<blocks_for((long)B * T * C, 256), 256, 0, s>>>(yp, y, B, T, C, NH);
}

/* one warp per row of scores */
__global__ void softmax_causal_k(float *att, long rows, int T)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	float *p = att + row * T;
	int n = (int)(row % T) + 1;
	float mx = -INFINITY;
	for (int j = lane; j < n; j += 32)
		mx = fmaxf(mx, p[j]);
	mx = warp_max(mx);
	float sum = 0.0f;
	for (int j = lane; j < n; j += 32) {
		float e = expf(p[j] - mx);
		p[j] = e;
		sum += e;
	}
	float inv = 1.0f / warp_sum(sum);
	for (int j = lane; j < T; j += 32)
		p[j] = j < n ? p[j] * inv : 0.0f;
}

__global__ void softmax_causal_bwd_k(float *datt, const float *att, long rows, int T, float scale)
{
	long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	float *d = datt + row * T;
	const float *p = att + row * T;
	int n = (int)(row % T) + 1;
	float dot = 0.0f;
	for (int j = lane; j < n; j += 32)
		dot += p[j] * d[j];
	dot = warp_sum(dot);
	for (int j = lane; j < T; j += 32)
		d[j] = j < n ? scale * p[j] * (d[j] - dot) : 0.0f;
}

void cu_softmax_causal(cudaStream_t s, float *att, long rows, int T)
{
	softmax_causal_k<<<(int)((rows * 32 + 255) / 256), 256, 0, s>>>(att, rows, T);
}

void cu_softmax_causal_bwd(cudaStream_t s, float *datt, const float *att, long rows, int T, float scale)
{
	softmax_causal_bwd_k<<<(int)((rows * 32 + 255) / 256), 256, 0, s>>>(datt, att, rows, T, scale);
}

/* one block per row of logits */
__global__ void crossentropy_fwd_k(float *losses, float *lse, const float *logits, const int32_t *targets, int V)
{
	__shared__ float sh[32];
	const float *l = logits + (size_t)blockIdx.x * V;
	float mx = -INFINITY;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		mx = fmaxf(mx, l[j]);
	mx = block_reduce<true>(mx, sh);
	float sum = 0.0f;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		sum += expf(l[j] - mx);
	sum = block_reduce<false>(sum, sh);
	if (threadIdx.x == 0) {
		float z = mx + logf(sum);
		lse[blockIdx.x] = z;
		losses[blockIdx.x] = z - l[targets[blockIdx.x]];
	}
}

__global__ void crossentropy_bwd_k(float *logits, const float *lse, const int32_t *targets, int V, float scale)
{
	float *l = logits + (size_t)blockIdx.x * V;
	float z = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		l[j] = scale * (expf(l[j] - z) - (j == tgt ? 1.0f : 0.0f));
}

void cu_crossentropy_fwd(cudaStream_t s, float *losses, float *lse, const float *logits, const int32_t *targets,
                         int N, int V)
{
	crossentropy_fwd_k<<<N, 256, 0, s>>>(losses, lse, logits, targets, V);
}

void cu_crossentropy_bwd(cudaStream_t s, float *logits, const float *lse, const int32_t *targets, int N, int V,
                         float scale)
{
	crossentropy_bwd_k<<<N, 256, 0, s>>>(logits, lse, targets, V, scale);
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
