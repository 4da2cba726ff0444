/* cotrain CUDA backend: the sketch of a vector on the device (see
 * cuda_sketch.h and shared/common/sketch.h for the definition). */
#include "kernels/cuda/cuda_sketch.h"
#include "kernels/cuda/cuda_util.h"

#define SK_GOLDEN 0x9E3779B97F4A7C15ULL
#define SK_K_MAX 256
/* a fixed grid, so that the order of the sums does not depend on the GPU */
#define SK_BLOCKS 256
#define SK_THREADS 256
#define SK_WARPS (SK_BLOCKS * SK_THREADS / 32)

__device__ __forceinline__ uint64_t sk_mix64(uint64_t z)
{
	z ^= z >> 30;
	z *= 0xBF58476D1CE4E5B9ULL;
	z ^= z >> 27;
	z *= 0x94D049BB133111EBULL;
	z ^= z >> 31;
	return z;
}

/* Warp w takes the blocks of 64 coordinates w, w + SK_WARPS, ...: lane l
 * signs coordinates 2l and 2l + 1 by r, the warp sums them (a fixed tree,
 * then lane 0's total to all), and lane l adds the block's sum, signed by
 * a_j, to projection j = l + 32 t.  partial[w * k + j]: warp w's share. */
__global__ void sketch_partials(const float *__restrict__ x, size_t n, uint64_t seed, int k, bool pairs,
                                double *__restrict__ partial)
{
	int lane = threadIdx.x & 31;
	size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	size_t nblk = (n + 63) / 64;
	double acc[SK_K_MAX / 32];
#pragma unroll
	for (int t = 0; t < SK_K_MAX / 32; t++)
		acc[t] = 0;
	for (size_t blk = warp; blk < nblk; blk += SK_WARPS) {
		uint64_t r = sk_mix64(seed + SK_GOLDEN * (blk + 1));
		size_t i = blk * 64 + 2 * (size_t)lane;
		double y = 0;
		if (pairs && i + 1 < n) {
			float2 v = *reinterpret_cast<const float2 *>(x + i);
			y = ((r >> (2 * lane)) & 1) ? -(double)v.x : (double)v.x;
			y += ((r >> (2 * lane + 1)) & 1) ? -(double)v.y : (double)v.y;
		} else {
			if (i < n)
				y = ((r >> (2 * lane)) & 1) ? -(double)x[i] : (double)x[i];
			if (i + 1 < n)
				y += ((r >> (2 * lane + 1)) & 1) ? -(double)x[i + 1] : (double)x[i + 1];
		}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			y += __shfl_down_sync(0xffffffffu, y, o);
		y = __shfl_sync(0xffffffffu, y, 0);
#pragma unroll
		for (int t = 0; t < SK_K_MAX / 32; t++) {
			int j = lane + 32 * t;
			if (j < k) {
				uint64_t a = sk_mix64(seed + SK_GOLDEN * ((((uint64_t)(j >> 6) + 1) << 56) + blk + 1));
				acc[t] += ((a >> (j & 63)) & 1) ? -y : y;
			}
		}
	}
#pragma unroll
	for (int t = 0; t < SK_K_MAX / 32; t++) {
		int j = lane + 32 * t;
		if (j < k)
			partial[warp * k + j] = acc[t];
	}
}

/* out[j] = the sum of the warps' shares of projection j, in warp order. */
__global__ void sketch_total(const double *__restrict__ partial, int k, double *__restrict__ out)
{
	int j = threadIdx.x;
	if (j >= k)
		return;
	double s = 0;
	for (int w = 0; w < SK_WARPS; w++)
		s += partial[(size_t)w * k + j];
	out[j] = s;
}

size_t cu_sketch_scratch_len(void) { return (size_t)SK_WARPS * SK_K_MAX + SK_K_MAX; }

int cu_sketch(const float *x, size_t n, uint64_t seed, int k, double *host_out, double *scratch,
              cudaStream_t s, char *err, size_t errlen)
{
	if (k < 1 || k > SK_K_MAX)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "sketch", "k must be 1 to 256");
	double *partial = scratch, *out = scratch + (size_t)SK_WARPS * SK_K_MAX;
	bool pairs = ((uintptr_t)x & 7) == 0; /* 8-byte loads of pairs */
	sketch_partials<<<SK_BLOCKS, SK_THREADS, 0, s>>>(x, n, seed, k, pairs, partial);
	sketch_total<<<1, SK_K_MAX, 0, s>>>(partial, k, out);
	CU_TRY(cudaGetLastError(), "sketching the gradient");
	CU_TRY(cudaMemcpyAsync(host_out, out, (size_t)k * sizeof *out, cudaMemcpyDeviceToHost, s),
	       "copying the sketch from the GPU");
	CU_SYNC(s, "sketching the gradient");
	return KERN_GPU_OK;
}
