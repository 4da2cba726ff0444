/* cotrain kernels: the CPU backend's own GEMM driver.  See gemm.h and
 * doc/kernels.md ("The GEMM driver").
 *
 * Layout (BLIS's, transposed for row-major C):
 *  - op(B) [K,N] is packed once per call into panels of NR = 32 columns,
 *    panel p holding op(B)[k][32p .. 32p+31] for k = 0..K-1 contiguously
 *    (columns past N zero), the panels shared by all threads;
 *  - C is cut into tiles of up to MC_MAX rows (by all columns, or by a
 *    column group when there would be too few tiles); threads take the
 *    next tile.  A tile's rows of op(A) are packed into micro-panels of
 *    MR = 12 rows (k-major, rows past M zero), per K block, in the
 *    thread's buffer (or all up front, shared, when columns are split);
 *    the tile's columns are walked in chunks of NCP panels and, per chunk,
 *    the K blocks in order, running the micro-kernel over every
 *    (micro-panel, panel) pair: the A micro-panel (12 x KC) stays in L1
 *    while the chunk's B block (KC x 512 columns, 512 KiB) comes from L2;
 *  - the micro-kernel keeps a 12 x 32 block of C in 24 zmm registers, one
 *    fused multiply-add per (row, half, k), and adds it to C once per K
 *    block through the epilogue (bias, residual, beta, alpha; masked at the
 *    edges), then the optional GELU post-op on the finished block.
 * On a CPU with AMX-BF16, products whose op(A) is not transposed use the
 * AMX kernel instead (32 x 32 blocks of C on the tile unit, fp32 accuracy
 * from three bf16 parts per operand: "the AMX kernel" below), with the same
 * tiles, K blocks and epilogues.  A CPU with AVX2 but not AVX-512 uses the
 * AVX2 kernel (6 x 16 blocks, the same operations per element: "the AVX2
 * kernel" below), with the same tiles and K blocks.
 * Every function here that runs AVX2, AVX-512 or AMX code is compiled for
 * it with a target attribute and reached only when the call's kind
 * (kern_gemm_kind_now(), fixed per call) is that kernel. */
#include "kernels/gemm.h"

#include "kernels/gelu.h"

#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define GEMM_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f")))
#define AMX __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define GEMM_X86 0
#endif

enum {
	MR = 12,     /* rows of the micro-kernel's C block */
	MR2 = 6,     /* rows of the AVX2 kernel's C block */
	MRA = 32,    /* rows of the AMX kernel's C block (two 16-row tiles) */
	KCH = 32,    /* k per AMX tile (16 pairs of bf16) */
	NR = 32,     /* columns: two 16-float vectors */
	MC_MAX = 240, /* the most rows in a tile: 20 micro-panels */
	NCP = 16,    /* panels (of NR columns) in a chunk: 512 columns */
	NCP2 = 8,    /* the same for the AVX2 kernel (smaller L2 caches) */
	KC_MAX = 256 /* the longest K block */
};

/* ---- buffers: the calling thread's, reused between calls ------------- */

typedef struct gemm_bufs {
	float *b;        /* packed op(B) */
	size_t b_n;      /* floats it holds */
	float *a;        /* per-thread packed rows of op(A) */
	size_t a_n;      /* floats it holds */
} gemm_bufs;

static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;
static bool bufs_key_ok;

static void bufs_free(void *p)
{
	gemm_bufs *g = p;
	if (!g)
		return;
	free(g->b);
	free(g->a);
	free(g);
}

static void bufs_init(void)
{
	bufs_key_ok = pthread_key_create(&bufs_key, bufs_free) == 0;
}

/* *p holds at least n floats (*have of them, 64-byte aligned) on true;
 * on false (out of memory) *p is NULL and *have 0.  Old contents are not
 * kept. */
static bool grow_floats(float **p, size_t *have, size_t n)
{
	if (*have >= n)
		return true;
	free(*p);
	*have = 0;
	size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
	if (!(*p = aligned_alloc(64, bytes ? bytes : 64)))
		return false;
	*have = n;
	return true;
}

/* The calling thread's buffers with room for nb floats of packed B and na
 * of packed A, or NULL when memory is short. */
static gemm_bufs *bufs_get(size_t nb, size_t na)
{
	pthread_once(&bufs_once, bufs_init);
	if (!bufs_key_ok)
		return NULL;
	gemm_bufs *g = pthread_getspecific(bufs_key);
	if (!g) {
		g = calloc(1, sizeof *g);
		if (!g || pthread_setspecific(bufs_key, g) != 0) {
			free(g);
			return NULL;
		}
	}
	if (!grow_floats(&g->b, &g->b_n, nb) || !grow_floats(&g->a, &g->a_n, na))
		return NULL;
	return g;
}

/* ---- which kernel ---------------------------------------------------- */

static int best = -1;     /* the best kernel this CPU runs (kern_gemm_kind) */
static int kind_now = -1; /* the kernel in use */
static pthread_once_t kind_once = PTHREAD_ONCE_INIT;

#if GEMM_X86
/* AMX-BF16 and AVX512-BF16 on this CPU, and the kernel's permission for
 * this process to use the tile data (Linux asks for it since 5.16: the
 * 8 KiB of tile state is saved only for processes that request it). */
static bool amx_init(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)
	    || !(d & (1u << 22)) || !(d & (1u << 24)))  /* AMX-BF16, AMX-TILE */
		return false;
	if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5)))
		return false;                               /* AVX512-BF16 */
	enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

static void kind_init(void)
{
	int b = KERN_GEMM_BLAS;
#if GEMM_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		b = KERN_GEMM_AVX2;
	if (__builtin_cpu_supports("avx512f"))
		b = KERN_GEMM_AVX512;
	if (b == KERN_GEMM_AVX512 && __builtin_cpu_supports("avx512bw") && amx_init())
		b = KERN_GEMM_AMX;
#endif
	int cap = b;
	const char *e = getenv("COTRAIN_GEMM");
	for (int k = KERN_GEMM_BLAS; e && k <= KERN_GEMM_AVX512; k++)
		if (strcmp(e, kern_gemm_kind_name(k)) == 0)
			cap = k;
	best = b;
	kind_now = cap < b ? cap : b;
}

