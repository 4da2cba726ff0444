/* cotrain kernels: the compute backend, one small vtable chosen once.
 *
 * Every matrix product of the model goes through kern_backend_get()->sgemm or
 * ->sgemm_batched; every other loop is plain C with OpenMP in the layer
 * files.  Matrices are row-major: element (i, j) of a matrix with leading
 * dimension ld sits at [i * ld + j].  op(X) is X or its transpose.
 *
 * Determinism contract (the training round needs bit-identical results on
 * any thread count): a backend must compute every output element by the same
 * sequence of floating-point operations whatever the thread count, so work
 * may be split over output elements but never over the summed dimension K in
 * a way that depends on the thread count.
 *
 * The CPU backend (backend_cpu.c, OpenBLAS + OpenMP) is the only one of this
 * vtable.  The GPU does not come through it: products on host pointers
 * would copy every activation across the bus, so the CUDA backend
 * (kernels/gpu.h) runs a whole model's passes on the device instead. */
#ifndef KERN_BACKEND_H
#define KERN_BACKEND_H

#include <stdbool.h>

/* The layout of a batch of products, see sgemm_batched. */
typedef struct kern_batch {
	int n_outer, n_inner;
	long a_outer, a_inner, b_outer, b_inner, c_outer, c_inner;
} kern_batch;

typedef struct kern_backend {
	const char *name;
	/* C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.  op(A) is A
	 * (M x K, lda >= K) or, with ta, A^T where A is K x M (lda >= M);
	 * likewise B.  beta == 0 ignores C's old contents (NaN included).
	 * Must be called outside OpenMP parallel regions. */
	void (*sgemm)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	              const float *B, int ldb, float beta, float *C, int ldc);
	/* As sgemm with a row vector folded in: first C = beta * C + bias
	 * (bias[N] added to every row; beta == 0 ignores C's old contents),
	 * then C += alpha * op(A) op(B).  bias NULL is sgemm.  One pass per
	 * tile of C, just before that tile's product, instead of a separate
	 * pass over all of C.  Outside OpenMP regions. */
	void (*sgemm_bias)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                   const float *B, int ldb, float beta, float *C, int ldc, const float *bias);
	/* As sgemm_bias with beta 1 on a copy: first C = R + bias (R[M,N],
	 * leading dimension ldc, may not overlap C; bias may be NULL), then
	 * C += alpha * op(A) op(B): a residual connection and the projection
	 * that feeds it, the copy made per tile.  Outside OpenMP regions. */
	void (*sgemm_residual)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                       const float *B, int ldb, const float *R, float *C, int ldc, const float *bias);
	/* As sgemm_bias, then on C a GELU post-op (kernels/gemm.h's
	 * KERN_GEMM_GELU_FWD: G = gelu(C); KERN_GEMM_GELU_BWD: G = C *
	 * gelu'(X)), G and X with leading dimension ldc, the values those of
	 * the separate GELU pass; fused into the product's last pass over C
	 * where the backend can.  Outside OpenMP regions. */
	void (*sgemm_gelu)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                   const float *B, int ldb, float beta, float *C, int ldc, const float *bias, int op,
	                   float *G, const float *X);
	/* As sgemm, and also colsum[j] += sum over k of op(B)[k][j], in
	 * double in k order (kern_colsum_add's sum, bit for bit), in the
	 * same pass over B where the backend can: a linear layer's weight
	 * and bias gradients.  Returns false, having done nothing, where it
	 * cannot (the caller then runs sgemm and the column sums apart).
	 * Outside OpenMP regions. */
	bool (*sgemm_colsum)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                     const float *B, int ldb, float beta, float *C, int ldc, float *colsum);
	/* One product on the calling thread only, for a caller's own OpenMP
	 * loop over independent problems (attention runs each (sample, head)
	 * pair's products and softmax in one task): each output element is
	 * computed exactly as sgemm_batched computes it.  May be called
	 * inside OpenMP regions, from several threads at once. */
	void (*sgemm_serial)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                     const float *B, int ldb, float beta, float *C, int ldc);
	/* n_outer * n_inner independent products of one shape; problem
	 * (o, i) uses A + o*a_outer + i*a_inner, likewise B and C (strides
	 * in floats), so that e.g. (sample, head) pairs of attention read
	 * their slices in place.  The C blocks must not overlap.  Outside
	 * OpenMP regions. */
	void (*sgemm_batched)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
	                      const float *B, int ldb, float beta, float *C, int ldc,
	                      const struct kern_batch *batch);
	/* threads used by this backend and by the kernels' OpenMP loops */
	void (*set_threads)(int n);
	int (*threads)(void);
	/* a line describing the backend ("cpu: OpenBLAS 0.3.21 (SkylakeX)") */
	const char *(*describe)(void);
} kern_backend;

