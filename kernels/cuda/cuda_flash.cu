/* cotrain CUDA backend: fused attention (causal, or over every key).  See cuda_flash.h.
 *
 * Each kernel runs 8 warps on 128 rows of its own (queries; keys for dK
 * and dV), a warp owning 16 of them, and walks the other side in tiles of
 * 64 rows through shared memory.  A product is a run of mma.sync.m16n8k16
 * on fragments in PTX's register layout (for lane l: g = l / 4, t = l % 4):
 *   A (16 x 16, row-major): {row g, cols 2t, 2t+1}, {row g+8, cols 2t, 2t+1},
 *                           {row g, cols 2t+8, 2t+9}, {row g+8, cols 2t+8, 2t+9}
 *   B (16 x 8, k x n):      {k 2t, 2t+1; n g}, {k 2t+8, 2t+9; n g}
 *   C (16 x 8, fp32):       row g cols 2t, 2t+1; row g+8 cols 2t, 2t+1
 * So two neighbouring C tiles of a score product are, packed to bf16, the
 * A fragment of the next product (the probabilities times V) without a
 * trip through memory.  A B operand stored as [n][k] (a row of K for the
 * scores) is read two bf16 in one 32-bit load; one stored as [k][n] (V, Q
 * or dO where the product's k runs over their rows) through ldmatrix.trans,
 * the others through ldmatrix; a block's own rows are held as fragments in
 * registers for the whole walk.  The walked tiles come in by cp.async, two
 * stages deep: the next tile loads while the warps multiply the current
 * one.  Tile rows are padded to 72 elements: the 32 lanes' loads of a
 * fragment, and ldmatrix's eight row addresses, then fall in distinct
 * banks. */
#include "kernels/cuda/cuda_flash.h"

#include "kernels/gpu_abi.h"

#include <stdint.h>

namespace
{

typedef __nv_bfloat16 bf16;

constexpr int HD = 64;      /* head size */
constexpr int BM = 128;     /* rows a block owns */
constexpr int BN = 64;      /* rows of a tile it walks */
constexpr int LDS = HD + 8; /* a tile's row in shared memory, padded */
constexpr int THREADS = 256;

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
	             "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* four 8 x 8 matrices of bf16, transposed: lanes 8i .. 8i+7 give the row
 * addresses of matrix i; lane l gets, of matrix i, elements [2 (l % 4)]
 * and [2 (l % 4) + 1] of column l / 4 in b[i] */
__device__ __forceinline__ void ldsm_t4(uint32_t b[4], const bf16 *p)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
	             : "r"(a));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *(uint32_t *)&v;
}

__device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *(const uint32_t *)p; }

/* rows [n][HD] of src (a [.., T, HD] head's rows) into sh[n][LDS] */
__device__ __forceinline__ void load_tile(bf16 *sh, const bf16 *src, int n)
{
	for (int c = threadIdx.x; c < n * HD / 8; c += THREADS) {
		int r = c / (HD / 8), col = c % (HD / 8) * 8;
		*(uint4 *)(sh + r * LDS + col) = *(const uint4 *)(src + (long)r * HD + col);
	}
}

/* the A fragment of rows r0 .. r0+15, columns 16 kc .. 16 kc + 15 */
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *sh, int r0, int kc, int g, int t)
{
	const bf16 *p = sh + (r0 + g) * LDS + kc * 16 + 2 * t;
	a[0] = ld32(p);
	a[1] = ld32(p + 8 * LDS);
	a[2] = ld32(p + 8);
	a[3] = ld32(p + 8 * LDS + 8);
}

/* four 8 x 8 matrices of bf16 as they are: lane l gets, of matrix i,
 * elements [2 (l % 4)] and [2 (l % 4) + 1] of row l / 4 in b[i] */
__device__ __forceinline__ void ldsm4(uint32_t b[4], const bf16 *p)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
	             : "r"(a));
}

/* 16 bytes from global to shared memory, asynchronously (sm_80), and the
 * group fences: wait_group 1 returns once at most one committed group of
 * this thread is still in flight */
__device__ __forceinline__ void cp_async16(void *sh, const void *gl)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(sh);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gl));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

/* rows [BN][HD] of src into sh[BN][LDS], asynchronously */
__device__ __forceinline__ void load_tile_async(bf16 *sh, const bf16 *src)
{
	for (int c = threadIdx.x; c < BN * HD / 8; c += THREADS) {
		int r = c / (HD / 8), col = c % (HD / 8) * 8;
		cp_async16(sh + r * LDS + col, src + (long)r * HD + col);
	}
}