const char *kern_gemm_kind_name(kern_gemm_kind k)
{
	switch (k) {
	case KERN_GEMM_AVX2: return "avx2";
	case KERN_GEMM_AVX512: return "avx512";
	case KERN_GEMM_AMX: return "amx";
	default: return "blas";
	}
}

kern_gemm_kind kern_gemm_kind_now(void)
{
	pthread_once(&kind_once, kind_init);
	return (kern_gemm_kind)__atomic_load_n(&kind_now, __ATOMIC_RELAXED);
}

bool kern_gemm_use(kern_gemm_kind k)
{
	pthread_once(&kind_once, kind_init);
	if ((int)k < KERN_GEMM_BLAS || (int)k > best)
		return false;
	__atomic_store_n(&kind_now, (int)k, __ATOMIC_RELAXED);
	return true;
}

bool kern_gemm_usable(void)
{
	return kern_gemm_kind_now() != KERN_GEMM_BLAS;
}

#if GEMM_X86

/* ---- packing --------------------------------------------------------- */

typedef struct gemm_args {
	bool ta, tb;
	int M, N, K, lda, ldb, ldc;
	int kc, nkb;          /* K block length (the last may be shorter), count */
	int npanels, upan, mc, nrt, nct;  /* mc: the most rows in a tile */
	kern_gemm_kind kind;  /* the kernel of this call: AVX2 (mr MR2), AVX-512
	                       * (MR) or AMX (MRA) */
	int mr;               /* rows of a micro-panel */
	int ncp;              /* panels in a chunk of columns */
	int kcp;              /* AMX: k per packed K block, kc rounded up to KCH */
	size_t bpanel;        /* floats of packed op(B) per panel */
	float alpha, beta;
	const float *A, *B, *bias, *R;
	float *colsum;        /* += column sums of op(B), or NULL */
	bool a_shared;        /* op(A) packed for all row tiles up front */
	int post;             /* KERN_GEMM_GELU*: after the last K block */
	float *G;             /* the post-op's output, leading dimension ldc */
	const float *X;       /* its second input (GELU_BWD), the same */
	size_t aper;          /* floats of packed op(A) per row tile */
	float *C, *bp, *abase;
} gemm_args;

/* The first n (clamped to 0..16) lanes of a vector. */
static inline __mmask16 mask_n(int n)
{
	return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* Transpose 16 x 16: on entry r[i] is row i, on return r[k] is column k
 * (lane i = old row i). */
AVX512 static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
	__m512 t[16];
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	/* r[4i + e], 128-bit lane j: rows 4i..4i+3 of column 4j + e */
	for (int i = 0; i < 4; i++) {
		r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
		r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
		r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
		r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
	}
	for (int e = 0; e < 4; e++) {
		t[e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
		t[4 + e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
		t[8 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
		t[12 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
	}
	for (int e = 0; e < 4; e++) {
		r[e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0x88);
		r[8 + e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0xdd);
		r[4 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0x88);
		r[12 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0xdd);
	}
}

/* Columns k0..k0+kn (kn <= 16) of nrows <= 16 rows at src (row stride ld)
 * as kn vectors: v[k] lane i = src[i][k0 + k], rows past nrows zero. */
AVX512 static inline __attribute__((always_inline)) void load_t16(__m512 v[16], const float *src, long ld,
                                   int nrows, int kn)
{
	__mmask16 m = mask_n(kn);
	for (int i = 0; i < 16; i++)
		v[i] = i < nrows ? _mm512_maskz_loadu_ps(m, src + i * ld)
		                 : _mm512_setzero_ps();
	transpose16(v);
}

/* sum[0], sum[1] += the 16 floats of x (lanes 0-7, 8-15), in double:
 * one row of kern_colsum_add's additions. */
AVX512 static inline void colsum_add16(__m512d sum[2], __m512 x)
{
	sum[0] = _mm512_add_pd(sum[0], _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
	sum[1] = _mm512_add_pd(sum[1], _mm512_cvtps_pd(_mm256_castpd_ps(
	        _mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}

/* colsum[j0 + j] += sum's lane j (of NR), for the panel's nr columns. */
AVX512 static void colsum_flush(const gemm_args *g, int j0, int nr,
                                const __m512d sum[4])
{
	double out[NR];
	for (int q = 0; q < 4; q++)
		_mm512_storeu_pd(out + 8 * q, sum[q]);
	for (int j = 0; j < nr; j++)
		g->colsum[j0 + j] += (float)out[j];
}

/* Panel p of op(B): bp[k * NR + j] = op(B)[k][NR p + j], zero past N. */
AVX512 static void pack_b_panel(const gemm_args *g, int p)
{
	int j0 = p * NR, nr = g->N - j0 < NR ? g->N - j0 : NR, K = g->K;
	float *dst = g->bp + (size_t)p * K * NR;
	if (!g->tb) {
		__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
		if (!g->colsum) {
			for (int k = 0; k < K; k++) {
				const float *s = g->B + (size_t)k * g->ldb + j0;
				_mm512_store_ps(dst + (size_t)k * NR, _mm512_maskz_loadu_ps(m0, s));
				_mm512_store_ps(dst + (size_t)k * NR + 16,
				                _mm512_maskz_loadu_ps(m1, s + 16));
			}
			return;
		}
		/* the same copy, summing each column in double in row order on
		 * the way: kern_colsum_add's operations exactly */
		__m512d sum[4] = { _mm512_setzero_pd(), _mm512_setzero_pd(),
		                   _mm512_setzero_pd(), _mm512_setzero_pd() };
		for (int k = 0; k < K; k++) {
			const float *s = g->B + (size_t)k * g->ldb + j0;
			__m512 v0 = _mm512_maskz_loadu_ps(m0, s), v1 = _mm512_maskz_loadu_ps(m1, s + 16);
			_mm512_store_ps(dst + (size_t)k * NR, v0);
			_mm512_store_ps(dst + (size_t)k * NR + 16, v1);
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
			load_t16(v, g->B + (size_t)(j0 + 16 * h) * g->ldb + k0, g->ldb,
			         rows, kn);
			for (int k = 0; k < kn; k++)
				_mm512_store_ps(dst + (size_t)(k0 + k) * NR + 16 * h, v[k]);
		}
	}
}

/* Rows i0..i0+mc of op(A), columns k0..k0+kc, into micro-panels:
 * ap[r * kc * MR + k * MR + i] = op(A)[i0 + r MR + i][k0 + k], zero past
 * the mc rows. */
AVX512 static void pack_a_block(const gemm_args *g, float *ap, int i0, int mc,
                                int k0, int kc)
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

/* ---- the micro-kernel ------------------------------------------------ */

/* One row of the epilogue: c[0..nr) = base + alpha * acc, where base is
 * c's old value (later K blocks, or beta 1), beta * c, r, plus bias when
 * given (first block only), or nothing (beta 0, no bias). */
AVX512 static inline void store_row(float *c, const float *r, const float *bias,
                                    __m512 v0, __m512 v1, __mmask16 m0,
                                    __mmask16 m1, float alpha, float beta,
                                    bool first)
{
	if (alpha != 1.0f) {
		__m512 al = _mm512_set1_ps(alpha);
		v0 = _mm512_mul_ps(al, v0);
		v1 = _mm512_mul_ps(al, v1);
	}
	if (!first) {
		v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, c), v0);
		v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, c + 16), v1);
	} else {
		bool have = true;
		__m512 b0, b1;
		if (r) {
			b0 = _mm512_maskz_loadu_ps(m0, r);
			b1 = _mm512_maskz_loadu_ps(m1, r + 16);
		} else if (beta == 0.0f) {
			have = false;
			b0 = b1 = _mm512_setzero_ps();
		} else if (beta == 1.0f) {
			b0 = _mm512_maskz_loadu_ps(m0, c);
			b1 = _mm512_maskz_loadu_ps(m1, c + 16);
		} else {
			__m512 be = _mm512_set1_ps(beta);
			b0 = _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m0, c));
			b1 = _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m1, c + 16));
		}
		if (bias) {
			__m512 x0 = _mm512_maskz_loadu_ps(m0, bias);
			__m512 x1 = _mm512_maskz_loadu_ps(m1, bias + 16);
			b0 = have ? _mm512_add_ps(b0, x0) : x0;
			b1 = have ? _mm512_add_ps(b1, x1) : x1;
			have = true;
		}
		if (have) {
			v0 = _mm512_add_ps(b0, v0);
			v1 = _mm512_add_ps(b1, v1);
		}
	}
	_mm512_mask_storeu_ps(c, m0, v0);
	_mm512_mask_storeu_ps(c + 16, m1, v1);
}

