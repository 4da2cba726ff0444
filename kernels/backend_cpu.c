/* cotrain kernels: the CPU backend, OpenBLAS for products, OpenMP for loops.
 *
 * Why OpenBLAS runs single-threaded here: OpenBLAS chooses how to split a
 * product, and how to block its K loop, from the thread count (level3.c and
 * level3_thread.c block K differently), so its results may change with the
 * number of threads.  Instead each product is cut into tiles of output rows
 * (or columns) whose size depends on the shape only, and every tile is one
 * single-threaded cblas_sgemm over the whole K: an output element is always
 * computed by the same call with the same K loop, whichever thread runs it,
 * so results are bit-identical on any thread count (tests/
 * test_kernels_determinism.c proves it for 1 and 2).  The tiles are spread
 * over OpenMP threads; with OpenBLAS pinned to one thread there is no
 * oversubscription.  The cost is packing the shared operand once per tile
 * instead of once per call: a few percent at the model's shapes. */
#include "kernels/backend.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cpu_nthreads; /* 0 until initialised */
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_init(void)
{
	openblas_set_num_threads(1);
	if (__atomic_load_n(&cpu_nthreads, __ATOMIC_RELAXED) < 1)
		__atomic_store_n(&cpu_nthreads, omp_get_max_threads(), __ATOMIC_RELAXED);
}

static void gemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc)
{
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
	            alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Tile size along a dimension of length dim, a function of the shape only:
 * about an eighth of it, a multiple of 64, between 128 and 512.  Larger
 * tiles pack the shared operand fewer times, but at the model's shapes
 * 256-row tiles cost no measurable CPU time over 512-row ones, and eight
 * tiles handed out dynamically keep 2 threads busy when another process
 * slows one of them (four left one thread idle a quarter of the time). */
static int tile_of(int dim)
{
	int t = ((dim + 7) / 8 + 63) / 64 * 64;
	return t < 128 ? 128 : t > 512 ? 512 : t;
}

/* Over a block of C: C = R + bias when R is given (bias may then be NULL),
 * else C = beta * C + bias (beta 0: C = bias). */
static void bias_block(float *C, int ldc, int rows, int n, float beta, const float *bias, const float *R)
{
	for (int i = 0; i < rows; i++) {
		float *c = C + (size_t)i * ldc;
		const float *r = R ? R + (size_t)i * ldc : NULL;
		if (r && bias)
			for (int j = 0; j < n; j++)
				c[j] = r[j] + bias[j];
		else if (r)
			memcpy(c, r, sizeof(float) * (size_t)n);
		else if (beta == 0.0f)
			for (int j = 0; j < n; j++)
				c[j] = bias[j];
		else if (beta == 1.0f)
			for (int j = 0; j < n; j++)
				c[j] += bias[j];
		else
			for (int j = 0; j < n; j++)
				c[j] = beta * c[j] + bias[j];
	}
}

/* One tile: the bias (or residual) pass when one is given, then a
 * single-threaded product with beta 1; or the plain product. */
static void tile_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc, const float *bias,
                      const float *R)
{
	if (bias || R) {
		bias_block(C, ldc, M, N, beta, bias, R);
		beta = 1.0f;
	}
	gemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The tiled product behind sgemm, sgemm_bias and sgemm_residual. */
static void tiled(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc, const float *bias, const float *R)
{
	if (M <= 0 || N <= 0)
		return;
	int nt = kern_threads();
	/* Large products on a CPU with AVX-512: our own driver (gemm.h),
	 * which packs the shared operand once per call. */
	if ((double)M * N * K >= 1e6 && kern_gemm_usable()) {
		kern_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, R, nt);
		return;
	}
	/* Split the longer of M and N; small products run as one call. */
	bool split_rows = M >= N;
	int dim = split_rows ? M : N;
	int tile = tile_of(dim);
	int ntiles = (dim + tile - 1) / tile;
	if (ntiles < 2 || (double)M * N * K < 1e6) {
		tile_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, R);
		return;
	}
/* nt == 1 still walks the same tiles, so the result does not depend on
	 * the thread count; nor does it depend on which thread takes a tile,
	 * so tiles are handed out as threads come free (another process on a
	 * shared core slows one thread, not the whole product). */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
	for (int t = 0; t < ntiles; t++) {
		int lo = t * tile, n = dim - lo < tile ? dim - lo : tile;
		if (split_rows) {
			const float *a = ta ? A + lo : A + (size_t)lo * lda;
			tile_gemm(ta, tb, n, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)lo * ldc, ldc,
			          bias, R ? R + (size_t)lo * ldc : NULL);
		} else {
			const float *b = tb ? B + (size_t)lo * ldb : B + lo;
			tile_gemm(ta, tb, M, n, K, alpha, A, lda, b, ldb, beta, C + lo, ldc,
			          bias ? bias + lo : NULL, R ? R + lo : NULL);
		}
	}
}

static void cpu_sgemm_bias(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc, const float *bias)
{
	tiled(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, NULL);
}

static void cpu_sgemm_residual(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                               const float *B, int ldb, const float *R, float *C, int ldc, const float *bias)
{
	tiled(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, bias, R);
}

