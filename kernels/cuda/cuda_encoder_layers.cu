/* cotrain CUDA backend: the encoders' own kernels.  See cuda_encoder_layers.h. */
#include "kernels/cuda/cuda_encoder_layers.h"

#include <math.h>

typedef __nv_bfloat16 bf16;

#define GELU_RSQRT2 0.7071067811865476f   /* 1 / sqrt(2), as kernels/gelu.c */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */
#define TYPE_CHUNK 128                    /* rows a block sums for the segment embedding */

static inline int grid_for(long n, int threads)
{
	long b = (n + threads - 1) / threads;
	return (int)(b < 65535L * 32 ? b : 65535L * 32);
}

#define GRID_STRIDE(i, n) \
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

__global__ void embedding_seg_fwd_k(float *out, const int32_t *ids, const int32_t *segs, const float *word,
                                    const float *pos, const float *type, int T, int E, long n)
{
	GRID_STRIDE(i, n)
	{
		long bt = i / E;
		int e = (int)(i % E), t = (int)(bt % T);
		float v = word[(size_t)ids[bt] * E + e] + type[(size_t)segs[bt] * E + e];
		out[i] = pos ? v + pos[(size_t)t * E + e] : v;
	}
}

void cu_embedding_seg_fwd(cudaStream_t s, float *out, const int32_t *ids, const int32_t *segs,
                          const float *word, const float *pos, const float *type, int B, int T, int E)
{
	long n = (long)B * T * E;
	embedding_seg_fwd_k<<<grid_for(n, 256), 256, 0, s>>>(out, ids, segs, word, pos, type, T, E, n);
}

/* block (chunk, v): part[v][chunk][e] = the sum over the chunk's rows of
 * segment v, in row order */
__global__ void type_partial_k(float *part, const float *dout, const int32_t *segs, int BT, int E, int nch)
{
	int ch = blockIdx.x, v = blockIdx.y, r0 = ch * TYPE_CHUNK, r1 = min(r0 + TYPE_CHUNK, BT);
	for (int e = threadIdx.x; e < E; e += blockDim.x) {
		float sum = 0.0f;
		for (int r = r0; r < r1; r++)
			if (segs[r] == v)
				sum += dout[(size_t)r * E + e];
		part[((size_t)v * nch + ch) * E + e] = sum;
	}
}

__global__ void type_final_k(float *dtype, const float *part, int E, int TV, int nch)
{
	GRID_STRIDE(i, (long)TV * E)
	{
		long v = i / E, e = i % E;
		float sum = 0.0f;
		for (int ch = 0; ch < nch; ch++)
			sum += part[((size_t)v * nch + ch) * E + e];
		dtype[i] += sum;
	}
}

size_t cu_embedding_type_scratch(int BT, int E, int TV)
{
	return (size_t)TV * ((BT + TYPE_CHUNK - 1) / TYPE_CHUNK) * E;
}

void cu_embedding_type_bwd(cudaStream_t s, float *dtype, const float *dout, const int32_t *segs, int BT,
                           int E, int TV, float *scratch)
{
	int nch = (BT + TYPE_CHUNK - 1) / TYPE_CHUNK;
	int threads = E < 256 ? (E + 31) / 32 * 32 : 256;
	type_partial_k<<<dim3(nch, TV), threads, 0, s>>>(scratch, dout, segs, BT, E, nch);
	type_final_k<<<grid_for((long)TV * E, 256), 256, 0, s>>>(dtype, scratch, E, TV, nch);
}

__global__ void bias_gelu_erf_k(float *out, __nv_bfloat16 *out16, float *pre, const float *bias, long n,
                                int N)
{
	GRID_STRIDE(i, n)
	{
		float x = pre[i] + bias[i % N];
		pre[i] = x;
		float y = 0.5f * x * (1.0f + erff(x * GELU_RSQRT2));
		if (out)
			out[i] = y;
		if (out16)
			out16[i] = __float2bfloat16_rn(y);
	}
}

void cu_bias_gelu_erf_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *pre, const float *bias,
                          int rows, int N)
{
	long n = (long)rows * N;
	bias_gelu_erf_k<<<grid_for(n, 256), 256, 0, s>>>(out, out16, pre, bias, n, N);
}

__global__ void gelu_erf_bwd_k(float *dinp, bf16 *dinp16, const float *inp, const float *dout, long n)
{
	GRID_STRIDE(i, n)
	{
		float x = inp[i];
		float cdf = 0.5f * (1.0f + erff(x * GELU_RSQRT2)), pdf = GELU_RSQRT2PI * expf(-0.5f * x * x);
		float d = dout[i] * (cdf + x * pdf);
		dinp[i] = d;
		if (dinp16)
			dinp16[i] = __float2bfloat16_rn(d);
	}
}

