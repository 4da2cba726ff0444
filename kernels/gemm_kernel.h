/* cotrain kernels: the interface between the GEMM driver (gemm.c) and its
 * micro-kernels (gemm_avx2.c, gemm_avx512.c, gemm_amx.c), private to them.
 *
 * The driver owns everything that does not depend on the instruction set:
 * the K blocks, the tiles of C and who runs them, the buffers, the order of
 * the packing tasks and the epilogue's GELU post-op.  A micro-kernel owns
 * the layout of packed op(A) and op(B), their packing, and the product of
 * one packed micro-panel of op(A) by one packed panel of op(B) into a block
 * of C (with the bias / residual / beta epilogue).  The driver reads the
 * kind once per call (kern_gemm_kind_now()) and takes that kind's
 * gemm_kernel: one table of function pointers per kernel, as Redis's ae.c
 * picks its poller, so the driver names no instruction set.
 *
 * Every function a kernel file exports here is compiled for its
 * instruction set (a target attribute on each function: the library
 * itself is built for baseline x86-64) and is reached only through its
 * table, after kind_init found the CPU runs it. */
#ifndef KERN_GEMM_KERNEL_H
#define KERN_GEMM_KERNEL_H

#include "kernels/gemm.h"

#include <stdbool.h>
#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define GEMM_X86 1
#include <immintrin.h>
#define GEMM_AVX2 __attribute__((target("avx2,fma")))
#define GEMM_AVX512 __attribute__((target("avx512f")))
#define GEMM_AMX __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))
#else
#define GEMM_X86 0
#endif

/* Columns of a panel of packed op(B): two 16-float vectors.  Every kernel
 * packs op(B) in panels of this many columns (its own layout inside). */
enum { GEMM_NR = 32 };

typedef struct gemm_kernel gemm_kernel;

/* One product, as the driver prepared it; read-only while it runs.  The
 * kernels read the operands, the K blocking, bp and the kernel-specific
 * kcp and bpanel; the rest is the driver's. */
typedef struct gemm_args {
	bool ta, tb;
	int M, N, K, lda, ldb, ldc;
	int kc, nkb;                     /* K block length (the last may be shorter), count */
	int npanels, upan, mc, nrt, nct; /* mc: the most rows in a tile */
	const gemm_kernel *kern;         /* the kernel of this call, NULL for none */
	int mr;                          /* rows of a micro-panel: kern->mr */
	int kcp;                         /* k per packed K block: kc (the AMX kernel
	                       * rounds it up to its 32) */
	size_t bpanel;                   /* floats of packed op(B) per panel */
	float alpha, beta;               /* beta 1 when R is given */
	const float *A, *B, *bias, *R;
	float *colsum;         /* += column sums of op(B), or NULL */
	bool a_shared;         /* op(A) packed for all row tiles up front */
	int post;              /* KERN_GEMM_GELU*: after the last K block */
	float *G;              /* the post-op's output, leading dimension ldc */
	const float *X;        /* its second input (GELU_BWD), the same */
	size_t aper;           /* floats of packed op(A) per row tile */
	float *C, *bp, *abase; /* bp: packed op(B), panel p at p * bpanel */
} gemm_args;

/* One block of C for gemm_kernel.block: mr <= kern->mr rows of nr <=
 * kern->nw columns at c (rows g->ldc apart), in K block kb (of length kc,
 * starting at k0).  The epilogue stores c = base + alpha * product, base
 * being, in the first K block (first), r (the residual's block, when not
 * NULL) or beta * c (nothing for beta 0, c's old value unread), plus bias
 * when not NULL; in later K blocks c's old value. */
typedef struct gemm_block {
	float *c;
	const float *r, *bias; /* NULL after the first K block */
	int mr, nr;
	int kb, k0, kc;
	float beta; /* 1 after the first K block */
	bool first;
} gemm_block;

/* A micro-kernel.  The driver calls, per product: prepare; pack_b for
 * every panel and pack_a for every (row tile, K block), in any order and
 * on any threads, all before the first block that reads them (pack_a of a
 * tile's own rows may also run on the thread of that tile, just before);
 * on each thread that runs tiles, tile_begin, then block for every block
 * of its tiles, then tile_end. */
struct gemm_kernel {
	kern_gemm_kind kind;
	int mr;  /* rows of a micro-panel of op(A), and of a block of C */
	int nw;  /* columns of a block of C: GEMM_NR, where a tile keeps a
	             * micro-panel of op(A) in L1 while the chunk's panels of
	             * op(B) pass; or 16, where it keeps half a panel of op(B)
	             * in L1 while the tile's micro-panels of op(A) pass */
	int ncp; /* panels of op(B) in a chunk of a tile's columns */
	/* Sets g->kcp and g->bpanel from g's K blocking (K, kc, nkb). */
	void (*prepare)(gemm_args *g);
	/* Floats of packed op(A) per micro-panel for a K block of kc. */
	size_t (*a_panel_floats)(const gemm_args *g, int kc);
	/* Packs panel p of op(B) at g->bp + p * g->bpanel (all K blocks),
	 * zero past N, adding its column sums to g->colsum when not NULL (in
	 * double, rows in order: kern_colsum_add's operations exactly). */
	void (*pack_b)(const gemm_args *g, int p);
	/* Packs rows i0..i0+mc of op(A), columns k0..k0+kc, at ap, in
	 * micro-panels of a_panel_floats(g, kc) floats, zero past the mc
	 * rows. */
	void (*pack_a)(const gemm_args *g, float *ap, int i0, int mc, int k0, int kc);
	/* Set up and release per-thread state around a run of blocks (the
	 * AMX tile configuration); NULL where there is none. */
	void (*tile_begin)(void);
	void (*tile_end)(void);
	/* The block blk of C from micro-panel a of packed op(A) (K block
	 * blk->kb) and columns jo..jo+nw of panel p of packed op(B), through
	 * the epilogue.  The same operations for every element on every
	 * thread: one product from zero in k order, then the epilogue. */
	void (*block)(const gemm_args *g, const float *a, int p, int jo, const gemm_block *blk);
};

#if GEMM_X86
extern const gemm_kernel gemm_kernel_avx2, gemm_kernel_avx512, gemm_kernel_amx;

/* The mr rows of nr floats at c (and at r, the residual, when given):
 * they come from L3 or memory, so a kernel fetches them while its
 * products run, not when its epilogue needs them. */
static inline __attribute__((always_inline)) void gemm_prefetch_block(const float *c, const float *r, int ldc,
                                                                      int mr, int nr)
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
#endif

/* The product of g (g->K clamped to 0 when there is none) by the plain
 * loop, without packing or buffers, with colsum: the driver's answer when
 * no kernel runs (the driver off, or memory short).  Deterministic, but
 * its results differ from the kernels' within rounding.  No post-op. */
void gemm_ref(const gemm_args *g);

#endif