static void cpu_sgemm_gelu(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc, const float *bias, int op,
                           float *G, const float *X)
{
	if ((double)M * N * K >= 1e6 && kern_gemm_usable()) {
		kern_gemm_post(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, op, G, X,
		               kern_threads());
		return;
	}
	tiled(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, NULL);
	if (ldc == N) {
		if (op == KERN_GEMM_GELU_FWD)
			kern_gelu_forward(G, C, (size_t)M * N);
		else
			kern_gelu_backward_set(G, X, C, (size_t)M * N);
		return;
	}
	for (int i = 0; i < M; i++) {
		size_t o = (size_t)i * ldc;
		if (op == KERN_GEMM_GELU_FWD)
			kern_gelu_forward_span(G + o, C + o, (size_t)N);
		else
			kern_gelu_backward_set_span(G + o, X + o, C + o, (size_t)N);
	}
}

static bool cpu_sgemm_colsum(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                             const float *B, int ldb, float beta, float *C, int ldc, float *colsum)
{
	if ((double)M * N * K < 1e6 || !kern_gemm_usable())
		return false;
	return kern_gemm_colsum(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, colsum, kern_threads());
}

static void cpu_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
	cpu_sgemm_bias(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* sgemm_serial and each problem of sgemm_batched: our driver on the
 * calling thread where it is used, else one OpenBLAS call (the choice
 * depends on the CPU only, so the two always agree). */
static void serial1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc)
{
	if (kern_gemm_usable())
		kern_gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	else
		gemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_sgemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, float *C, int ldc, const kern_batch *bt)
{
	int nt = kern_threads(), n = bt->n_outer * bt->n_inner;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && n > 1)
	for (int p = 0; p < n; p++) {
		long o = p / bt->n_inner, i = p % bt->n_inner;
		serial1(ta, tb, M, N, K, alpha, A + o * bt->a_outer + i * bt->a_inner, lda,
		        B + o * bt->b_outer + i * bt->b_inner, ldb, beta,
		        C + o * bt->c_outer + i * bt->c_inner, ldc);
	}
}

static void cpu_set_threads(int n)
{
	pthread_once(&cpu_once, cpu_init);
	if (n < 1)
		n = omp_get_num_procs();
	__atomic_store_n(&cpu_nthreads, n, __ATOMIC_RELAXED);
}

static int cpu_threads(void)
{
	pthread_once(&cpu_once, cpu_init);
	return __atomic_load_n(&cpu_nthreads, __ATOMIC_RELAXED);
}

static const char *cpu_describe(void)
{
	static __thread char buf[160];
	pthread_once(&cpu_once, cpu_init);
	static const char *driver[] = { "", "AVX2 GEMM driver, ", "AVX-512 GEMM driver, ",
		                        "AMX and AVX-512 GEMM driver, " };
	snprintf(buf, sizeof buf, "cpu: %sOpenBLAS core %s, %d threads", driver[kern_gemm_kind_now()],
	         openblas_get_corename(), cpu_threads());
	return buf;
}

static const kern_backend backend_cpu = {
	.name = "cpu",
	.sgemm = cpu_sgemm,
	.sgemm_bias = cpu_sgemm_bias,
	.sgemm_residual = cpu_sgemm_residual,
	.sgemm_colsum = cpu_sgemm_colsum,
	.sgemm_gelu = cpu_sgemm_gelu,
	.sgemm_serial = serial1,
	.sgemm_batched = cpu_sgemm_batched,
	.set_threads = cpu_set_threads,
	.threads = cpu_threads,
	.describe = cpu_describe,
};

const kern_backend *kern_backend_get(void)
{
	pthread_once(&cpu_once, cpu_init);
	return &backend_cpu;
}

void kern_set_threads(int n) { kern_backend_get()->set_threads(n); }

static __thread int here_threads; /* kern_set_threads_here's, 0: none */

int kern_threads(void) { return here_threads > 0 ? here_threads : cpu_threads(); }

void kern_set_threads_here(int n) { here_threads = n > 0 ? n : 0; }

const char *kern_blas_coretype_hint(void)
{
	static const char *generic[] = { "Prescott",  "Core2",  "Penryn",      "Dunnington",
		                         "Nehalem",   "Atom",   "Katmai",      "Coppermine",
		                         "Northwood", "Banias", "Sandybridge", NULL };
	const char *core = openblas_get_corename();
	bool is_generic = false;
	for (int i = 0; generic[i]; i++)
		if (core && strcmp(core, generic[i]) == 0)
			is_generic = true;
	if (!is_generic)
		return NULL;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
	return NULL;
}

void kern_blas_reexec_if_needed(int argc, char **argv)
{
	if (argc < 1 || !argv || !argv[0] || argv[argc] != NULL)
		return;
	if (getenv(KERN_BLAS_REEXEC_ENV))
		return;
	const char *hint = getenv("OPENBLAS_CORETYPE") ? NULL : kern_blas_coretype_hint();
	bool spin = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
	if (!hint && !spin)
		return;
	/* the marker first: should the exec fail and the program later run
	 * another of ours, that one does not try again either */
	if (setenv(KERN_BLAS_REEXEC_ENV, hint ? hint : "-", 1) != 0 ||
	    (hint && setenv("OPENBLAS_CORETYPE", hint, 1) != 0) ||
	    (spin && setenv("GOMP_SPINCOUNT", KERN_OMP_SPINCOUNT, 1) != 0))
		return;
	execv("/proc/self/exe", argv);
	/* Still here: run on as loaded (describe() names the core).  No log
	 * line: this runs before the program has set up its logging, and the
	 * library does not depend on it.  The variables stay set, which helps
	 * any program we start and harms nothing. */
}
