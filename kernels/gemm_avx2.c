/* cotrain kernels: the GEMM driver's AVX2 kernel (gemm_kernel_avx2), for
 * CPUs without AVX-512.  See gemm_kernel.h for its interface and
 * doc/kernels.md ("The AVX2 kernel").
 *
 * Blocks of 6 x 16 of C in 12 ymm registers.  op(B) is packed in the
 * AVX-512 kernel's 32-column panels, each stored as two 16-column halves
 * one after the other; op(A) in micro-panels of MR = 6 rows.  A tile walks
 * panel, half, then micro-panel (nw 16: the driver's walk_b_in_l1).  Every
 * element gets the AVX-512 kernel's operations (from zero, one fused
 * multiply-add per k in order, then the same epilogue), so the two kernels
 * give the same bits. */
#include "kernels/gemm_kernel.h"

#if GEMM_X86

enum {
	MR = 6,  /* rows of the kernel's C block */
	NW = 16, /* its columns: half a panel */
	NCP = 8  /* panels in a chunk: 256 columns (smaller L2 caches) */
};

/* Transpose 8 x 8: on entry r[i] is row i, on return r[k] is column k. */
GEMM_AVX2 static inline __attribute__((always_inline)) void transpose8(__m256 r[8])
{
	__m256 t[8], u[8];
	for (int i = 0; i < 4; i++) {
		t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	for (int i = 0; i < 2; i++) {
		u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
		u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
		u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
		u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
	}
	for (int e = 0; e < 4; e++) {
		r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
		r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
	}
}

/* The first 6 floats of v at d (two stores: nothing past d + 6 is
 * touched, so a neighbouring micro-panel may be written meanwhile). */
GEMM_AVX2 static inline void store6(float *d, __m256 v)
{
	_mm_storeu_ps(d, _mm256_castps256_ps128(v));
	_mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(v, 1));
}

/* Panel p of op(B) as two halves of 16 columns, each contiguous so that
 * it stays in L1 (one of 32 columns at 128-byte stride would fill only
 * half of L1's sets): bp[h * K * 16 + k * 16 + j] = op(B)[k][GEMM_NR p + 16 h
 * + j], zero past N; column sums as pack_b_panel's. */
GEMM_AVX2 static void pack_b_panel_avx2(const gemm_args *g, int p)
{
	int j0 = p * GEMM_NR, nr = g->N - j0 < GEMM_NR ? g->N - j0 : GEMM_NR, K = g->K;
	float *dst = g->bp + (size_t)p * K * GEMM_NR;
	if (!g->tb) {
		double sum[GEMM_NR] = { 0 };
		for (int k = 0; k < K; k++) {
			const float *s = g->B + (size_t)k * g->ldb + j0;
			float *d0 = dst + (size_t)k * 16, *d1 = d0 + (size_t)K * 16;
			/* 128 bytes of each row of B, a whole row apart: fetch
			 * 16 rows ahead */
			_mm_prefetch((const char *)(s + 16 * (size_t)g->ldb), _MM_HINT_T0);
			_mm_prefetch((const char *)(s + 16 * (size_t)g->ldb + 16), _MM_HINT_T0);
			if (nr == GEMM_NR) {
				_mm256_store_ps(d0, _mm256_loadu_ps(s));
				_mm256_store_ps(d0 + 8, _mm256_loadu_ps(s + 8));
				_mm256_store_ps(d1, _mm256_loadu_ps(s + 16));
				_mm256_store_ps(d1 + 8, _mm256_loadu_ps(s + 24));
			} else {
				for (int j = 0; j < 16; j++) {
					d0[j] = j < nr ? s[j] : 0.0f;
					d1[j] = j + 16 < nr ? s[j + 16] : 0.0f;
				}
			}
			/* kern_colsum_add's sums: in double, rows in order */
			if (g->colsum)
				for (int j = 0; j < 16; j++) {
					sum[j] += d0[j];
					sum[j + 16] += d1[j];
				}
		}
		for (int j = 0; g->colsum && j < nr; j++)
			g->colsum[j0 + j] += (float)sum[j];
		return;
	}
	/* op(B)[k][j] = B[j][k]: a transposing copy, 8 x 8 at a time */
	for (int k0 = 0; k0 < K; k0 += 8) {
		int kn = K - k0 < 8 ? K - k0 : 8;
		for (int jb = 0; jb < GEMM_NR; jb += 8) {
			__m256 v[8];
			const float *src = g->B + (size_t)(j0 + jb) * g->ldb + k0;
			if (kn == 8 && jb + 8 <= nr) {
				for (int j = 0; j < 8; j++)
					v[j] = _mm256_loadu_ps(src + (size_t)j * g->ldb);
			} else {
				float t[8][8];
				for (int j = 0; j < 8; j++)
					for (int k = 0; k < 8; k++)
						t[j][k] = jb + j < nr && k < kn ? src[(size_t)j * g->ldb + k]
						                                : 0.0f;
				for (int j = 0; j < 8; j++)
					v[j] = _mm256_loadu_ps(t[j]);
			}
			transpose8(v);
			float *d = dst + (size_t)(jb / 16) * K * 16 + jb % 16;
			for (int k = 0; k < kn; k++)
				_mm256_store_ps(d + (size_t)(k0 + k) * 16, v[k]);
		}
	}
}