/* The backend chosen for this process (today always the CPU one).  Never
 * NULL; the first call initialises it (thread safe). */
const kern_backend *kern_backend_get(void);

/* Set the number of threads every kernel uses (n >= 1; n < 1 means the
 * OpenMP default, OMP_NUM_THREADS or the number of cores).  Results do not
 * depend on it, only speed.  Applies process-wide. */
void kern_set_threads(int n);
/* The threads of the calling thread's kernel calls: kern_set_threads_here's
 * count on this thread when it set one, else the process-wide one. */
int kern_threads(void);
/* For the calling thread only: its kernel calls use n threads (n >= 1; 1
 * runs them on the caller alone), whatever kern_set_threads says; n < 1
 * goes back to the process-wide count.  For a background thread that must
 * stay on one core beside others that use them all (the server's held-out
 * evaluation). */
void kern_set_threads_here(int n);

/* When the BLAS library did not recognise this CPU and fell back to slow
 * generic code, the value to put in OPENBLAS_CORETYPE before the process
 * starts ("SkylakeX", "Haswell"), else NULL.  OpenBLAS reads the variable
 * only when it is loaded, so a program applies it by re-executing itself:
 * kern_blas_reexec_if_needed below.
 * OpenBLAS 0.3.21 (Debian 12) runs its SSE3 "Prescott" kernels on Sapphire
 * and Emerald Rapids: sgemm at 35 GFLOP/s per core instead of 170. */
const char *kern_blas_coretype_hint(void);

/* The environment variable that marks a process as already re-executed by
 * kern_blas_reexec_if_needed; set it (to anything) to forbid the re-exec. */
#define KERN_BLAS_REEXEC_ENV "COTRAIN_BLAS_REEXEC"

/* The spin count (GOMP_SPINCOUNT) every program runs with unless the
 * environment sets a wait policy; see kern_blas_reexec_if_needed. */
#define KERN_OMP_SPINCOUNT "10000"

/* Call first thing in main(), before any thread, file, signal handler or
 * other state that exec would lose or leak.  Two settings the kernels need
 * are read by their libraries only when the process loads, so they can only
 * be applied by starting again:
 *  - OPENBLAS_CORETYPE = kern_blas_coretype_hint(), when the variable is
 *    unset and the hint names a core (4-5x faster products on CPUs that
 *    OpenBLAS 0.3.21 does not recognise);
 *  - GOMP_SPINCOUNT = KERN_OMP_SPINCOUNT, when neither it nor
 *    OMP_WAIT_POLICY is set: an idle OpenMP thread spins about 0.2 ms
 *    (10000 pauses) before it sleeps.  libgomp's default (up to a few ms,
 *    or for ever with OMP_WAIT_POLICY=ACTIVE) takes the CPU a partner
 *    thread needs when another process holds one of the cores (a
 *    volunteer's own work, which the client yields to); sleeping at once
 *    (PASSIVE) lets an idle virtual CPU halt at every barrier, and on a
 *    virtual machine the host then hands its core, and its caches, to
 *    other guests.  Measured on the 2-core test VM, sahaj-sized steps
 *    (doc/kernels.md): idle, 15% more tokens/s than PASSIVE; beside a busy
 *    process, within 3% of it.
 * When either applies and KERN_BLAS_REEXEC_ENV is unset, sets them and the
 * marker and execv()s /proc/self/exe with the same argv (same pid, same
 * arguments, same environment plus these variables).  Returns only when
 * nothing was to be done or the exec failed (no /proc, no permission): the
 * program then runs on as loaded, slower but correct; the marker stays set,
 * so it is never tried twice and a re-executed program can never loop.
 * Neither setting changes any result: the optimizer's bits do not depend
 * on the BLAS core, and the forward and backward are deterministic for a
 * given core (they differ between cores within rounding). */
void kern_blas_reexec_if_needed(int argc, char **argv);

#endif
