/* cotrain kernels: the GEMM driver's AMX-BF16 kernel (gemm_kernel_amx),
 * used where the CPU has AMX-BF16 and op(A) is not transposed (the driver
 * takes the AVX-512 kernel for the others).  See gemm_kernel.h for its
 * interface and doc/kernels.md ("The AMX kernel").
 *
 * fp32 products on the bf16 tile unit, to fp32 accuracy.  Each operand is
 * split into three bf16 parts, x = h + m + l (8 significant bits each, 24
 * in all: exact but for denormals, which the unit reads as zero), and a
 * product is the six largest of the nine cross terms, hh + hm + hl + mh +
 * mm + lh: those dropped (ml, lm, ll) are below 2^-24 of it.  The unit
 * multiplies bf16 pairs exactly and accumulates in fp32, in a fixed order,
 * so results do not depend on the thread count either.  The epilogue is
 * the AVX-512 kernel's (gemm_avx512.h), applied from the tiles stored to
 * the stack.
 *
 * Packed layout, per micro-panel of op(A) (MR = 32 rows) or panel of
 * op(B) (GEMM_NR = 32 columns), per K block (kcp k, zero past kc), per
 * chunk of KCH = 32 k: the three parts h, m, l, each as two tiles of 16
 * rows x 64 bytes.  An A tile holds 16 rows of 32 k; a B tile 16 pairs of
 * k by 16 columns, each row (k, k+1) interleaved per column, as TDPBF16PS
 * reads them.  A chunk is 3 x 2 x 512 bf16 = 6 KiB. */
#include "kernels/gemm_avx512.h"

#if GEMM_X86

#include <stdint.h>

enum {
	MR = 32,  /* rows of the kernel's C block (two 16-row tiles) */
	KCH = 32, /* k per tile (16 pairs of bf16) */
	NCP = 16  /* panels (of GEMM_NR columns) in a chunk: 512 columns */
};

enum { TILE_BF16 = 512, CHUNK_BF16 = 3 * 2 * TILE_BF16 };

/* Eight tiles of 16 rows x 64 bytes: C in 0-3 (rows 0-15 / 16-31 by
 * columns 0-15 / 16-31), A in 4-5, B in 6-7. */
static const struct {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} amx_cfg = {
	1, 0, { 0 }, { 64, 64, 64, 64, 64, 64, 64, 64 }, { 16, 16, 16, 16, 16, 16, 16, 16 },
};

/* The three bf16 parts of 32 floats, lo's 16 in the low half of each
 * part[s]: x = h + m + l. */