/* Rows i0..i0+mc of op(A), columns k0..k0+kc, in micro-panels of MR rows:
 * ap[r * kc * MR + k * MR + i] = op(A)[i0 + r MR + i][k0 + k], zero
 * past the mc rows. */
GEMM_AVX2 static void pack_a_block_avx2(const gemm_args *g, float *ap, int i0, int mc, int k0, int kc)
{
	int npan = (mc + MR - 1) / MR;
	if (g->ta) {
		/* op(A)[i][k] = A[k][i]: the tile's rows are contiguous in each
		 * row of A; read them once per k, 6 to each micro-panel */
		for (int k = 0; k < kc; k++) {
			const float *s = g->A + (size_t)(k0 + k) * g->lda + i0;
			for (int r = 0; r < npan; r++) {
				float *d = ap + ((size_t)r * kc + k) * MR;
				int rows = mc - r * MR < MR ? mc - r * MR : MR;
				if (rows == MR) {
					__m128 lo = _mm_loadu_ps(s + r * MR);
					__m128 hi = _mm_loadl_pi(_mm_setzero_ps(),
					                         (const __m64 *)(s + r * MR + 4));
					store6(d, _mm256_set_m128(hi, lo));
				} else {
					for (int i = 0; i < MR; i++)
						d[i] = i < rows ? s[r * MR + i] : 0.0f;
				}
			}
		}
		return;
	}
	for (int r = 0; r < npan; r++) {
		float *d = ap + (size_t)r * kc * MR;
		int rows = mc - r * MR < MR ? mc - r * MR : MR, ib = i0 + r * MR;
		/* op(A) = A: row i of the panel is contiguous in k; 8 k of the 6
		 * rows (and 2 of zeros) transposed at a time */
		const float *s = g->A + (size_t)ib * g->lda + k0;
		int k = 0;
		for (; k + 8 <= kc; k += 8) {
			__m256 v[8];
			for (int i = 0; i < 8; i++)
				v[i] = i < rows ? _mm256_loadu_ps(s + (size_t)i * g->lda + k)
				                : _mm256_setzero_ps();
			transpose8(v);
			for (int j = 0; j < 8; j++)
				store6(d + (size_t)(k + j) * MR, v[j]);
		}
		for (; k < kc; k++)
			for (int i = 0; i < MR; i++)
				d[(size_t)k * MR + i] = i < rows ? s[(size_t)i * g->lda + k] : 0.0f;
	}
}

/* The first n (clamped to 0..8) lanes of a vector, as a maskload mask. */
GEMM_AVX2 static inline __m256i mask8(int n)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 16 floats of a row at p, the first n of them (the rest read as 0). */
GEMM_AVX2 static inline void load16(const float *p, int n, __m256 *v0, __m256 *v1)
{
	if (n >= 16) {
		*v0 = _mm256_loadu_ps(p);
		*v1 = _mm256_loadu_ps(p + 8);
	} else {
		*v0 = _mm256_maskload_ps(p, mask8(n));
		*v1 = _mm256_maskload_ps(p + 8, mask8(n - 8));
	}
}

