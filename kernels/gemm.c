/* cotrain kernels: the CPU backend's own GEMM driver.  See gemm.h and
 * doc/kernels.md ("The GEMM driver").
 *
 * The driver picks a micro-kernel per call (the kind, kern_gemm_kind_now(),
 * read once; its gemm_kernel table, gemm_kernel.h) and does everything
 * that does not depend on the instruction set:
 *  - K is cut into blocks that depend on K only (at most KC_MAX);
 *  - op(B) is packed once per call by the kernel into panels of GEMM_NR =
 *    32 columns, the panels shared by all threads;
 *  - C is cut into tiles of up to MC_MAX rows (by all columns, or by a
 *    column group when there would be too few tiles); threads take the
 *    next tile.  A tile's rows of op(A) are packed into the kernel's
 *    micro-panels, per K block, in the thread's buffer (or all up front,
 *    shared, when columns are split); the tile's columns are walked in
 *    chunks of the kernel's ncp panels and, per chunk, the K blocks in
 *    order, running the kernel over every (micro-panel, panel) pair;
 *  - the optional GELU post-op runs on each finished block (or chunk).
 * The kernels: gemm_avx512.c (12 x 32 blocks), gemm_avx2.c (6 x 16, the
 * same bits), gemm_amx.c (32 x 32 on the tile unit, where op(A) is not
 * transposed); gemm_ref.c is the plain loop used when none runs. */
#include "kernels/gemm.h"

#include "kernels/gelu.h"
#include "kernels/gemm_kernel.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if GEMM_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum {
	MC_MAX = 240, /* the most rows in a tile: 20 micro-panels of 12 */
	KC_MAX = 256  /* the longest K block */
};

/* ---- buffers: the calling thread's, reused between calls ------------- */

typedef struct gemm_bufs {
	float *b;   /* packed op(B) */
	size_t b_n; /* floats it holds */
	float *a;   /* per-thread packed rows of op(A) */
	size_t a_n; /* floats it holds */
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

static void bufs_init(void) { bufs_key_ok = pthread_key_create(&bufs_key, bufs_free) == 0; }

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
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) ||
	    !(d & (1u << 24))) /* AMX-BF16, AMX-TILE */
		return false;
	if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5)))
		return false; /* AVX512-BF16 */
	enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

/* Once per process (kind_once): best, the best kernel this CPU (and, for
 * AMX, Linux) runs, and kind_now, that capped by COTRAIN_GEMM. */
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
	case KERN_GEMM_AVX2:
		return "avx2";
	case KERN_GEMM_AVX512:
		return "avx512";
	case KERN_GEMM_AMX:
		return "amx";
	default:
		return "blas";
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

bool kern_gemm_usable(void) { return kern_gemm_kind_now() != KERN_GEMM_BLAS; }

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

/* The length of K block kb (the last may be shorter). */
static int k_block_len(const gemm_args *g, int kb)
{
	int k0 = kb * g->kc;
	return g->K - k0 < g->kc ? g->K - k0 : g->kc;
}

/* One block of C: rows ib.. of micro-panel a (packed, K block kb) by
 * columns jo..jo+nw of panel p, through the kernel; then, for kernels
 * whose blocks span a whole panel, the post-op after the last K block
 * (walk_b_in_l1 runs it per chunk for the others). */
static void run_block(const gemm_args *g, const float *a, int ib, int p, int jo, int kb)
{
	const gemm_kernel *kn = g->kern;
	int j0 = p * GEMM_NR + jo;
	bool first = kb == 0;
	size_t co = (size_t)ib * g->ldc + j0;
	gemm_block blk = {
		.c = g->C + co,
		.r = first && g->R ? g->R + co : NULL,
		.bias = first && g->bias ? g->bias + j0 : NULL,
		.mr = g->M - ib < g->mr ? g->M - ib : g->mr,
		.nr = g->N - j0 < kn->nw ? g->N - j0 : kn->nw,
		.kb = kb,
		.k0 = kb * g->kc,
		.kc = k_block_len(g, kb),
		.beta = first ? g->beta : 1.0f,
		.first = first,
	};
	kn->block(g, a, p, jo, &blk);
	if (g->post && kb == g->nkb - 1 && kn->nw == GEMM_NR)
		post_op(g, co, blk.mr, blk.nr);
}