void cu_gelu_erf_bwd(cudaStream_t s, float *dinp, bf16 *dinp16, const float *inp, const float *dout, long n)
{
	gelu_erf_bwd_k<<<grid_for(n, 256), 256, 0, s>>>(dinp, dinp16, inp, dout, n);
}

__global__ void gather_rows_k(float *dst, __nv_bfloat16 *dst16, const float *src, const int32_t *rows, int w,
                              long n)
{
	GRID_STRIDE(i, n)
	{
		long r = i / w;
		float v = src[(size_t)rows[r] * w + i % w];
		dst[i] = v;
		if (dst16)
			dst16[i] = __float2bfloat16_rn(v);
	}
}

void cu_gather_rows(cudaStream_t s, float *dst, __nv_bfloat16 *dst16, const float *src, const int32_t *rows,
                    int n, int w)
{
	long m = (long)n * w;
	if (m > 0)
		gather_rows_k<<<grid_for(m, 256), 256, 0, s>>>(dst, dst16, src, rows, w, m);
}

__global__ void scatter_rows_k(float *dst, const float *src, const int32_t *rows, int w, long n)
{
	GRID_STRIDE(i, n) { dst[(size_t)rows[i / w] * w + i % w] = src[i]; }
}

void cu_scatter_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int w)
{
	long m = (long)n * w;
	if (m > 0)
		scatter_rows_k<<<grid_for(m, 256), 256, 0, s>>>(dst, src, rows, w, m);
}

template <bool ADD> __global__ void first_rows_k(float *dst, const float *src, int T, int w, long n)
{
	GRID_STRIDE(i, n)
	{
		long b = i / w, e = i % w;
		if (ADD)
			dst[(size_t)b * T * w + e] += src[i];
		else
			dst[i] = src[(size_t)b * T * w + e];
	}
}

void cu_first_rows(cudaStream_t s, float *dst, const float *src, int B, int T, int w)
{
	first_rows_k<false><<<grid_for((long)B * w, 256), 256, 0, s>>>(dst, src, T, w, (long)B * w);
}

void cu_first_rows_add(cudaStream_t s, float *dst, const float *src, int B, int T, int w)
{
	first_rows_k<true><<<grid_for((long)B * w, 256), 256, 0, s>>>(dst, src, T, w, (long)B * w);
}

__global__ void tanh_k(float *x, long n)
{
	GRID_STRIDE(i, n) { x[i] = tanhf(x[i]); }
}

__global__ void tanh_bwd_k(float *d, const float *y, long n)
{
	GRID_STRIDE(i, n) { d[i] *= 1.0f - y[i] * y[i]; }
}

void cu_tanh(cudaStream_t s, float *x, long n) { tanh_k<<<grid_for(n, 256), 256, 0, s>>>(x, n); }

void cu_tanh_bwd(cudaStream_t s, float *d, const float *y, long n)
{
	tanh_bwd_k<<<grid_for(n, 256), 256, 0, s>>>(d, y, n);
}

__global__ void rows_bias_ld_k(float *out, const float *bias, int V, int ld, long n)
{
	GRID_STRIDE(i, n)
	{
		int j = (int)(i % ld);
		out[i] = j < V ? bias[j] : 0.0f;
	}
}

void cu_rows_bias_ld(cudaStream_t s, float *out, const float *bias, int N, int V, int ld)
{
	long n = (long)N * ld;
	if (n > 0)
		rows_bias_ld_k<<<grid_for(n, 256), 256, 0, s>>>(out, bias, V, ld, n);
}

/* one block of 256 per row: each thread its columns' first largest, then
 * the block's (the smaller index among equal values) */
__global__ void argmax_rows_k(int32_t *out, const float *logits, int V, int ld)
{
	__shared__ float sv[256];
	__shared__ int si[256];
	const float *l = logits + (size_t)blockIdx.x * ld;
	float best = -INFINITY;
	int at = V;                                       /* none yet: past every column */
	for (int j = threadIdx.x; j < V; j += blockDim.x) /* increasing j: strictly larger keeps the first */
		if (at == V || l[j] > best) {
			best = l[j];
			at = j;
		}
	sv[threadIdx.x] = best;
	si[threadIdx.x] = at;
	__syncthreads();
	for (int half = blockDim.x / 2; half > 0; half >>= 1) {
		if ((int)threadIdx.x < half) {
			float ov = sv[threadIdx.x + half];
			int oi = si[threadIdx.x + half];
			if (oi < V && (si[threadIdx.x] == V || ov > sv[threadIdx.x] ||
			               (ov == sv[threadIdx.x] && oi < si[threadIdx.x]))) {
				sv[threadIdx.x] = ov;
				si[threadIdx.x] = oi;
			}
		}
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[blockIdx.x] = si[0] < V ? si[0] : 0;
}

void cu_argmax_rows(cudaStream_t s, int32_t *out, const float *logits, int N, int V, int ld)
{
	if (N > 0)
		argmax_rows_k<<<N, 256, 0, s>>>(out, logits, V, ld);
}
