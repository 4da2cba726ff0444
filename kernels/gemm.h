/* cotrain kernels: the CPU backend's own GEMM driver (internal to
 * backend_cpu.c).
 *
 * C[M,N] = (first R + bias, or beta * C + bias) + alpha * op(A) op(B), row
 * major, for the model's large products, with an AVX2 or AVX-512
 * micro-kernel or, where the CPU has AMX-BF16, an AMX kernel of fp32
 * accuracy.
 *
 * Why a driver of our own: the backend must not let a result depend on the
 * thread count, so it used to cut each product into tiles, one
 * single-threaded OpenBLAS call each; every call packed the shared operand
 * again (packing was about 14% of a training step at width 512).  Here
 * op(B) is packed once per call into 32-column panels, shared by all
 * threads, and tiles of C are handed out dynamically; each tile packs its
 * rows of op(A) into a per-thread buffer.
 *
 * Determinism: K is cut into blocks whose size depends on K only; every
 * element of C is the sum of its K-blocks in order, each block summed from
 * zero in a register in k order with fused multiply-adds, and added to C
 * (the first block to the bias / residual / beta * C term).  Which thread
 * runs a tile and how many there are never change an element's operations,
 * so results are bit-identical on any thread count.  They differ from
 * OpenBLAS's within rounding; a CPU without AVX2 and FMA uses the
 * OpenBLAS path instead (deterministic too). */
#ifndef KERN_GEMM_H
#define KERN_GEMM_H

#include <stdbool.h>

/* The driver's micro-kernels, slowest first.  Each element of C gets the
 * same operations from AVX2 and AVX-512 (one fused multiply-add per k in
 * the same order, the same epilogue), so the two give the same bits; the
 * AMX kernel's differ within rounding. */
typedef enum {
	KERN_GEMM_BLAS = 0, /* the driver off: OpenBLAS tiles (backend_cpu.c) */
	KERN_GEMM_AVX2,     /* 6 x 16 blocks of C, AVX2 and FMA */
	KERN_GEMM_AVX512,   /* 12 x 32 blocks, AVX-512F */
	KERN_GEMM_AMX       /* AMX-BF16 at fp32 accuracy where op(A) is not
	                      * transposed, the AVX-512 kernel elsewhere */
} kern_gemm_kind;

/* The kernel in use: at first the best this CPU (and, for AMX, Linux)
 * runs, lowered by COTRAIN_GEMM (read once): "blas" turns the driver off,
 * "avx2" or "avx512" caps the kernel (other values are ignored). */
kern_gemm_kind kern_gemm_kind_now(void);

/* Use kernel k from now on, where this CPU runs it (KERN_GEMM_BLAS
 * always); returns whether it is now used.  For benchmarks and tests that
 * compare kernels in one process: call it between products, never while
 * one runs. */
bool kern_gemm_use(kern_gemm_kind k);

/* "blas", "avx2", "avx512" or "amx". */
const char *kern_gemm_kind_name(kern_gemm_kind k);

/* kern_gemm_kind_now() != KERN_GEMM_BLAS: products go through the driver. */
bool kern_gemm_usable(void);

/* The product above over nt threads (nt >= 1).  Must be called outside
 * OpenMP parallel regions; meant for when kern_gemm_usable() (otherwise a
 * slow plain loop computes it).  Semantics as the backend's sgemm_bias
 * (R NULL) and sgemm_residual (R given, beta ignored):
 * beta 0 ignores C's old contents (NaN included); bias and R may be NULL.
 * R has leading dimension ldc and must not overlap C. */
void kern_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc, const float *bias, const float *R, int nt);

/* kern_gemm (no residual) followed, on each finished block of C while it
 * is in cache, by
 *   KERN_GEMM_GELU_FWD: G = gelu(C)                 (X unused)
 *   KERN_GEMM_GELU_BWD: G = C * gelu'(X)            (kern_gelu_backward_set)
 * G and X with leading dimension ldc; the values are those of the separate
 * GELU pass, bit for bit.  C is still written. */
enum { KERN_GEMM_GELU_FWD = 1, KERN_GEMM_GELU_BWD = 2 };
void kern_gemm_post(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc, const float *bias, int post,
                    float *G, const float *X, int nt);

/* kern_gemm without bias or residual, and colsum[j] += the sum over k of
 * op(B)[k][j], summed in double in k order as kern_colsum_add does (bit
 * for bit), while op(B) is packed: the linear layer's weight gradient and
 * bias gradient in one pass over dout.  Only for tb false (returns false,
 * doing nothing, otherwise or when M, N or K is 0). */
bool kern_gemm_colsum(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc, float *colsum, int nt);

/* The same product on the calling thread only, no OpenMP region (so it
 * may run inside one, from several threads at once), without bias or
 * residual; each element computed exactly as kern_gemm computes it. */
void kern_gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);

#endif