/* One K block of one chunk of a tile: its npan micro-panels of packed
 * op(A) (rows from i0, mc of them) by its panels c0..c1 of op(B). */
typedef struct tile_step {
	const float *a; /* the micro-panels, K block kb */
	size_t apan;    /* floats from one micro-panel to the next */
	int i0, mc, npan;
	int c0, c1;
	int kb;
} tile_step;

/* The step for kernels of whole-panel blocks: each micro-panel of op(A)
 * stays in L1 while the chunk's panels of op(B) stream from L2. */
static void walk_a_in_l1(const gemm_args *g, const tile_step *s)
{
	for (int r = 0; r < s->npan; r++)
		for (int p = s->c0; p < s->c1; p++)
			run_block(g, s->a + (size_t)r * s->apan, s->i0 + r * g->mr, p, 0, s->kb);
}

/* The step for kernels of narrower blocks (the AVX2 kernel's 16 columns):
 * a 16-column part of a panel of op(B) (16 KiB at the longest K block)
 * stays in L1 while the tile's micro-panels of op(A) stream from L2: 24
 * bytes of op(A) per k from L2 instead of 64 of op(B).  Then the post-op
 * on the chunk's finished columns (in L2), in rows long enough for its
 * loops. */
static void walk_b_in_l1(const gemm_args *g, const tile_step *s)
{
	int nw = g->kern->nw;
	for (int p = s->c0; p < s->c1; p++)
		for (int jo = 0; jo < GEMM_NR && p * GEMM_NR + jo < g->N; jo += nw)
			for (int r = 0; r < s->npan; r++)
				run_block(g, s->a + (size_t)r * s->apan, s->i0 + r * g->mr, p, jo, s->kb);
	if (g->post && s->kb == g->nkb - 1) {
		int j0 = s->c0 * GEMM_NR, j1 = s->c1 * GEMM_NR < g->N ? s->c1 * GEMM_NR : g->N;
		post_op(g, (size_t)s->i0 * g->ldc + j0, s->mc, j1 - j0);
	}
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
	const gemm_kernel *kn = g->kern;
	int it = t / g->nct, jt = t % g->nct;
	tile_step s;
	tile_rows(g, it, &s.i0, &s.mc);
	int pa = jt * g->npanels / g->nct, pb = (jt + 1) * g->npanels / g->nct;
	s.npan = (s.mc + g->mr - 1) / g->mr;
	size_t kstride = (size_t)s.npan * kn->a_panel_floats(g, g->kc); /* per K block */
	if (kn->tile_begin)
		kn->tile_begin();
	for (s.c0 = pa; s.c0 < pb; s.c0 += kn->ncp) {
		s.c1 = s.c0 + kn->ncp < pb ? s.c0 + kn->ncp : pb;
		for (s.kb = 0; s.kb < g->nkb; s.kb++) {
			int kc = k_block_len(g, s.kb);
			float *akb = ap + s.kb * kstride;
			if (s.c0 == pa && !g->a_shared) /* packed on first use: in L2 */
				kn->pack_a(g, akb, s.i0, s.mc, s.kb * g->kc, kc);
			s.a = akb;
			s.apan = kn->a_panel_floats(g, kc);
			if (kn->nw < GEMM_NR)
				walk_b_in_l1(g, &s);
			else
				walk_a_in_l1(g, &s);
		}
	}
	if (kn->tile_end)
		kn->tile_end();
}

/* Packing task p: panel p of op(B), or K block (p - npanels) % nkb of row
 * block (p - npanels) / nkb of op(A) into its shared place. */
static void pack_task(const gemm_args *g, int p)
{
	if (p < g->npanels) {
		g->kern->pack_b(g, p);
		return;
	}
	p -= g->npanels;
	int it = p / g->nkb, kb = p % g->nkb, i0, mc;
	tile_rows(g, it, &i0, &mc);
	size_t kstride = (size_t)((mc + g->mr - 1) / g->mr) * g->kern->a_panel_floats(g, g->kc);
	g->kern->pack_a(g, g->abase + (size_t)it * g->aper + kb * kstride, i0, mc, kb * g->kc,
	                k_block_len(g, kb));
}

