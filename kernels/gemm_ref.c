/* cotrain kernels: the GEMM driver's plain loop (gemm_ref), its answer
 * when no kernel runs: called with the driver off (no kernel this CPU
 * surely runs, or a CPU that is not x86-64), or when memory for the
 * packed operands is short.  Portable C, no packing, no buffers. */
#include "kernels/gemm_kernel.h"

#include <stddef.h>

/* Each element summed from zero in k order (separate multiplies and adds:
 * the library is built with -ffp-contract=off), then added to its base as
 * the kernels' epilogue does; so deterministic, but not the kernels' bits.
 * g->beta is read only where R is NULL, as the kernels do. */
void gemm_ref(const gemm_args *g)
{
	int M = g->M, N = g->N, K = g->K, lda = g->lda, ldb = g->ldb, ldc = g->ldc;
	const float *A = g->A, *B = g->B, *R = g->R, *bias = g->bias;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			float acc = 0.0f;
			for (int k = 0; k < K; k++)
				acc += (g->ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
				       (g->tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
			float *c = g->C + (size_t)i * ldc + j;
			float base = R ? R[(size_t)i * ldc + j] : g->beta == 0.0f ? 0.0f : g->beta * *c;
			if (bias)
				base += bias[j];
			*c = base + g->alpha * acc;
		}
	if (g->colsum) /* kern_colsum_add's sums (g->colsum is NULL for tb) */
		for (int j = 0; j < N; j++) {
			double acc = 0;
			for (int k = 0; k < K; k++)
				acc += B[(size_t)k * ldb + j];
			g->colsum[j] += (float)acc;
		}
}