/* c0, c1 += a x B for n-tiles 2 np and 2 np + 1 and k-chunk kc, B read
 * from sh stored as [n][k] */
__device__ __forceinline__ void mma_nk2(float c0[4], float c1[4], const uint32_t a[4], const bf16 *sh, int np, int kc,
                                       int lane)
{
	uint32_t b[4];
	ldsm4(b, sh + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kc * 16 + (lane >> 3 & 1) * 8);
	mma(c0, a, b[0], b[1]);
	mma(c1, a, b[2], b[3]);
}

/* c[0] and c[1] += a x B for n-tiles 2 np and 2 np + 1 and k-chunk kk, B
 * read from sh stored as [k][n] */
__device__ __forceinline__ void mma_kn2(float c0[4], float c1[4], const uint32_t a[4], const bf16 *sh, int kk,
                                       int np, int lane)
{
	uint32_t b[4];
	ldsm_t4(b, sh + (kk * 16 + (lane & 7) + (lane >> 3 & 1) * 8) * LDS + np * 16 + (lane >> 4) * 8);
	mma(c0, a, b[0], b[1]);
	mma(c1, a, b[2], b[3]);
}

/* the A fragment of k-chunk kk from C tiles 2 kk and 2 kk + 1, in bf16 */
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
	a[0] = pack(c0[0], c0[1]);
	a[1] = pack(c0[2], c0[3]);
	a[2] = pack(c1[0], c1[1]);
	a[3] = pack(c1[2], c1[3]);
}

__device__ __forceinline__ float quad_max(float v)
{
	v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
	return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v)
{
	v += __shfl_xor_sync(0xffffffffu, v, 1);
	return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* this warp's 16 rows of a [BM][HD] block of src as A fragments, through
 * the staging area st (a whole block's barrier on each side) */
__device__ __forceinline__ void rows_to_frags(uint32_t f[HD / 16][4], bf16 *st, const bf16 *src, int r0, int g,
                                              int t)
{
	__syncthreads();
	load_tile(st, src, BM);
	__syncthreads();
#pragma unroll
	for (int kc = 0; kc < HD / 16; kc++)
		frag_a(f[kc], st, r0, kc, g, t);
}

/* One block per (128 queries, b * NH + h); the last query blocks, which
 * walk the most keys, start first.  sl2 = the softmax scale times log2(e).
 * A warp's 16 rows lie in one 64-row tile, so a key tile is either wholly
 * after them (skipped) or holds, for each row, a key at or before it. */
__global__ void __launch_bounds__(THREADS) flash_fwd_k(float *out, bf16 *out16, float *lse, const bf16 *q,
                                                      const bf16 *k, const bf16 *v, int T, int C, int NH, float sl2,
                                                      bool causal)
{
	/* two stages of a K and a V tile; Q is staged through the first */
	__shared__ __align__(16) bf16 sm[4 * BN * LDS];
	int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = warp * 16;
	long base = (long)bh * T * HD;
	int first = qb * BM + r0, row0 = first + g; /* this lane's rows: row0 and row0 + 8 */
	uint32_t qf[HD / 16][4];
	rows_to_frags(qf, sm, q + base + (long)qb * BM * HD, r0, g, t);
	__syncthreads();
	float o[8][4] = {}, m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
	int nkb = causal ? (qb + 1) * BM / BN : T / BN;
	load_tile_async(sm, k + base);
	load_tile_async(sm + BN * LDS, v + base);
	cp_commit();
	for (int kb = 0; kb < nkb; kb++) {
		bf16 *Ks = sm + (kb & 1) * 2 * BN * LDS, *Vs = Ks + BN * LDS;
		if (kb + 1 < nkb) {
			bf16 *nx = sm + ((kb + 1) & 1) * 2 * BN * LDS;
			load_tile_async(nx, k + base + (long)(kb + 1) * BN * HD);
			load_tile_async(nx + BN * LDS, v + base + (long)(kb + 1) * BN * HD);
		}
		cp_commit();
		cp_wait1(); /* this tile's group is in */
		__syncthreads();
		if (!causal || kb * BN <= first + 15) {
			float s[8][4] = {};
#pragma unroll
			for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
				for (int np = 0; np < 4; np++)
					mma_nk2(s[2 * np], s[2 * np + 1], qf[kc], Ks, np, kc, lane);
			/* scale to base 2, mask the future (on a tile that reaches past
			 * the warp's first row), and the rows' new maxima */
			bool mask = causal && kb * BN + BN - 1 > first;
			float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
			for (int nt = 0; nt < 8; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int col = kb * BN + nt * 8 + 2 * t + (e & 1), row = row0 + (e >> 1) * 8;
					float x = !mask || col <= row ? s[nt][e] * sl2 : -INFINITY;
					s[nt][e] = x;
					mx[e >> 1] = fmaxf(mx[e >> 1], x);
				}
			float corr[2];
#pragma unroll
			for (int i = 0; i < 2; i++) {
				float mn = fmaxf(m[i], quad_max(mx[i])); /* finite: see above */
				corr[i] = exp2f(m[i] - mn);
				m[i] = mn;
				l[i] *= corr[i];
			}
#pragma unroll
			for (int dn = 0; dn < 8; dn++) {
				o[dn][0] *= corr[0];
				o[dn][1] *= corr[0];
				o[dn][2] *= corr[1];
				o[dn][3] *= corr[1];
			}
#pragma unroll
			for (int nt = 0; nt < 8; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					float p = exp2f(s[nt][e] - m[e >> 1]);
					s[nt][e] = p;
					l[e >> 1] += p;
				}
#pragma unroll
			for (int kk = 0; kk < BN / 16; kk++) {
				uint32_t a[4];
				c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < 4; np++)
					mma_kn2(o[2 * np], o[2 * np + 1], a, Vs, kk, np, lane);
			}
		}
		__syncthreads(); /* this stage is read: the next iteration loads into it */
	}
	int b = bh / NH, h = bh % NH;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float sum = quad_sum(l[i]), inv = 1.0f / sum;
		int row = row0 + 8 * i;
		long at = ((long)b * T + row) * C + h * HD + 2 * t;
#pragma unroll
		for (int dn = 0; dn < 8; dn++) {
			float2 y = make_float2(o[dn][2 * i] * inv, o[dn][2 * i + 1] * inv);
			*(float2 *)(out + at + dn * 8) = y;
			if (out16)
				*(__nv_bfloat162 *)(out16 + at + dn * 8) = __float22bfloat162_rn(y);
		}
		if (t == 0)
			lse[(long)bh * T + row] = m[i] + log2f(sum);
	}
}