/* ---- one product, step by step --------------------------------------- */

/* K blocks that depend on K only, so an element's operations never
 * depend on anything else: nkb blocks of kc (the last may be shorter),
 * at most KC_MAX; K = 300 gives 2 x 150. */
static void plan_k_blocks(gemm_args *g)
{
	g->nkb = g->K > 0 ? (g->K + KC_MAX - 1) / KC_MAX : 1;
	g->kc = g->K > 0 ? (g->K + g->nkb - 1) / g->nkb : 0;
}

/* The kernel for a product (op(A) transposed when ta), from the kind in
 * use now; NULL with the driver off.  AMX only where it was measured
 * faster inside a training step: not for a transposed op(A), the weight
 * gradients, whose products ran up to 20% slower than with AVX-512
 * (doc/kernels.md). */
static const gemm_kernel *pick_kernel(bool ta)
{
#if GEMM_X86
	switch (kern_gemm_kind_now()) {
	case KERN_GEMM_AVX2:
		return &gemm_kernel_avx2;
	case KERN_GEMM_AVX512:
		return &gemm_kernel_avx512;
	case KERN_GEMM_AMX:
		return ta ? &gemm_kernel_avx512 : &gemm_kernel_amx;
	default:
		break;
	}
#else
	(void)ta;
#endif
	return NULL;
}

/* g's tiles for nt >= 1 threads (upan, nrt, nct, mc), from its kernel's
 * micro-panel height.  Tiles decide which thread computes an element,
 * never how, so their shape may follow the thread count.  Row blocks of
 * up to MC_MAX rows (each pass of the tile's B block from L2 serves that
 * many rows); when that gives fewer than 4 tiles per thread (handed out
 * dynamically, so that a thread slowed by another process does fewer),
 * the columns are split too, or the rows are, down to 4 micro-panels per
 * block.  The count is then made a multiple of the thread count, and the
 * blocks differ by at most one micro-panel (or panel): 9 equal tiles on 2
 * threads kept one thread idle for a ninth of every product. */
static void plan_tiles(gemm_args *g, int nt)
{
	int want = nt > 1 ? 4 * nt : 1;
	int upan = (g->M + g->mr - 1) / g->mr; /* micro-panels of rows */
	int nrt = (upan + MC_MAX / g->mr - 1) / (MC_MAX / g->mr);
	int nct = nrt >= want ? 1 : (want + nrt - 1) / nrt;
	if (nct > g->npanels)
		nct = g->npanels;
	if (nrt * nct < want) {
		nrt = (want + nct - 1) / nct;
		if (nrt > upan / 4)
			nrt = upan / 4 > 0 ? upan / 4 : 1;
	}
	while ((nrt * nct) % nt) {
		if (nct == 1 && nrt < upan)
			nrt++;
		else if (nct < g->npanels)
			nct++;
		else
			break;
	}
	g->upan = upan;
	g->nrt = nrt;
	g->nct = nct;
	g->mc = (upan + nrt - 1) / nrt * g->mr; /* the most rows in a tile */
}

/* The calling thread's buffers for g on nt >= 1 threads (sets aper and
 * a_shared), or NULL when memory is short.  A tile's rows of op(A), all K
 * blocks, rows rounded up: one per thread, packed by each tile; or, when
 * the columns are split (a row block then serves several tiles), one per
 * row block, all packed up front with op(B), so that none is packed
 * twice. */
static gemm_bufs *bufs_for(gemm_args *g, int nt)
{
	size_t aper = (size_t)g->mc / g->mr * g->kern->a_panel_floats(g, g->kc) * g->nkb;
	g->aper = (aper + 15) / 16 * 16;
	g->a_shared = g->nct > 1;
	return bufs_get((size_t)g->npanels * (g->bpanel > 0 ? g->bpanel : GEMM_NR),
	                g->aper * (size_t)(g->a_shared ? g->nrt : nt) + 16);
}

/* g without a kernel: the plain loop, then the post-op (in 12 x 32
 * blocks, as the AVX-512 kernel runs it; the values do not depend on it). */