GEMM_AMX static inline __attribute__((always_inline)) void split3(__m512 lo, __m512 hi, __m512i part[3])
{
	for (int s = 0; s < 3; s++) {
		__m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
		part[s] = v;
		__m512 flo = _mm512_castsi512_ps(
		        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
		__m512 fhi = _mm512_castsi512_ps(
		        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
		lo = _mm512_sub_ps(lo, flo);
		hi = _mm512_sub_ps(hi, fhi);
	}
}

/* 32 bf16 (a in the low half, b in the high) as 16 pairs (a[n], b[n]). */
GEMM_AMX static inline __attribute__((always_inline)) __m512i interleave(__m512i v)
{
	const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23,
	                                     7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	return _mm512_permutexvar_epi16(idx, v);
}

/* Panel p of op(B) in the AMX layout (and colsum, as pack_b_panel). */
GEMM_AMX static void pack_b_panel_amx(const gemm_args *g, int p)
{
	int j0 = p * GEMM_NR, nr = g->N - j0 < GEMM_NR ? g->N - j0 : GEMM_NR;
	uint16_t *dst = (uint16_t *)(g->bp + (size_t)p * g->bpanel);
	__m512d sum[4] = { _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
		           _mm512_setzero_pd() };
	for (int kb = 0; kb < g->nkb; kb++) {
		int k0 = kb * g->kc, kc = g->K - k0 < g->kc ? g->K - k0 : g->kc;
		uint16_t *d = dst + (size_t)kb * g->kcp * GEMM_NR * 3;
		for (int c = 0; c < g->kcp; c += KCH, d += CHUNK_BF16) {
			if (!g->tb) {
				/* rows k, k + 1 of B interleaved per column */
				for (int kp = 0; kp < KCH / 2; kp++) {
					int k = c + 2 * kp;
					for (int h = 0; h < 2; h++) {
						__mmask16 m = mask_n(nr - 16 * h);
						const float *src =
						        g->B + (size_t)(k0 + k) * g->ldb + j0 + 16 * h;
						/* the panel reads 128 bytes of each row of
						 * B, a whole row apart: fetch 16 rows ahead */
						_mm_prefetch((const char *)(src + 16 * (size_t)g->ldb),
						             _MM_HINT_T0);
						_mm_prefetch((const char *)(src + 17 * (size_t)g->ldb),
						             _MM_HINT_T0);
						__m512 x0 = k < kc ? _mm512_maskz_loadu_ps(m, src)
						                   : _mm512_setzero_ps();
						__m512 x1 = k + 1 < kc
						                    ? _mm512_maskz_loadu_ps(m, src + g->ldb)
						                    : _mm512_setzero_ps();
						if (g->colsum) { /* kern_colsum_add's sums: rows in order */
							for (int q = 0; q < 2 && k + q < kc; q++)
								colsum_add16(sum + 2 * h, q ? x1 : x0);
						}
						__m512i part[3];
						split3(x0, x1, part);
						for (int s = 0; s < 3; s++)
							_mm512_store_si512(d + s * 2 * TILE_BF16 +
							                           h * TILE_BF16 + kp * 32,
							                   interleave(part[s]));
					}
				}
				continue;
			}
			/* op(B)[k][j] = B[j][k]: each row of B holds its column's
			 * pairs in place; split, then transpose 16 x 16 pairs */
			for (int h = 0; h < 2; h++) {
				__m512 v[3][16];
				int rows = nr - 16 * h;
				for (int i = 0; i < 16; i++) {
					__m512i part[3];
					if (i < rows) {
						const float *src =
						        g->B + (size_t)(j0 + 16 * h + i) * g->ldb + k0 + c;
						split3(_mm512_maskz_loadu_ps(mask_n(kc - c), src),
						       _mm512_maskz_loadu_ps(mask_n(kc - c - 16), src + 16),
						       part);
					} else {
						part[0] = part[1] = part[2] = _mm512_setzero_si512();
					}
					for (int s = 0; s < 3; s++)
						v[s][i] = _mm512_castsi512_ps(part[s]);
				}
				for (int s = 0; s < 3; s++) {
					transpose16(v[s]);
					for (int kp = 0; kp < 16; kp++)
						_mm512_store_ps(d + s * 2 * TILE_BF16 + h * TILE_BF16 +
						                        kp * 32,
						                v[s][kp]);
				}
			}
		}
	}
	if (g->colsum && !g->tb)
		colsum_flush(g, j0, nr, sum);
}

/* Rows i0..i0+mc of op(A) (not transposed: the AMX kernel is used only
 * then), columns k0..k0+kc, in the AMX layout (one K block, kcp k, zero
 * past kc and past the mc rows) at ap. */
GEMM_AMX static void pack_a_block_amx(const gemm_args *g, float *ap, int i0, int mc, int k0, int kc)
{
	int npan = (mc + MR - 1) / MR;
	for (int r = 0; r < npan; r++) {
		uint16_t *d = (uint16_t *)ap + (size_t)r * g->kcp * MR * 3;
		for (int c = 0; c < g->kcp; c += KCH, d += CHUNK_BF16) {
			/* a row of op(A) is a row of a tile */
			for (int i = 0; i < MR; i++) {
				__m512i part[3];
				if (r * MR + i < mc) {
					const float *src = g->A + (size_t)(i0 + r * MR + i) * g->lda + k0 + c;
					_mm_prefetch((const char *)(src + KCH), _MM_HINT_T0);
					_mm_prefetch((const char *)(src + KCH + 16), _MM_HINT_T0);
					split3(_mm512_maskz_loadu_ps(mask_n(kc - c), src),
					       _mm512_maskz_loadu_ps(mask_n(kc - c - 16), src + 16), part);
				} else {
					part[0] = part[1] = part[2] = _mm512_setzero_si512();
				}
				for (int s = 0; s < 3; s++)
					_mm512_store_si512(d + s * 2 * TILE_BF16 + (i / 16) * TILE_BF16 +
					                           (i % 16) * 32,
					                   part[s]);
			}
		}
	}
}

/* This thread's tiles configured as amx_cfg, for amx_kernel: at the start
 * of a run of blocks (gemm_kernel.tile_begin). */
GEMM_AMX static void amx_begin(void) { _tile_loadconfig(&amx_cfg); }

/* The tiles released at the end of the run (tile_end), so that the
 * thread's tile state is not kept live outside the driver. */
GEMM_AMX static void amx_end(void) { _tile_release(); }

/* C block [mr, nr] (mr <= MR, nr <= GEMM_NR) at c: the epilogue of nch chunks
 * of packed a (32 rows) times packed b (32 columns), tiles configured by
 * amx_begin(). */
GEMM_AMX static void amx_kernel(int nch, const uint16_t *a, const uint16_t *b, float *c, int ldc,
                                const float *r, const float *bias, int mr, int nr, float alpha, float beta,
                                bool first)
{
	/* the packing's stores must land before the tile loads read them */
	__asm__ volatile("" ::: "memory");
	gemm_prefetch_block(c, r, ldc, mr, nr);
	_tile_zero(0);
	_tile_zero(1);
	_tile_zero(2);
	_tile_zero(3);
#define DP4() \
	do { \
		_tile_dpbf16ps(0, 4, 6); \
		_tile_dpbf16ps(1, 4, 7); \
		_tile_dpbf16ps(2, 5, 6); \
		_tile_dpbf16ps(3, 5, 7); \
	} while (0)
#define LOAD_A(s) \
	do { \
		_tile_loadd(4, a + (s)*2 * TILE_BF16, 64); \
		_tile_loadd(5, a + (s)*2 * TILE_BF16 + TILE_BF16, 64); \
	} while (0)
#define LOAD_B(s) \
	do { \
		_tile_loadd(6, b + (s)*2 * TILE_BF16, 64); \
		_tile_loadd(7, b + (s)*2 * TILE_BF16 + TILE_BF16, 64); \
	} while (0)
	/* per chunk, in this order: hh hm hl mh mm lh (A's tiles kept while
	 * B's change: 18 tile loads for 24 products) */
	for (int ch = 0; ch < nch; ch++, a += CHUNK_BF16, b += CHUNK_BF16) {
		LOAD_A(0);
		LOAD_B(0);
		DP4();
		LOAD_B(1);
		DP4();
		LOAD_B(2);
		DP4();
		LOAD_A(1);
		LOAD_B(0);
		DP4();
		LOAD_B(1);
		DP4();
		LOAD_A(2);
		LOAD_B(0);
		DP4();
	}
#undef DP4
#undef LOAD_A
#undef LOAD_B
	float s[MR * GEMM_NR] __attribute__((aligned(64)));
	_tile_stored(0, s, GEMM_NR * sizeof(float));
	_tile_stored(1, s + 16, GEMM_NR * sizeof(float));
	_tile_stored(2, s + 16 * GEMM_NR, GEMM_NR * sizeof(float));
	_tile_stored(3, s + 16 * GEMM_NR + 16, GEMM_NR * sizeof(float));
	__asm__ volatile("" : : "r"(s) : "memory");
	__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
	for (int i = 0; i < mr; i++)
		store_row(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL, bias,
		          _mm512_load_ps(s + i * GEMM_NR), _mm512_load_ps(s + i * GEMM_NR + 16), m0, m1,
		          alpha, beta, first);
}

/* K blocks padded to whole tiles: kcp k each, all three parts. */
static void prepare(gemm_args *g)
{
	g->kcp = (g->kc + KCH - 1) / KCH * KCH;
	g->bpanel = (size_t)g->nkb * g->kcp * GEMM_NR * 3 / 2;
}

static size_t a_panel_floats(const gemm_args *g, int kc) { return (size_t)g->kcp * MR * 3 / 2; }

GEMM_AMX static void block(const gemm_args *g, const float *a, int p, int jo, const gemm_block *blk)
{
	const float *b = g->bp + (size_t)p * g->bpanel;
	amx_kernel(g->kcp / KCH, (const uint16_t *)a,
	           (const uint16_t *)(b + (size_t)blk->kb * g->kcp * GEMM_NR * 3 / 2), blk->c, g->ldc, blk->r,
	           blk->bias, blk->mr, blk->nr, g->alpha, blk->beta, blk->first);
}

const gemm_kernel gemm_kernel_amx = {
	.kind = KERN_GEMM_AMX,
	.mr = MR,
	.nw = GEMM_NR,
	.ncp = NCP,
	.prepare = prepare,
	.a_panel_floats = a_panel_floats,
	.pack_b = pack_b_panel_amx,
	.pack_a = pack_a_block_amx,
	.tile_begin = amx_begin,
	.tile_end = amx_end,
	.block = block,
};

#endif
