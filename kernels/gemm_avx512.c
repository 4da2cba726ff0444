/* cotrain kernels: the GEMM driver's AVX-512 kernel (gemm_kernel_avx512).
 * See gemm_kernel.h for its interface and doc/kernels.md ("The GEMM
 * driver").
 *
 * Layout (BLIS's, transposed for row-major C): op(B) in panels of
 * GEMM_NR = 32 columns, panel p holding op(B)[k][32p .. 32p+31] for
 * k = 0..K-1 contiguously (columns past N zero); op(A) in micro-panels of
 * MR = 12 rows, k-major, per K block (rows past M zero).  The micro-kernel
 * keeps a 12 x 32 block of C in 24 zmm registers, one fused multiply-add
 * per (row, half, k), and adds it to C once per K block through the
 * epilogue (bias, residual, beta, alpha; masked at the edges).  A tile
 * keeps each micro-panel of op(A) (12 x KC) in L1 while its chunk's
 * panels of op(B) (KC x 512 columns, 512 KiB) come from L2. */
#include "kernels/gemm_avx512.h"

#if GEMM_X86

enum {
	MR = 12, /* rows of the micro-kernel's C block */
	NCP = 16 /* panels (of GEMM_NR columns) in a chunk: 512 columns */
};

/* Columns k0..k0+kn (kn <= 16) of nrows <= 16 rows at src (row stride ld)
 * as kn vectors: v[k] lane i = src[i][k0 + k], rows past nrows zero. */
GEMM_AVX512 static inline __attribute__((always_inline)) void load_t16(__m512 v[16], const float *src,
                                                                       long ld, int nrows, int kn)
{
	__mmask16 m = mask_n(kn);
	for (int i = 0; i < 16; i++)
		v[i] = i < nrows ? _mm512_maskz_loadu_ps(m, src + i * ld) : _mm512_setzero_ps();
	transpose16(v);
}

/* Panel p of op(B): bp[k * GEMM_NR + j] = op(B)[k][GEMM_NR p + j], zero past N. */
GEMM_AVX512 static void pack_b_panel(const gemm_args *g, int p)
{
	int j0 = p * GEMM_NR, nr = g->N - j0 < GEMM_NR ? g->N - j0 : GEMM_NR, K = g->K;
	float *dst = g->bp + (size_t)p * K * GEMM_NR;
	if (!g->tb) {
		__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
		if (!g->colsum) {
			for (int k = 0; k < K; k++) {
				const float *s = g->B + (size_t)k * g->ldb + j0;
				_mm512_store_ps(dst + (size_t)k * GEMM_NR, _mm512_maskz_loadu_ps(m0, s));
				_mm512_store_ps(dst + (size_t)k * GEMM_NR + 16,
				                _mm512_maskz_loadu_ps(m1, s + 16));
			}
			return;
		}
		/* the same copy, summing each column in double in row order on
		 * the way: kern_colsum_add's operations exactly */
		__m512d sum[4] = { _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
			           _mm512_setzero_pd() };
		for (int k = 0; k < K; k++) {
			const float *s = g->B + (size_t)k * g->ldb + j0;
			__m512 v0 = _mm512_maskz_loadu_ps(m0, s), v1 = _mm512_maskz_loadu_ps(m1, s + 16);
			_mm512_store_ps(dst + (size_t)k * GEMM_NR, v0);
			_mm512_store_ps(dst + (size_t)k * GEMM_NR + 16, v1);
			colsum_add16(sum, v0);
			colsum_add16(sum + 2, v1);
		}
		colsum_flush(g, j0, nr, sum);
		return;
	}
	/* op(B)[k][j] = B[j][k]: a transposing copy, 16 x 16 at a time */
	for (int k0 = 0; k0 < K; k0 += 16) {
		int kn = K - k0 < 16 ? K - k0 : 16;
		for (int h = 0; h < 2; h++) {
			__m512 v[16];
			int rows = nr - 16 * h;
			rows = rows < 0 ? 0 : rows > 16 ? 16 : rows;
			load_t16(v, g->B + (size_t)(j0 + 16 * h) * g->ldb + k0, g->ldb, rows, kn);
			for (int k = 0; k < kn; k++)
				_mm512_store_ps(dst + (size_t)(k0 + k) * GEMM_NR + 16 * h, v[k]);
		}
	}
}

/* Rows i0..i0+mc of op(A), columns k0..k0+kc, into micro-panels:
 * ap[r * kc * MR + k * MR + i] = op(A)[i0 + r MR + i][k0 + k], zero past
 * the mc rows. */