/* One warp per (b, t, h): D = the row's sum of dO * O (the softmax
 * backward's correction), and dO in bf16 in the heads' layout. */
__global__ void flash_bwd_prep_k(float *D, bf16 *dO16, const float *dout, const float *out, int B, int T, int C,
                                 int NH)
{
	long w = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (w >= (long)B * T * NH)
		return;
	int h = (int)(w % NH);
	long bt = w / NH, b = bt / T;
	int tt = (int)(bt % T);
	float2 o2 = ((const float2 *)(out + bt * C + h * HD))[lane];
	float2 d2 = ((const float2 *)(dout + bt * C + h * HD))[lane];
	float sum = o2.x * d2.x + o2.y * d2.y;
	for (int off = 16; off > 0; off >>= 1)
		sum += __shfl_xor_sync(0xffffffffu, sum, off);
	long row = (b * NH + h) * T + tt;
	((__nv_bfloat162 *)(dO16 + row * HD))[lane] = __floats2bfloat162_rn(d2.x, d2.y);
	if (lane == 0)
		D[row] = sum;
}

/* dK and dV of 128 keys (a warp: 16 keys), walking the query tiles that
 * reach them: S^T = K Q^T, P^T from the saved logsumexp, dP^T = V dO^T,
 * dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q (times the scale). */