/* The mr rows of nr floats at c (and at r, the residual, when given):
 * they come from L3 or memory, so a kernel fetches them while its
 * products run, not when its epilogue needs them. */
static inline __attribute__((always_inline)) void prefetch_block(
        const float *c, const float *r, int ldc, int mr, int nr)
{
	for (int i = 0; i < mr; i++) {
		_mm_prefetch((const char *)(c + (size_t)i * ldc), _MM_HINT_T0);
		_mm_prefetch((const char *)(c + (size_t)i * ldc + nr - 1), _MM_HINT_T0);
		if (r) {
			_mm_prefetch((const char *)(r + (size_t)i * ldc), _MM_HINT_T0);
			_mm_prefetch((const char *)(r + (size_t)i * ldc + nr - 1), _MM_HINT_T0);
		}
	}
}

/* C block [mr, nr] (mr <= MR, nr <= NR) at c: the epilogue of
 * a[kc x MR] times b[kc x NR], both packed. */
AVX512 static void micro_kernel(int kc, const float *restrict a,
                                const float *restrict b, float *c, int ldc,
                                const float *r, const float *bias, int mr,
                                int nr, float alpha, float beta, bool first)
{
	__m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a,
	       c2a = c0a, c2b = c0a, c3a = c0a, c3b = c0a, c4a = c0a, c4b = c0a,
	       c5a = c0a, c5b = c0a, c6a = c0a, c6b = c0a, c7a = c0a, c7b = c0a,
	       c8a = c0a, c8b = c0a, c9a = c0a, c9b = c0a, c10a = c0a, c10b = c0a,
	       c11a = c0a, c11b = c0a;
	prefetch_block(c, r, ldc, mr, nr);
	for (int k = 0; k < kc; k++) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), x;
		/* op(B) streams from L2 (from L3 on a chunk's first pass): ask
		 * for it 24 k ahead (measured 5-12% faster than the hardware
		 * prefetchers alone, distances 16-32 alike) */
		_mm_prefetch((const char *)(b + 24 * NR), _MM_HINT_T0);
		_mm_prefetch((const char *)(b + 24 * NR + 16), _MM_HINT_T0);
#define ROW(i) \
		x = _mm512_set1_ps(a[i]); \
		c##i##a = _mm512_fmadd_ps(x, b0, c##i##a); \
		c##i##b = _mm512_fmadd_ps(x, b1, c##i##b);
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
		ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#undef ROW
		a += MR;
		b += NR;
	}
	__m512 acc[MR][2] = {
		{ c0a, c0b }, { c1a, c1b }, { c2a, c2b }, { c3a, c3b },
		{ c4a, c4b }, { c5a, c5b }, { c6a, c6b }, { c7a, c7b },
		{ c8a, c8b }, { c9a, c9b }, { c10a, c10b }, { c11a, c11b },
	};
	__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
	for (int i = 0; i < mr; i++)
		store_row(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL,
		          bias, acc[i][0], acc[i][1], m0, m1, alpha, beta, first);
}

/* ---- the AVX2 kernel ---------------------------------------------------
 *
 * For CPUs without AVX-512: blocks of 6 x 16 of C in 12 ymm registers.
 * op(B) is packed in the AVX-512 kernel's 32-column panels, each stored as
 * two 16-column halves one after the other; op(A) in micro-panels of
 * MR2 = 6 rows.  A tile walks panel, half, then micro-panel (run_tile).
 * Every element gets the AVX-512 kernel's operations (from zero, one
 * fused multiply-add per k in order, then the same epilogue), so the two
 * kernels give the same bits. */

/* Transpose 8 x 8: on entry r[i] is row i, on return r[k] is column k. */
AVX2 static inline __attribute__((always_inline)) void transpose8(__m256 r[8])
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
AVX2 static inline void store6(float *d, __m256 v)
{
	_mm_storeu_ps(d, _mm256_castps256_ps128(v));
	_mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(v, 1));
}