GEMM_AVX512 static void pack_a_block(const gemm_args *g, float *ap, int i0, int mc, int k0, int kc)
{
	int npan = (mc + MR - 1) / MR;
	if (g->ta) {
		/* op(A)[i][k] = A[k][i]: the tile's rows are contiguous in each
		 * row of A; read them once per k, 12 to each micro-panel */
		for (int k = 0; k < kc; k++) {
			const float *s = g->A + (size_t)(k0 + k) * g->lda + i0;
			for (int r = 0; r < npan; r++) {
				int rows = mc - r * MR < MR ? mc - r * MR : MR;
				__mmask16 m = mask_n(rows);
				_mm512_mask_storeu_ps(ap + ((size_t)r * kc + k) * MR, 0x0fff,
				                      _mm512_maskz_loadu_ps(m, s + r * MR));
			}
		}
		return;
	}
	for (int r = 0; r < npan; r++) {
		float *d = ap + (size_t)r * kc * MR;
		int rows = mc - r * MR < MR ? mc - r * MR : MR;
		int ib = i0 + r * MR;
		/* op(A) = A: a transposing copy, 12 rows x 16 k at a time */
		for (int k = 0; k < kc; k += 16) {
			int kn = kc - k < 16 ? kc - k : 16;
			__m512 v[16];
			load_t16(v, g->A + (size_t)ib * g->lda + k0 + k, g->lda, rows, kn);
			for (int j = 0; j < kn; j++)
				_mm512_mask_storeu_ps(d + (size_t)(k + j) * MR, 0x0fff, v[j]);
		}
	}
}

/* C block [mr, nr] (mr <= MR, nr <= GEMM_NR) at c: the epilogue of
 * a[kc x MR] times b[kc x GEMM_NR], both packed. */
GEMM_AVX512 static void micro_kernel(int kc, const float *restrict a, const float *restrict b, float *c,
                                     int ldc, const float *r, const float *bias, int mr, int nr, float alpha,
                                     float beta, bool first)
{
	__m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a,
	       c3b = c0a, c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a, c6a = c0a, c6b = c0a, c7a = c0a,
	       c7b = c0a, c8a = c0a, c8b = c0a, c9a = c0a, c9b = c0a, c10a = c0a, c10b = c0a, c11a = c0a,
	       c11b = c0a;
	gemm_prefetch_block(c, r, ldc, mr, nr);
	/* clang-format off */
	/* (one FMA row a macro, laid out as the register tile) */
	for (int k = 0; k < kc; k++) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), x;
		/* op(B) streams from L2 (from L3 on a chunk's first pass): ask
		 * for it 24 k ahead (measured 5-12% faster than the hardware
		 * prefetchers alone, distances 16-32 alike) */
		_mm_prefetch((const char *)(b + 24 * GEMM_NR), _MM_HINT_T0);
		_mm_prefetch((const char *)(b + 24 * GEMM_NR + 16), _MM_HINT_T0);
#define ROW(i) \
		x = _mm512_set1_ps(a[i]); \
		c##i##a = _mm512_fmadd_ps(x, b0, c##i##a); \
		c##i##b = _mm512_fmadd_ps(x, b1, c##i##b);
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
		ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#undef ROW
		a += MR;
		b += GEMM_NR;
	}
	/* clang-format on */
	__m512 acc[MR][2] = {
		{ c0a, c0b }, { c1a, c1b }, { c2a, c2b }, { c3a, c3b }, { c4a, c4b },   { c5a, c5b },
		{ c6a, c6b }, { c7a, c7b }, { c8a, c8b }, { c9a, c9b }, { c10a, c10b }, { c11a, c11b },
	};
	__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
	for (int i = 0; i < mr; i++)
		store_row(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL, bias, acc[i][0], acc[i][1], m0,
		          m1, alpha, beta, first);
}

static void prepare(gemm_args *g)
{
	g->kcp = g->kc;
	g->bpanel = (size_t)g->K * GEMM_NR;
}

static size_t a_panel_floats(const gemm_args *g, int kc) { return (size_t)kc * MR; }

GEMM_AVX512 static void block(const gemm_args *g, const float *a, int p, int jo, const gemm_block *blk)
{
	const float *b = g->bp + (size_t)p * g->bpanel;
	micro_kernel(blk->kc, a, b + (size_t)blk->k0 * GEMM_NR, blk->c, g->ldc, blk->r, blk->bias, blk->mr,
	             blk->nr, g->alpha, blk->beta, blk->first);
}

const gemm_kernel gemm_kernel_avx512 = {
	.kind = KERN_GEMM_AVX512,
	.mr = MR,
	.nw = GEMM_NR,
	.ncp = NCP,
	.prepare = prepare,
	.a_panel_floats = a_panel_floats,
	.pack_b = pack_b_panel,
	.pack_a = pack_a_block,
	.block = block,
};

#endif
