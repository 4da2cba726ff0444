/* cotrain kernels: the linear layer.  See matmul.h. */
#include "kernels/matmul.h"

#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "kernels/vecmath.h"

#include <stddef.h>

void kern_linear_forward(float *out, const float *inp, const float *W, const float *bias, int M, int K, int N)
{
	kern_backend_get()->sgemm_bias(false, false, M, N, K, 1.0f, inp, K, W, N, 0.0f, out, N, bias);
}

void kern_linear_forward_add(float *out, const float *inp, const float *W, const float *bias, int M, int K,
                             int N)
{
	kern_backend_get()->sgemm_bias(false, false, M, N, K, 1.0f, inp, K, W, N, 1.0f, out, N, bias);
}

void kern_linear_forward_residual(float *out, const float *res, const float *inp, const float *W,
                                  const float *bias, int M, int K, int N)
{
	kern_backend_get()->sgemm_residual(false, false, M, N, K, 1.0f, inp, K, W, N, res, out, N, bias);
}

void kern_linear_forward_gelu(float *out, float *gout, const float *inp, const float *W, const float *bias,
                              int M, int K, int N)
{
	kern_backend_get()->sgemm_gelu(false, false, M, N, K, 1.0f, inp, K, W, N, 0.0f, out, N, bias,
	                               KERN_GEMM_GELU_FWD, gout, NULL);
}

/* dst[0..nc) += column sums of the nc columns at src (row stride N). */
KERN_SIMD static void colsum_block(float *dst, const float *src, int M, int N, int nc)
{
	double acc[64] = { 0 };
	for (int m = 0; m < M; m++) {
		const float *s = src + (size_t)m * N;
		for (int j = 0; j < nc; j++)
			acc[j] += s[j];
	}
	for (int j = 0; j < nc; j++)
		dst[j] += (float)acc[j];
}

void kern_colsum_add(float *dst, const float *src, int M, int N)
{
	enum { CB = 64 };
	int nt = kern_threads();
	int nblocks = (N + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && (long)M * N > 65536)
	for (int b = 0; b < nblocks; b++) {
		int c0 = b * CB, nc = N - c0 < CB ? N - c0 : CB;
		colsum_block(dst + c0, src + c0, M, N, nc);
	}
}

/* dgelu: dinp is the product's scratch and dgelu = dinp * gelu'(gx) */
static void linear_backward(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                            const float *W, int M, int K, int N, float beta, float *dgelu, const float *gx)
{
	const kern_backend *be = kern_backend_get();
	if (dinp && dgelu)
		be->sgemm_gelu(false, true, M, K, N, 1.0f, dout, N, W, N, 0.0f, dinp, K, NULL,
		               KERN_GEMM_GELU_BWD, dgelu, gx);
	else if (dinp) /* dinp[M,K] = beta * dinp + dout[M,N] @ W[K,N]^T */
		be->sgemm(false, true, M, K, N, 1.0f, dout, N, W, N, beta, dinp, K);
	/* dW[K,N] += inp[M,K]^T @ dout[M,N], and dbias[N] += column sums of
	 * dout, in one pass over dout where the backend can */
	if (dbias && be->sgemm_colsum(true, false, K, N, M, 1.0f, inp, K, dout, N, 1.0f, dW, N, dbias))
		return;
	be->sgemm(true, false, K, N, M, 1.0f, inp, K, dout, N, 1.0f, dW, N);
	if (dbias)
		kern_colsum_add(dbias, dout, M, N);
}

void kern_linear_backward(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                          const float *W, int M, int K, int N)
{
	linear_backward(dinp, dW, dbias, dout, inp, W, M, K, N, 1.0f, NULL, NULL);
}

void kern_linear_backward_set(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                              const float *W, int M, int K, int N)
{
	linear_backward(dinp, dW, dbias, dout, inp, W, M, K, N, 0.0f, NULL, NULL);
}

void kern_linear_backward_set_gelu(float *dpre, float *dx, const float *x, float *dW, float *dbias,
                                   const float *dout, const float *inp, const float *W, int M, int K, int N)
{
	linear_backward(dpre, dW, dbias, dout, inp, W, M, K, N, 0.0f, dx, x);
}