__global__ void __launch_bounds__(THREADS) flash_bwd_kv_k(float *dqkv, const bf16 *q, const bf16 *k, const bf16 *v,
                                                         const bf16 *dO, const float *lse, const float *D, int T,
                                                         int C, int NH, float sl2, float scale, bool causal)
{
	/* two stages of a Q and a dO tile (K and V staged through the first),
	 * and of the tile's logsumexp and D */
	__shared__ __align__(16) bf16 sm[4 * BN * LDS];
	__shared__ __align__(16) float LD[2][2][BN];
	int kb = blockIdx.x, bh = blockIdx.y;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = warp * 16;
	long base = (long)bh * T * HD;
	int first = kb * BM + r0, key0 = first + g; /* this lane's keys: key0 and key0 + 8 */
	uint32_t kf[HD / 16][4], vf[HD / 16][4];
	rows_to_frags(kf, sm, k + base + (long)kb * BM * HD, r0, g, t);
	rows_to_frags(vf, sm, v + base + (long)kb * BM * HD, r0, g, t);
	__syncthreads();
	float dk[8][4] = {}, dv[8][4] = {};
	int q0 = causal ? kb * BM / BN : 0, nq = T / BN;
	/* the query tile qb into stage st */
	auto issue = [&](int qb, int st) {
		long qo = base + (long)qb * BN * HD;
		load_tile_async(sm + st * 2 * BN * LDS, q + qo);
		load_tile_async(sm + st * 2 * BN * LDS + BN * LDS, dO + qo);
		if (threadIdx.x < 2 * BN / 4) {
			int which = threadIdx.x / (BN / 4), i = threadIdx.x % (BN / 4) * 4;
			cp_async16(&LD[st][which][i], (which ? D : lse) + (long)bh * T + qb * BN + i);
		}
	};
	issue(q0, 0);
	cp_commit();
	for (int qb = q0; qb < nq; qb++) {
		int st = (qb - q0) & 1;
		const bf16 *Qs = sm + st * 2 * BN * LDS, *dOs = Qs + BN * LDS;
		const float *Ls = LD[st][0], *Ds = LD[st][1];
		if (qb + 1 < nq)
			issue(qb + 1, st ^ 1);
		cp_commit();
		cp_wait1();
		__syncthreads();
		if (!causal || qb * BN + BN - 1 >= first) { /* some query of the tile reaches this warp's keys */
			float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
			for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
				for (int np = 0; np < 4; np++) {
					mma_nk2(s[2 * np], s[2 * np + 1], kf[kc], Qs, np, kc, lane);
					mma_nk2(dp[2 * np], dp[2 * np + 1], vf[kc], dOs, np, kc, lane);
				}
			bool mask = causal && qb * BN < first + 15; /* some query of the tile is before some key */
#pragma unroll
			for (int nt = 0; nt < 8; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int qi = nt * 8 + 2 * t + (e & 1), key = key0 + (e >> 1) * 8;
					float p = !mask || qb * BN + qi >= key ? exp2f(s[nt][e] * sl2 - Ls[qi]) : 0.0f;
					s[nt][e] = p;
					dp[nt][e] = p * (dp[nt][e] - Ds[qi]);
				}
#pragma unroll
			for (int kk = 0; kk < BN / 16; kk++) {
				uint32_t ap[4], ads[4];
				c_to_a(ap, s[2 * kk], s[2 * kk + 1]);
				c_to_a(ads, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < 4; np++) {
					mma_kn2(dv[2 * np], dv[2 * np + 1], ap, dOs, kk, np, lane);
					mma_kn2(dk[2 * np], dk[2 * np + 1], ads, Qs, kk, np, lane);
				}
			}
		}
		__syncthreads();
	}
	int b = bh / NH, h = bh % NH;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float *dst = dqkv + ((long)b * T + key0 + 8 * i) * 3 * C + h * HD + 2 * t;
#pragma unroll
		for (int dn = 0; dn < 8; dn++) {
			*(float2 *)(dst + C + dn * 8) = make_float2(dk[dn][2 * i] * scale, dk[dn][2 * i + 1] * scale);
			*(float2 *)(dst + 2 * C + dn * 8) = make_float2(dv[dn][2 * i], dv[dn][2 * i + 1]);
		}
	}
}

/* dQ of 128 queries (a warp: 16 queries), walking the key tiles at or
 * before them: S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K. */