/* store_row for a row of n <= 16 floats: the same operations. */
GEMM_AVX2 static inline void store_row_avx2(float *c, const float *r, const float *bias, __m256 v0, __m256 v1,
                                            int n, float alpha, float beta, bool first)
{
	__m256 b0, b1;
	if (alpha != 1.0f) {
		__m256 al = _mm256_set1_ps(alpha);
		v0 = _mm256_mul_ps(al, v0);
		v1 = _mm256_mul_ps(al, v1);
	}
	if (!first) {
		load16(c, n, &b0, &b1);
		v0 = _mm256_add_ps(b0, v0);
		v1 = _mm256_add_ps(b1, v1);
	} else {
		bool have = true;
		if (r) {
			load16(r, n, &b0, &b1);
		} else if (beta == 0.0f) {
			have = false;
			b0 = b1 = _mm256_setzero_ps();
		} else {
			load16(c, n, &b0, &b1);
			if (beta != 1.0f) {
				__m256 be = _mm256_set1_ps(beta);
				b0 = _mm256_mul_ps(be, b0);
				b1 = _mm256_mul_ps(be, b1);
			}
		}
		if (bias) {
			__m256 x0, x1;
			load16(bias, n, &x0, &x1);
			b0 = have ? _mm256_add_ps(b0, x0) : x0;
			b1 = have ? _mm256_add_ps(b1, x1) : x1;
			have = true;
		}
		if (have) {
			v0 = _mm256_add_ps(b0, v0);
			v1 = _mm256_add_ps(b1, v1);
		}
	}
	if (n >= 16) {
		_mm256_storeu_ps(c, v0);
		_mm256_storeu_ps(c + 8, v1);
	} else {
		_mm256_maskstore_ps(c, mask8(n), v0);
		_mm256_maskstore_ps(c + 8, mask8(n - 8), v1);
	}
}

/* C block [mr, nr] (mr <= MR, nr <= 16) at c: the epilogue of
 * a[kc x MR] times b[kc x 16], both packed. */
GEMM_AVX2 static void micro_kernel_avx2(int kc, const float *restrict a, const float *restrict b, float *c,
                                        int ldc, const float *r, const float *bias, int mr, int nr,
                                        float alpha, float beta, bool first)
{
	gemm_prefetch_block(c, r, ldc, mr, nr);
	/* clang-format off */
	__m256 c0a = _mm256_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a,
	       c3b = c0a, c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a;
	/* (one FMA row a macro, laid out as the register tile) */
	/* unrolled: fewer loop instructions between the FMAs (measured
	 * 70-85 -> 85-95 GFLOP/s from L1 on a Zen 3 core) */
	#pragma GCC unroll 4
	for (int k = 0; k < kc; k++) {
		__m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), x;
		/* op(A) streams from L2: ask for it 16 k ahead */
		_mm_prefetch((const char *)(a + 16 * MR), _MM_HINT_T0);
#define ROW(i) \
		x = _mm256_broadcast_ss(a + i); \
		c##i##a = _mm256_fmadd_ps(x, b0, c##i##a); \
		c##i##b = _mm256_fmadd_ps(x, b1, c##i##b);
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
		a += MR;
		b += 16;
	}
	/* clang-format on */
	__m256 acc[MR][2] = {
		{ c0a, c0b }, { c1a, c1b }, { c2a, c2b }, { c3a, c3b }, { c4a, c4b }, { c5a, c5b },
	};
	for (int i = 0; i < mr; i++)
		store_row_avx2(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL, bias, acc[i][0],
		               acc[i][1], nr, alpha, beta, first);
}

static void prepare(gemm_args *g)
{
	g->kcp = g->kc;
	g->bpanel = (size_t)g->K * GEMM_NR;
}

static size_t a_panel_floats(const gemm_args *g, int kc) { return (size_t)kc * MR; }

/* Half jo / 16 of panel p: its K block kb at jo * K + k0 * 16. */
GEMM_AVX2 static void block(const gemm_args *g, const float *a, int p, int jo, const gemm_block *blk)
{
	const float *b = g->bp + (size_t)p * g->bpanel;
	micro_kernel_avx2(blk->kc, a, b + (size_t)jo * g->K + (size_t)blk->k0 * NW, blk->c, g->ldc, blk->r,
	                  blk->bias, blk->mr, blk->nr, g->alpha, blk->beta, blk->first);
}

const gemm_kernel gemm_kernel_avx2 = {
	.kind = KERN_GEMM_AVX2,
	.mr = MR,
	.nw = NW,
	.ncp = NCP,
	.prepare = prepare,
	.a_panel_floats = a_panel_floats,
	.pack_b = pack_b_panel_avx2,
	.pack_a = pack_a_block_avx2,
	.block = block,
};

#endif