/* Panel p of op(B) as two halves of 16 columns, each contiguous so that
 * it stays in L1 (one of 32 columns at 128-byte stride would fill only
 * half of L1's sets): bp[h * K * 16 + k * 16 + j] = op(B)[k][NR p + 16 h
 * + j], zero past N; column sums as pack_b_panel's. */
AVX2 static void pack_b_panel_avx2(const gemm_args *g, int p)
{
	int j0 = p * NR, nr = g->N - j0 < NR ? g->N - j0 : NR, K = g->K;
	float *dst = g->bp + (size_t)p * K * NR;
	if (!g->tb) {
		double sum[NR] = { 0 };
		for (int k = 0; k < K; k++) {
			const float *s = g->B + (size_t)k * g->ldb + j0;
			float *d0 = dst + (size_t)k * 16, *d1 = d0 + (size_t)K * 16;
			/* 128 bytes of each row of B, a whole row apart: fetch
			 * 16 rows ahead */
			_mm_prefetch((const char *)(s + 16 * (size_t)g->ldb), _MM_HINT_T0);
			_mm_prefetch((const char *)(s + 16 * (size_t)g->ldb + 16), _MM_HINT_T0);
			if (nr == NR) {
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
		for (int jb = 0; jb < NR; jb += 8) {
			__m256 v[8];
			const float *src = g->B + (size_t)(j0 + jb) * g->ldb + k0;
			if (kn == 8 && jb + 8 <= nr) {
				for (int j = 0; j < 8; j++)
					v[j] = _mm256_loadu_ps(src + (size_t)j * g->ldb);
			} else {
				float t[8][8];
				for (int j = 0; j < 8; j++)
					for (int k = 0; k < 8; k++)
						t[j][k] = jb + j < nr && k < kn ? src[(size_t)j * g->ldb + k] : 0.0f;
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

/* Rows i0..i0+mc of op(A), columns k0..k0+kc, in micro-panels of MR2 rows:
 * ap[r * kc * MR2 + k * MR2 + i] = op(A)[i0 + r MR2 + i][k0 + k], zero
 * past the mc rows. */
AVX2 static void pack_a_block_avx2(const gemm_args *g, float *ap, int i0, int mc,
                                   int k0, int kc)
{
	int npan = (mc + MR2 - 1) / MR2;
	if (g->ta) {
		/* op(A)[i][k] = A[k][i]: the tile's rows are contiguous in each
		 * row of A; read them once per k, 6 to each micro-panel */
		for (int k = 0; k < kc; k++) {
			const float *s = g->A + (size_t)(k0 + k) * g->lda + i0;
			for (int r = 0; r < npan; r++) {
				float *d = ap + ((size_t)r * kc + k) * MR2;
				int rows = mc - r * MR2 < MR2 ? mc - r * MR2 : MR2;
				if (rows == MR2) {
					__m128 lo = _mm_loadu_ps(s + r * MR2);
					__m128 hi = _mm_loadl_pi(_mm_setzero_ps(),
					                         (const __m64 *)(s + r * MR2 + 4));
					store6(d, _mm256_set_m128(hi, lo));
				} else {
					for (int i = 0; i < MR2; i++)
						d[i] = i < rows ? s[r * MR2 + i] : 0.0f;
				}
			}
		}
		return;
	}
	for (int r = 0; r < npan; r++) {
		float *d = ap + (size_t)r * kc * MR2;
		int rows = mc - r * MR2 < MR2 ? mc - r * MR2 : MR2, ib = i0 + r * MR2;
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
				store6(d + (size_t)(k + j) * MR2, v[j]);
		}
		for (; k < kc; k++)
			for (int i = 0; i < MR2; i++)
				d[(size_t)k * MR2 + i] = i < rows ? s[(size_t)i * g->lda + k] : 0.0f;
	}
}

/* The first n (clamped to 0..8) lanes of a vector, as a maskload mask. */
AVX2 static inline __m256i mask8(int n)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 16 floats of a row at p, the first n of them (the rest read as 0). */
AVX2 static inline void load16(const float *p, int n, __m256 *v0, __m256 *v1)
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
AVX2 static inline void store_row_avx2(float *c, const float *r, const float *bias,
                                       __m256 v0, __m256 v1, int n, float alpha,
                                       float beta, bool first)
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

/* C block [mr, nr] (mr <= MR2, nr <= 16) at c: the epilogue of
 * a[kc x MR2] times b[kc x 16], both packed. */
AVX2 static void micro_kernel_avx2(int kc, const float *restrict a,
                                   const float *restrict b, float *c, int ldc,
                                   const float *r, const float *bias, int mr,
                                   int nr, float alpha, float beta, bool first)
{
	prefetch_block(c, r, ldc, mr, nr);
	__m256 c0a = _mm256_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a,
	       c2a = c0a, c2b = c0a, c3a = c0a, c3b = c0a, c4a = c0a,
	       c4b = c0a, c5a = c0a, c5b = c0a;
	/* unrolled: fewer loop instructions between the FMAs (measured
	 * 70-85 -> 85-95 GFLOP/s from L1 on a Zen 3 core) */
	#pragma GCC unroll 4
	for (int k = 0; k < kc; k++) {
		__m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), x;
		/* op(A) streams from L2: ask for it 16 k ahead */
		_mm_prefetch((const char *)(a + 16 * MR2), _MM_HINT_T0);
#define ROW(i) \
		x = _mm256_broadcast_ss(a + i); \
		c##i##a = _mm256_fmadd_ps(x, b0, c##i##a); \
		c##i##b = _mm256_fmadd_ps(x, b1, c##i##b);
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
		a += MR2;
		b += 16;
	}
	__m256 acc[MR2][2] = {
		{ c0a, c0b }, { c1a, c1b }, { c2a, c2b },
		{ c3a, c3b }, { c4a, c4b }, { c5a, c5b },
	};
	for (int i = 0; i < mr; i++)
		store_row_avx2(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL, bias,
		               acc[i][0], acc[i][1], nr, alpha, beta, first);
}

/* ---- the AMX kernel ---------------------------------------------------
 *
 * fp32 products on the bf16 tile unit, to fp32 accuracy.  Each operand is
 * split into three bf16 parts, x = h + m + l (8 significant bits each, 24
 * in all: exact but for denormals, which the unit reads as zero), and a
 * product is the six largest of the nine cross terms, hh + hm + hl + mh +
 * mm + lh: those dropped (ml, lm, ll) are below 2^-24 of it.  The unit
 * multiplies bf16 pairs exactly and accumulates in fp32, in a fixed order,
 * so results do not depend on the thread count either.
 *
 * Packed layout, per micro-panel of op(A) (MRA = 32 rows) or panel of
 * op(B) (NR = 32 columns), per K block (kcp k, zero past kc), per chunk of
 * KCH = 32 k: the three parts h, m, l, each as two tiles of 16 rows x 64
 * bytes.  An A tile holds 16 rows of 32 k; a B tile 16 pairs of k by 16
 * columns, each row (k, k+1) interleaved per column, as TDPBF16PS reads
 * them.  A chunk is 3 x 2 x 512 bf16 = 6 KiB. */

enum { TILE_BF16 = 512, CHUNK_BF16 = 3 * 2 * TILE_BF16 };

/* Eight tiles of 16 rows x 64 bytes: C in 0-3 (rows 0-15 / 16-31 by
 * columns 0-15 / 16-31), A in 4-5, B in 6-7. */
static const struct {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} amx_cfg = {
	1, 0, { 0 }, { 64, 64, 64, 64, 64, 64, 64, 64 },
	{ 16, 16, 16, 16, 16, 16, 16, 16 },
};

/* The three bf16 parts of 32 floats, lo's 16 in the low half of each
 * part[s]: x = h + m + l. */
AMX static inline __attribute__((always_inline)) void split3(__m512 lo, __m512 hi,
                                                             __m512i part[3])
{
	for (int s = 0; s < 3; s++) {
		__m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
		part[s] = v;
		__m512 flo = _mm512_castsi512_ps(_mm512_slli_epi32(
		        _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
		__m512 fhi = _mm512_castsi512_ps(_mm512_slli_epi32(
		        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
		lo = _mm512_sub_ps(lo, flo);
		hi = _mm512_sub_ps(hi, fhi);
	}
}

/* 32 bf16 (a in the low half, b in the high) as 16 pairs (a[n], b[n]). */
AMX static inline __attribute__((always_inline)) __m512i interleave(__m512i v)
{
	const __m512i idx = _mm512_set_epi16(
	        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
	        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	return _mm512_permutexvar_epi16(idx, v);
}

/* Panel p of op(B) in the AMX layout (and colsum, as pack_b_panel). */
AMX static void pack_b_panel_amx(const gemm_args *g, int p)
{
	int j0 = p * NR, nr = g->N - j0 < NR ? g->N - j0 : NR;
	uint16_t *dst = (uint16_t *)(g->bp + (size_t)p * g->bpanel);
	__m512d sum[4] = { _mm512_setzero_pd(), _mm512_setzero_pd(),
	                   _mm512_setzero_pd(), _mm512_setzero_pd() };
	for (int kb = 0; kb < g->nkb; kb++) {
		int k0 = kb * g->kc, kc = g->K - k0 < g->kc ? g->K - k0 : g->kc;
		uint16_t *d = dst + (size_t)kb * g->kcp * NR * 3;
		for (int c = 0; c < g->kcp; c += KCH, d += CHUNK_BF16) {
			if (!g->tb) {
				/* rows k, k + 1 of B interleaved per column */
				for (int kp = 0; kp < KCH / 2; kp++) {
					int k = c + 2 * kp;
					for (int h = 0; h < 2; h++) {
						__mmask16 m = mask_n(nr - 16 * h);
						const float *src = g->B + (size_t)(k0 + k) * g->ldb + j0 + 16 * h;
						/* the panel reads 128 bytes of each row of
						 * B, a whole row apart: fetch 16 rows ahead */
						_mm_prefetch((const char *)(src + 16 * (size_t)g->ldb), _MM_HINT_T0);
						_mm_prefetch((const char *)(src + 17 * (size_t)g->ldb), _MM_HINT_T0);
						__m512 x0 = k < kc ? _mm512_maskz_loadu_ps(m, src)
						                   : _mm512_setzero_ps();
						__m512 x1 = k + 1 < kc ? _mm512_maskz_loadu_ps(m, src + g->ldb)
						                       : _mm512_setzero_ps();
						if (g->colsum) {  /* kern_colsum_add's sums: rows in order */
							for (int q = 0; q < 2 && k + q < kc; q++)
								colsum_add16(sum + 2 * h, q ? x1 : x0);
						}
						__m512i part[3];
						split3(x0, x1, part);
						for (int s = 0; s < 3; s++)
							_mm512_store_si512(d + s * 2 * TILE_BF16 + h * TILE_BF16 + kp * 32,
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
						const float *src = g->B + (size_t)(j0 + 16 * h + i) * g->ldb + k0 + c;
						split3(_mm512_maskz_loadu_ps(mask_n(kc - c), src),
						       _mm512_maskz_loadu_ps(mask_n(kc - c - 16), src + 16), part);
					} else {
						part[0] = part[1] = part[2] = _mm512_setzero_si512();
					}
					for (int s = 0; s < 3; s++)
						v[s][i] = _mm512_castsi512_ps(part[s]);
				}
				for (int s = 0; s < 3; s++) {
					transpose16(v[s]);
					for (int kp = 0; kp < 16; kp++)
						_mm512_store_ps(d + s * 2 * TILE_BF16 + h * TILE_BF16 + kp * 32,
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
AMX static void pack_a_block_amx(const gemm_args *g, float *ap, int i0, int mc,
                                 int k0, int kc)
{
	int npan = (mc + MRA - 1) / MRA;
	for (int r = 0; r < npan; r++) {
		uint16_t *d = (uint16_t *)ap + (size_t)r * g->kcp * MRA * 3;
		for (int c = 0; c < g->kcp; c += KCH, d += CHUNK_BF16) {
			/* a row of op(A) is a row of a tile */
			for (int i = 0; i < MRA; i++) {
				__m512i part[3];
				if (r * MRA + i < mc) {
					const float *src = g->A + (size_t)(i0 + r * MRA + i) * g->lda + k0 + c;
					_mm_prefetch((const char *)(src + KCH), _MM_HINT_T0);
					_mm_prefetch((const char *)(src + KCH + 16), _MM_HINT_T0);
					split3(_mm512_maskz_loadu_ps(mask_n(kc - c), src),
					       _mm512_maskz_loadu_ps(mask_n(kc - c - 16), src + 16), part);
				} else {
					part[0] = part[1] = part[2] = _mm512_setzero_si512();
				}
				for (int s = 0; s < 3; s++)
					_mm512_store_si512(d + s * 2 * TILE_BF16 + (i / 16) * TILE_BF16
					                   + (i % 16) * 32, part[s]);
			}
		}
	}
}

AMX static void amx_begin(void)
{
	_tile_loadconfig(&amx_cfg);
}

AMX static void amx_end(void)
{
	_tile_release();
}

/* C block [mr, nr] (mr <= MRA, nr <= NR) at c: the epilogue of nch chunks
 * of packed a (32 rows) times packed b (32 columns), tiles configured by
 * amx_begin(). */
AMX static void amx_kernel(int nch, const uint16_t *a, const uint16_t *b,
                           float *c, int ldc, const float *r, const float *bias,
                           int mr, int nr, float alpha, float beta, bool first)
{
	/* the packing's stores must land before the tile loads read them */
	__asm__ volatile("" ::: "memory");
	prefetch_block(c, r, ldc, mr, nr);
	_tile_zero(0);
	_tile_zero(1);
	_tile_zero(2);
	_tile_zero(3);
#define DP4() do { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); \
	_tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); } while (0)
#define LOAD_A(s) do { _tile_loadd(4, a + (s) * 2 * TILE_BF16, 64); \
	_tile_loadd(5, a + (s) * 2 * TILE_BF16 + TILE_BF16, 64); } while (0)
#define LOAD_B(s) do { _tile_loadd(6, b + (s) * 2 * TILE_BF16, 64); \
	_tile_loadd(7, b + (s) * 2 * TILE_BF16 + TILE_BF16, 64); } while (0)
	/* per chunk, in this order: hh hm hl mh mm lh (A's tiles kept while
	 * B's change: 18 tile loads for 24 products) */
	for (int ch = 0; ch < nch; ch++, a += CHUNK_BF16, b += CHUNK_BF16) {
		LOAD_A(0); LOAD_B(0); DP4();
		LOAD_B(1); DP4();
		LOAD_B(2); DP4();
		LOAD_A(1); LOAD_B(0); DP4();
		LOAD_B(1); DP4();
		LOAD_A(2); LOAD_B(0); DP4();
	}
#undef DP4
#undef LOAD_A
#undef LOAD_B
	float s[MRA * NR] __attribute__((aligned(64)));
	_tile_stored(0, s, NR * sizeof(float));
	_tile_stored(1, s + 16, NR * sizeof(float));
	_tile_stored(2, s + 16 * NR, NR * sizeof(float));
	_tile_stored(3, s + 16 * NR + 16, NR * sizeof(float));
	__asm__ volatile("" : : "r"(s) : "memory");
	__mmask16 m0 = mask_n(nr), m1 = mask_n(nr - 16);
	for (int i = 0; i < mr; i++)
		store_row(c + (size_t)i * ldc, r ? r + (size_t)i * ldc : NULL, bias,
		          _mm512_load_ps(s + i * NR), _mm512_load_ps(s + i * NR + 16),
		          m0, m1, alpha, beta, first);
}

/* ---- tiles ----------------------------------------------------------- */

/* The post-op on a finished block of C (rows of nr at offset co), while
 * it is in L1: the GELU functions' own code on each row, so the values are
 * those of the separate pass. */
static void post_op(const gemm_args *g, size_t co, int mr, int nr)
{
	for (int i = 0; i < mr; i++) {
		size_t o = co + (size_t)i * g->ldc;
		if (g->post == KERN_GEMM_GELU_FWD)
			kern_gelu_forward_span(g->G + o, g->C + o, (size_t)nr);
		else
			kern_gelu_backward_set_span(g->G + o, g->X + o, g->C + o, (size_t)nr);
	}
}

/* Row tile it: rows [*i0, *i0 + *mc), whole micro-panels, the tiles
 * differing by at most one. */
static void tile_rows(const gemm_args *g, int it, int *i0, int *mc)
{
	int r0 = (int)((long)it * g->upan / g->nrt);
	int r1 = (int)((long)(it + 1) * g->upan / g->nrt);
	*i0 = r0 * g->mr;
	*mc = (r1 * g->mr < g->M ? r1 * g->mr : g->M) - *i0;
}

/* Floats of packed op(A) per micro-panel for a K block of kc. */
static size_t a_panel_floats(const gemm_args *g, int kc)
{
	return g->kind == KERN_GEMM_AMX ? (size_t)g->kcp * MRA * 3 / 2 : (size_t)kc * g->mr;
}

/* Rows i0..i0+mc of op(A), K block k0..k0+kc, packed for the kernel used. */
static void pack_a(const gemm_args *g, float *ap, int i0, int mc, int k0, int kc)
{
	if (g->kind == KERN_GEMM_AMX)
		pack_a_block_amx(g, ap, i0, mc, k0, kc);
	else if (g->kind == KERN_GEMM_AVX512)
		pack_a_block(g, ap, i0, mc, k0, kc);
	else
		pack_a_block_avx2(g, ap, i0, mc, k0, kc);
}

/* One block of C: rows ib.. of micro-panel a (packed, K block kb) by
 * columns jo..jo+w (w NR, or 16 for the AVX2 kernel) of panel p, then the
 * post-op after the last K block. */
static void run_block(const gemm_args *g, const float *a, int ib, int p, int jo,
                      int w, int kb)
{
	int k0 = kb * g->kc, kc = g->K - k0 < g->kc ? g->K - k0 : g->kc;
	int mr = g->M - ib < g->mr ? g->M - ib : g->mr;
	int j0 = p * NR + jo, nr = g->N - j0 < w ? g->N - j0 : w;
	bool first = kb == 0;
	size_t co = (size_t)ib * g->ldc + j0;
	const float *R = first && g->R ? g->R + co : NULL;
	const float *bias = first && g->bias ? g->bias + j0 : NULL;
	float beta = first ? g->beta : 1.0f;
	const float *b = g->bp + (size_t)p * g->bpanel;
	if (g->kind == KERN_GEMM_AMX)
		amx_kernel(g->kcp / KCH, (const uint16_t *)a,
		           (const uint16_t *)(b + (size_t)kb * g->kcp * NR * 3 / 2),
		           g->C + co, g->ldc, R, bias, mr, nr, g->alpha, beta, first);
	else if (g->kind == KERN_GEMM_AVX512)
		micro_kernel(kc, a, b + (size_t)k0 * NR, g->C + co, g->ldc, R, bias, mr, nr,
		             g->alpha, beta, first);
	else
		micro_kernel_avx2(kc, a, b + (size_t)jo * g->K + (size_t)k0 * 16, g->C + co,
		                  g->ldc, R, bias, mr, nr, g->alpha, beta, first);
	if (g->post && kb == g->nkb - 1 && g->kind != KERN_GEMM_AVX2)
		post_op(g, co, mr, nr);
}

/* Tile t: the rows of row tile t / nct by column group t % nct (panels
 * [jt npanels / nct, (jt + 1) npanels / nct)).  The tile's rows
 * of op(A) are packed, all of K, into ap; its columns are walked in
 * chunks of ncp panels, and for each chunk the K blocks in order (op(A)
 * packed during the first chunk's pass, just before its use): the
 * chunk's block of packed op(B) (KC x 512 columns, 256 for the AVX2
 * kernel) stays in L2 while every micro-panel of the tile passes over it,
 * and the chunk of C stays in L2 from one K block to the next. */
static void run_tile(const gemm_args *g, int t, float *ap)
{
	int it = t / g->nct, jt = t % g->nct, i0, mc;
	tile_rows(g, it, &i0, &mc);
	int pa = jt * g->npanels / g->nct, pb = (jt + 1) * g->npanels / g->nct;
	int npan = (mc + g->mr - 1) / g->mr;
	size_t kstride = (size_t)npan * a_panel_floats(g, g->kc);  /* per K block */
	if (g->kind == KERN_GEMM_AMX)
		amx_begin();
	for (int c0 = pa; c0 < pb; c0 += g->ncp) {
		int c1 = c0 + g->ncp < pb ? c0 + g->ncp : pb;
		for (int kb = 0; kb < g->nkb; kb++) {
			int k0 = kb * g->kc, kc = g->K - k0 < g->kc ? g->K - k0 : g->kc;
			float *akb = ap + kb * kstride;
			size_t apan = a_panel_floats(g, kc);
			if (c0 == pa && !g->a_shared)  /* packed on first use: in L2 */
				pack_a(g, akb, i0, mc, k0, kc);
			if (g->kind == KERN_GEMM_AVX2) {
				/* a 16-column half of a panel of op(B) (16 KiB at the
				 * longest K block) stays in L1 while the tile's
				 * micro-panels of op(A) stream from L2: 24 bytes of
				 * op(A) per k from L2 instead of 64 of op(B) */
				for (int p = c0; p < c1; p++)
					for (int jo = 0; jo < NR && p * NR + jo < g->N; jo += 16)
						for (int r = 0; r < npan; r++)
							run_block(g, akb + (size_t)r * apan, i0 + r * g->mr, p, jo,
							          16, kb);
				/* the post-op on the chunk's finished columns (in L2), in
				 * rows long enough for its loops */
				if (g->post && kb == g->nkb - 1) {
					int j0 = c0 * NR, j1 = c1 * NR < g->N ? c1 * NR : g->N;
					post_op(g, (size_t)i0 * g->ldc + j0, mc, j1 - j0);
				}
				continue;
			}
			/* a micro-panel of op(A) stays in L1 while the chunk's
			 * panels of op(B) stream from L2 */
			for (int r = 0; r < npan; r++)
				for (int p = c0; p < c1; p++)
					run_block(g, akb + (size_t)r * apan, i0 + r * g->mr, p, 0, NR, kb);
		}
	}
	if (g->kind == KERN_GEMM_AMX)
		amx_end();
}

/* Packing task p: panel p of op(B), or K block (p - npanels) % nkb of row
 * block (p - npanels) / nkb of op(A) into its shared place. */
static void pack_task(const gemm_args *g, int p)
{
	if (p < g->npanels) {
		if (g->kind == KERN_GEMM_AMX)
			pack_b_panel_amx(g, p);
		else if (g->kind == KERN_GEMM_AVX512)
			pack_b_panel(g, p);
		else
			pack_b_panel_avx2(g, p);
		return;
	}
	p -= g->npanels;
	int it = p / g->nkb, kb = p % g->nkb, i0, mc;
	tile_rows(g, it, &i0, &mc);
	int k0 = kb * g->kc, kc = g->K - k0 < g->kc ? g->K - k0 : g->kc;
	size_t kstride = (size_t)((mc + g->mr - 1) / g->mr) * a_panel_floats(g, g->kc);
	pack_a(g, g->abase + (size_t)it * g->aper + kb * kstride, i0, mc, k0, kc);
}

/* kern_gemm on nt threads, or with nt 0 on the calling thread alone (no
 * OpenMP region: callable from inside one). */
static void gemm_run(bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb,
                     float beta, float *C, int ldc, const float *bias,
                     const float *R, float *colsum, int post, float *G,
                     const float *X, int nt)
{
	if (M <= 0 || N <= 0)
		return;
	bool serial = nt < 1;
	gemm_args g = {
		.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
		.ldc = ldc, .alpha = alpha, .beta = R ? 1.0f : beta, .A = A, .B = B,
		.bias = bias, .R = R, .C = C, .colsum = tb ? NULL : colsum,
		.post = post, .G = G, .X = X,
	};
	if (K <= 0) {
		/* no product: only the bias / residual / beta term */
		g.K = 0;
		K = 0;
	}
	g.nkb = K > 0 ? (K + KC_MAX - 1) / KC_MAX : 1;
	g.kc = K > 0 ? (K + g.nkb - 1) / g.nkb : 0;
	g.npanels = (N + NR - 1) / NR;
	/* AMX where it was measured faster inside a training step: not for
	 * a transposed op(A), the weight gradients, whose products ran up to
	 * 20% slower than with AVX-512 (doc/kernels.md) */
	g.kind = kern_gemm_kind_now();
	if (g.kind == KERN_GEMM_AMX && ta)
		g.kind = KERN_GEMM_AVX512;
	g.mr = g.kind == KERN_GEMM_AMX ? MRA : g.kind == KERN_GEMM_AVX512 ? MR : MR2;
	g.ncp = g.kind == KERN_GEMM_AVX2 ? NCP2 : NCP;
	g.kcp = (g.kc + KCH - 1) / KCH * KCH;
	g.bpanel = g.kind == KERN_GEMM_AMX ? (size_t)g.nkb * g.kcp * NR * 3 / 2 : (size_t)K * NR;
	if (nt < 1)
		nt = 1;
	/* Tiles: which thread computes an element, never how, so their shape
	 * may follow the thread count.  Row blocks of up to MC_MAX rows (each
	 * pass of the tile's B block from L2 serves that many rows); when
	 * that gives fewer than 4 tiles per thread (handed out dynamically, so
	 * that a thread slowed by another process does fewer), the columns
	 * are split too, or the rows are, down to 4 micro-panels per block.
	 * The count is then made a multiple of the thread count, and the
	 * blocks differ by at most one micro-panel (or panel): 9 equal tiles
	 * on 2 threads kept one thread idle for a ninth of every product. */
	int want = nt > 1 ? 4 * nt : 1;
	int upan = (M + g.mr - 1) / g.mr;         /* micro-panels of rows */
	int nrt = (upan + MC_MAX / g.mr - 1) / (MC_MAX / g.mr);
	int nct = nrt >= want ? 1 : (want + nrt - 1) / nrt;
	if (nct > g.npanels)
		nct = g.npanels;
	if (nrt * nct < want) {
		nrt = (want + nct - 1) / nct;
		if (nrt > upan / 4)
			nrt = upan / 4 > 0 ? upan / 4 : 1;
	}
	while ((nrt * nct) % nt) {
		if (nct == 1 && nrt < upan)
			nrt++;
		else if (nct < g.npanels)
			nct++;
		else
			break;
	}
	g.upan = upan;
	g.nrt = nrt;
	g.nct = nct;
	g.mc = (upan + nrt - 1) / nrt * g.mr;     /* the most rows in a tile */
	int ntiles = g.nrt * g.nct;
	/* A tile's rows of op(A), all K blocks, rows rounded up: one per
	 * thread, packed by each tile; or, when the columns are split (a row
	 * block then serves several tiles), one per row block, all packed up
	 * front with op(B), so that none is packed twice. */
	size_t aper = (size_t)g.mc / g.mr * a_panel_floats(&g, g.kc) * g.nkb;
	aper = (aper + 15) / 16 * 16;
	g.aper = aper;
	g.a_shared = g.nct > 1;
	gemm_bufs *bf = g.kind == KERN_GEMM_BLAS ? NULL
	                : bufs_get((size_t)g.npanels * (g.bpanel > 0 ? g.bpanel : NR),
	                           aper * (size_t)(g.a_shared ? g.nrt : nt) + 16);
	if (!bf) {
		/* out of memory, or called with the driver off (no kernel this
		 * CPU surely runs): a plain, slow, still deterministic loop
		 * (these results differ from the driver's within rounding) */
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++) {
				float acc = 0.0f;
				for (int k = 0; k < K; k++)
					acc += (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k])
					       * (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
				float *c = C + (size_t)i * ldc + j;
				float base = R ? R[(size_t)i * ldc + j]
				             : beta == 0.0f ? 0.0f : beta * *c;
				if (bias)
					base += bias[j];
				*c = base + alpha * acc;
			}
		if (g.colsum)  /* kern_colsum_add's sums */
			for (int j = 0; j < N; j++) {
				double acc = 0;
				for (int k = 0; k < K; k++)
					acc += B[(size_t)k * ldb + j];
				g.colsum[j] += (float)acc;
			}
		if (post)
			for (int i = 0; i < M; i += MR)
				for (int j = 0; j < N; j += NR)
					post_op(&g, (size_t)i * ldc + j, M - i < MR ? M - i : MR,
					        N - j < NR ? N - j : NR);
		return;
	}
	g.bp = bf->b;
	g.abase = bf->a;
	/* packing tasks: the panels of op(B), then (a_shared) every K block
	 * of every row block of op(A) */
	int npack = g.npanels + (g.a_shared ? g.nrt * g.nkb : 0);
	if (serial) {
		for (int p = 0; p < npack; p++)
			pack_task(&g, p);
		for (int t = 0; t < ntiles; t++)
			run_tile(&g, t, g.a_shared ? g.abase + (size_t)(t / g.nct) * aper
			                           : g.abase);
		return;
	}
	#pragma omp parallel num_threads(nt) if (nt > 1)
	{
		int me = omp_get_thread_num();
		#pragma omp for schedule(dynamic, 1)
		for (int p = 0; p < npack; p++)
			pack_task(&g, p);
		#pragma omp for schedule(dynamic, 1)
		for (int t = 0; t < ntiles; t++)
			run_tile(&g, t, g.abase + (size_t)(g.a_shared ? t / g.nct : me) * aper);
	}
}

void kern_gemm(bool ta, bool tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc, const float *bias,
               const float *R, int nt)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, R,
	         NULL, 0, NULL, NULL, nt < 1 ? 1 : nt);
}

void kern_gemm_post(bool ta, bool tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc, const float *bias,
                    int post, float *G, const float *X, int nt)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, NULL,
	         NULL, post, G, X, nt < 1 ? 1 : nt);
}

bool kern_gemm_colsum(bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc, float *colsum, int nt)
{
	if (tb || K <= 0 || M <= 0 || N <= 0)
		return false;
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL,
	         colsum, 0, NULL, NULL, nt < 1 ? 1 : nt);
	return true;
}

void kern_gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL,
	         NULL, NULL, 0, NULL, NULL, 0);
}

#else  /* !GEMM_X86 */

void kern_gemm_post(bool ta, bool tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc, const float *bias,
                    int post, float *G, const float *X, int nt)
{
	(void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A;
	(void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
	(void)bias; (void)post; (void)G; (void)X; (void)nt;
	abort();  /* kern_gemm_usable() is false here */
}

bool kern_gemm_colsum(bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc, float *colsum, int nt)
{
	(void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A;
	(void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
	(void)colsum; (void)nt;
	return false;
}

void kern_gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc)
{
	(void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A;
	(void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
	abort();  /* kern_gemm_usable() is false here */
}


void kern_gemm(bool ta, bool tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc, const float *bias,
               const float *R, int nt)
{
	(void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A;
	(void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
	(void)bias; (void)R; (void)nt;
	abort();  /* kern_gemm_usable() is false here */
}

#endif