static void run_plain(const gemm_args *g)
{
	gemm_ref(g);
	if (g->post)
		for (int i = 0; i < g->M; i += 12)
			for (int j = 0; j < g->N; j += GEMM_NR)
				post_op(g, (size_t)i * g->ldc + j, g->M - i < 12 ? g->M - i : 12,
				        g->N - j < GEMM_NR ? g->N - j : GEMM_NR);
}

/* Packing tasks: the panels of op(B), then (a_shared) every K block of
 * every row block of op(A). */
static int pack_tasks(const gemm_args *g) { return g->npanels + (g->a_shared ? g->nrt * g->nkb : 0); }

/* g, planned and with its buffers, on the calling thread alone: no OpenMP
 * region, so callable from inside one. */
static void run_serial(const gemm_args *g)
{
	int npack = pack_tasks(g), ntiles = g->nrt * g->nct;
	for (int p = 0; p < npack; p++)
		pack_task(g, p);
	for (int t = 0; t < ntiles; t++)
		run_tile(g, t, g->a_shared ? g->abase + (size_t)(t / g->nct) * g->aper : g->abase);
}

/* g, planned for nt threads and with its buffers, on nt threads: all
 * packing tasks, then all tiles, each handed out dynamically.  Must be
 * called outside OpenMP parallel regions. */
static void run_threads(const gemm_args *g, int nt)
{
	int npack = pack_tasks(g), ntiles = g->nrt * g->nct;
#pragma omp parallel num_threads(nt) if (nt > 1)
	{
		int me = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
		for (int p = 0; p < npack; p++)
			pack_task(g, p);
#pragma omp for schedule(dynamic, 1)
		for (int t = 0; t < ntiles; t++)
			run_tile(g, t, g->abase + (size_t)(g->a_shared ? t / g->nct : me) * g->aper);
	}
}

/* kern_gemm and its variants on nt threads, or with nt 0 on the calling
 * thread alone (no OpenMP region: callable from inside one).  colsum
 * (ignored when tb), post, G and X as kern_gemm_colsum and
 * kern_gemm_post.  Falls back to the plain loop (gemm_ref.c) with the
 * driver off or when memory is short. */
static void gemm_run(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc, const float *bias,
                     const float *R, float *colsum, int post, float *G, const float *X, int nt)
{
	if (M <= 0 || N <= 0)
		return;
	gemm_args g = {
		.ta = ta,
		.tb = tb,
		.M = M,
		.N = N,
		.K = K > 0 ? K : 0, /* none: only the bias / residual / beta term */
		.lda = lda,
		.ldb = ldb,
		.ldc = ldc,
		.alpha = alpha,
		.beta = R ? 1.0f : beta,
		.A = A,
		.B = B,
		.bias = bias,
		.R = R,
		.C = C,
		.colsum = tb ? NULL : colsum,
		.post = post,
		.G = G,
		.X = X,
	};
	plan_k_blocks(&g);
	g.npanels = (N + GEMM_NR - 1) / GEMM_NR;
	g.kern = pick_kernel(ta);
	gemm_bufs *bf = NULL;
	if (g.kern) {
		g.mr = g.kern->mr;
		g.kern->prepare(&g);
		plan_tiles(&g, nt < 1 ? 1 : nt);
		bf = bufs_for(&g, nt < 1 ? 1 : nt);
	}
	if (!bf) {
		run_plain(&g);
		return;
	}
	g.bp = bf->b;
	g.abase = bf->a;
	if (nt < 1)
		run_serial(&g);
	else
		run_threads(&g, nt);
}

void kern_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc, const float *bias, const float *R, int nt)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, R, NULL, 0, NULL, NULL,
	         nt < 1 ? 1 : nt);
}

void kern_gemm_post(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc, const float *bias, int post,
                    float *G, const float *X, int nt)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, NULL, NULL, post, G, X,
	         nt < 1 ? 1 : nt);
}

bool kern_gemm_colsum(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc, float *colsum, int nt)
{
	if (tb || K <= 0 || M <= 0 || N <= 0)
		return false;
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL, colsum, 0, NULL, NULL,
	         nt < 1 ? 1 : nt);
	return true;
}

void kern_gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
	gemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL, NULL, 0, NULL, NULL, 0);
}