__global__ void __launch_bounds__(THREADS) flash_bwd_q_k(float *dqkv, const bf16 *q, const bf16 *k, const bf16 *v,
                                                        const bf16 *dO, const float *lse, const float *D, int T,
                                                        int C, int NH, float sl2, float scale, bool causal)
{
	/* two stages of a K and a V tile; Q and dO are staged through the first */
	__shared__ __align__(16) bf16 sm[4 * BN * LDS];
	int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = warp * 16;
	long base = (long)bh * T * HD;
	int first = qb * BM + r0, row0 = first + g;
	uint32_t qf[HD / 16][4], of[HD / 16][4];
	rows_to_frags(qf, sm, q + base + (long)qb * BM * HD, r0, g, t);
	rows_to_frags(of, sm, dO + base + (long)qb * BM * HD, r0, g, t);
	__syncthreads();
	float L[2], Dr[2];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		L[i] = lse[(long)bh * T + row0 + 8 * i];
		Dr[i] = D[(long)bh * T + row0 + 8 * i];
	}
	float dq[8][4] = {};
	int nkb = causal ? (qb + 1) * BM / BN : T / BN;
	load_tile_async(sm, k + base);
	load_tile_async(sm + BN * LDS, v + base);
	cp_commit();
	for (int kb = 0; kb < nkb; kb++) {
		const bf16 *Ks = sm + (kb & 1) * 2 * BN * LDS, *Vs = Ks + BN * LDS;
		if (kb + 1 < nkb) {
			bf16 *nx = sm + ((kb + 1) & 1) * 2 * BN * LDS;
			load_tile_async(nx, k + base + (long)(kb + 1) * BN * HD);
			load_tile_async(nx + BN * LDS, v + base + (long)(kb + 1) * BN * HD);
		}
		cp_commit();
		cp_wait1();
		__syncthreads();
		if (!causal || kb * BN <= first + 15) {
			float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
			for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
				for (int np = 0; np < 4; np++) {
					mma_nk2(s[2 * np], s[2 * np + 1], qf[kc], Ks, np, kc, lane);
					mma_nk2(dp[2 * np], dp[2 * np + 1], of[kc], Vs, np, kc, lane);
				}
			bool mask = causal && kb * BN + BN - 1 > first;
#pragma unroll
			for (int nt = 0; nt < 8; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int col = kb * BN + nt * 8 + 2 * t + (e & 1), i = e >> 1;
					float p = !mask || col <= row0 + 8 * i ? exp2f(s[nt][e] * sl2 - L[i]) : 0.0f;
					dp[nt][e] = p * (dp[nt][e] - Dr[i]);
				}
#pragma unroll
			for (int kk = 0; kk < BN / 16; kk++) {
				uint32_t a[4];
				c_to_a(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
				for (int np = 0; np < 4; np++)
					mma_kn2(dq[2 * np], dq[2 * np + 1], a, Ks, kk, np, lane);
			}
		}
		__syncthreads();
	}
	int b = bh / NH, h = bh % NH;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float *dst = dqkv + ((long)b * T + row0 + 8 * i) * 3 * C + h * HD + 2 * t;
#pragma unroll
		for (int dn = 0; dn < 8; dn++)
			*(float2 *)(dst + dn * 8) = make_float2(dq[dn][2 * i] * scale, dq[dn][2 * i + 1] * scale);
	}
}

} // namespace

bool cu_flash_fits(int precision, int T, int C, int NH)
{
	return precision == KERN_PREC_BF16 && NH > 0 && C % NH == 0 && C / NH == HD && T > 0 && T % BM == 0;
}

void cu_flash_fwd(cudaStream_t s, float *out, __nv_bfloat16 *out16, float *lse, const __nv_bfloat16 *qkvp, int B,
                  int T, int C, int NH, bool causal)
{
	long BTC = (long)B * T * C;
	float sl2 = 1.4426950408889634f / sqrtf((float)HD);
	flash_fwd_k<<<dim3(T / BM, B * NH), THREADS, 0, s>>>(out, out16, lse, qkvp, qkvp + BTC, qkvp + 2 * BTC, T, C, NH,
	                                                     sl2, causal);
}

void cu_flash_bwd(cudaStream_t s, float *dqkv, const float *dout, const float *out, const __nv_bfloat16 *qkvp,
                  const float *lse, float *D, __nv_bfloat16 *dO16, int B, int T, int C, int NH, bool causal)
{
	long BTC = (long)B * T * C, warps = (long)B * T * NH;
	float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
	const bf16 *q = qkvp, *k = qkvp + BTC, *v = qkvp + 2 * BTC;
	flash_bwd_prep_k<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, s>>>(D, dO16, dout, out, B, T, C, NH);
	dim3 grid(T / BM, B * NH);
	flash_bwd_kv_k<<<grid, THREADS, 0, s>>>(dqkv, q, k, v, dO16, lse, D, T, C, NH, sl2, scale, causal);
	flash_bwd_q_k<<<grid, THREADS, 0, s>>>(dqkv, q, k, v, dO16, lse, D, T, C, NH, sl2, scale, causal);
}
