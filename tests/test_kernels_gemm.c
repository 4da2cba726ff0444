/* The backend's GEMM driver (kernels/gemm*.c) against a double-precision
 * reference, and bit-identical on 1, 2 and 3 threads.
 *
 * Every transpose combination, shapes with ragged edges (rows not a multiple
 * of the micro-kernel's 12, columns not of 32, K not of the block length),
 * beta 0 over NaN, beta 1 and 0.5, alpha, bias, and the residual form.
 * Each result must be within 1e-5 of the reference relative to the largest
 * |A| |B| sum, and byte-equal across thread counts.  The same products also
 * go through the backend's sgemm_bias / sgemm_residual (whichever path this
 * CPU takes) and must agree with the reference there too.
 * kern_gemm_colsum (weight and bias gradients in one pass) must equal
 * kern_gemm plus kern_colsum_add bit for bit.  Every check runs once per
 * kernel of the driver this CPU has (AVX2, AVX-512, AMX; the others are
 * skipped), the AMX one reaching fp32's accuracy, not bf16's (a single
 * product a b within 2^-21); where the CPU has both, the AVX2 and AVX-512
 * kernels must give the same bits. */
#include "kernels/backend.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/matmul.h"
#include "kernels/rng.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	int M, N, K;
	bool ta, tb;
	float alpha, beta;
	bool bias, res;
} shape;

static const char *kernel = "avx2"; /* the driver's kernel, for names */

static float *randv(kern_rng *r, size_t n)
{
	float *x = malloc((n ? n : 1) * sizeof *x);
	if (!x)
		bail_out("out of memory");
	for (size_t i = 0; i < n; i++)
		x[i] = (float)kern_rng_normal(r);
	return x;
}

/* C (M x N, ldc N) from A, B in the shape's layout, in double */
static void reference(const shape *s, const float *A, const float *B, const float *C0, const float *bias,
                      const float *R, double *out, double *scale)
{
	int M = s->M, N = s->N, K = s->K, lda = s->ta ? M : K, ldb = s->tb ? K : N;
	*scale = 0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double acc = 0, mag = 0;
			for (int k = 0; k < K; k++) {
				double a = s->ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
				double b = s->tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
				acc += a * b;
				mag += fabs(a * b);
			}
			double base = R                 ? R[(size_t)i * N + j]
			              : s->beta == 0.0f ? 0.0
			                                : s->beta * (double)C0[(size_t)i * N + j];
			if (bias)
				base += bias[j];
			out[(size_t)i * N + j] = base + s->alpha * acc;
			double m = fabs(s->alpha) * mag + fabs(base);
			if (m > *scale)
				*scale = m;
		}
}

static double max_err(const float *C, const double *ref, size_t n)
{
	double e = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)C[i] - ref[i]);
		if (!(d <= e)) /* NaN counts */
			e = isnan(d) ? INFINITY : d;
	}
	return e;
}

/* A shape's random operands: A, B, C's old contents, and the bias and
 * residual when the shape has them. */
typedef struct {
	float *A, *B, *C0, *bias, *R;
} operands;

static operands operands_new(const shape *s, kern_rng *rng)
{
	size_t nc = (size_t)s->M * s->N;
	operands o = { randv(rng, (size_t)s->M * s->K), randv(rng, (size_t)s->K * s->N), randv(rng, nc),
		       s->bias ? randv(rng, s->N) : NULL, s->res ? randv(rng, nc) : NULL };
	return o;
}

static void operands_free(operands *o)
{
	free(o->A);
	free(o->B);
	free(o->C0);
	free(o->bias);
	free(o->R);
}

static void run_shape(const shape *s, kern_rng *rng)
{
	int M = s->M, N = s->N, K = s->K, lda = s->ta ? M : K, ldb = s->tb ? K : N;
	size_t nc = (size_t)M * N;
	operands o = operands_new(s, rng);
	float *A = o.A, *B = o.B, *C0 = o.C0, *bias = o.bias, *R = o.R;
	if (s->beta == 0.0f && !R)
		for (size_t i = 0; i < nc; i++)
			C0[i] = NAN; /* beta 0 must ignore C */
	double *ref = malloc(nc * sizeof *ref), scale;
	float *C[4];
	if (!ref)
		bail_out("out of memory");
	reference(s, A, B, C0, bias, R, ref, &scale);
	double tol = 1e-5 * (scale > 1 ? scale : 1);
	char what[160];
	snprintf(what, sizeof what, "[%s] %dx%dx%d ta=%d tb=%d alpha=%g beta=%g%s%s", kernel, M, N, K, s->ta,
	         s->tb, s->alpha, s->beta, s->bias ? " bias" : "", s->res ? " residual" : "");
	for (int t = 0; t < 4; t++) {
		C[t] = malloc(nc * sizeof(float));
		if (!C[t])
			bail_out("out of memory");
		memcpy(C[t], C0, nc * sizeof(float));
	}
	if (kern_gemm_usable()) {
		for (int t = 1; t <= 3; t++)
			kern_gemm(s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C[t], N, bias, R,
			          t);
		double e = max_err(C[1], ref, nc);
		ok(e <= tol, "driver %s: max error %.3g <= %.3g", what, e, tol);
		ok(memcmp(C[1], C[2], nc * sizeof(float)) == 0 && memcmp(C[1], C[3], nc * sizeof(float)) == 0,
		   "driver %s: bit-identical on 1, 2 and 3 threads", what);
	} else {
		skip(2, "the GEMM driver is off");
	}
	/* the backend's entry points, whichever path this CPU takes */
	const kern_backend *be = kern_backend_get();
	if (R)
		be->sgemm_residual(s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, R, C[0], N, bias);
	else
		be->sgemm_bias(s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C[0], N, bias);
	double e = max_err(C[0], ref, nc);
	ok(e <= tol, "backend %s: max error %.3g <= %.3g", what, e, tol);
	for (int t = 0; t < 4; t++)
		free(C[t]);
	free(ref);
	operands_free(&o);
}

/* kern_gemm_colsum: the product bit-identical to kern_gemm's, the column
 * sums bit-identical to kern_colsum_add's, on 1 and 2 threads */
static void run_colsum(bool ta, int M, int N, int K, kern_rng *rng)
{
	if (!kern_gemm_usable()) {
		skip(2, "the GEMM driver is off");
		return;
	}
	float *A = randv(rng, (size_t)K * M), *B = randv(rng, (size_t)K * N);
	float *C0 = randv(rng, (size_t)M * N), *s0 = randv(rng, N);
	size_t nc = (size_t)M * N;
	float *C1 = malloc(nc * sizeof(float)), *C2 = malloc(nc * sizeof(float));
	float *s1 = malloc(N * sizeof(float)), *s2 = malloc(N * sizeof(float));
	if (!C1 || !C2 || !s1 || !s2)
		bail_out("out of memory");
	memcpy(C1, C0, nc * sizeof(float));
	memcpy(s1, s0, N * sizeof(float));
	int lda = ta ? M : K;
	kern_gemm(ta, false, M, N, K, 1.0f, A, lda, B, N, 1.0f, C1, N, NULL, NULL, 2);
	kern_colsum_add(s1, B, K, N);
	bool same = true;
	for (int t = 1; t <= 2; t++) {
		memcpy(C2, C0, nc * sizeof(float));
		memcpy(s2, s0, N * sizeof(float));
		bool did = kern_gemm_colsum(ta, false, M, N, K, 1.0f, A, lda, B, N, 1.0f, C2, N, s2, t);
		same = same && did && memcmp(C1, C2, nc * sizeof(float)) == 0;
		if (t == 1)
			ok(did && memcmp(s1, s2, N * sizeof(float)) == 0,
			   "[%s] colsum %dx%dx%d ta=%d: column sums equal kern_colsum_add's bit for bit",
			   kernel, M, N, K, ta);
	}
	ok(same, "[%s] colsum %dx%dx%d ta=%d: product equals kern_gemm's on 1 and 2 threads", kernel, M, N, K,
	   ta);
	free(A);
	free(B);
	free(C0);
	free(C1);
	free(C2);
	free(s0);
	free(s1);
	free(s2);
}

/* The backend's sgemm_gelu (fused where the driver runs): C as sgemm_bias
 * computes it, G = gelu(C) or C * gelu'(X) as the separate GELU pass
 * computes it, bit for bit, on 1 and 2 threads. */
static void run_gelu(int M, int N, int K, int op, kern_rng *rng)
{
	const kern_backend *be = kern_backend_get();
	size_t nc = (size_t)M * N;
	float *A = randv(rng, (size_t)M * K), *B = randv(rng, (size_t)K * N);
	float *bias = randv(rng, N), *X = randv(rng, nc);
	float *C1 = malloc(nc * sizeof(float)), *G1 = malloc(nc * sizeof(float));
	float *C2 = malloc(nc * sizeof(float)), *G2 = malloc(nc * sizeof(float));
	if (!C1 || !G1 || !C2 || !G2)
		bail_out("out of memory");
	bool same = true;
	for (int t = 1; t <= 2; t++) {
		kern_set_threads(t);
		be->sgemm_bias(false, op == KERN_GEMM_GELU_BWD, M, N, K, 1.0f, A, K, B,
		               op == KERN_GEMM_GELU_BWD ? K : N, 0.0f, C1, N, bias);
		if (op == KERN_GEMM_GELU_FWD)
			kern_gelu_forward(G1, C1, nc);
		else
			kern_gelu_backward_set(G1, X, C1, nc);
		for (size_t i = 0; i < nc; i++)
			G2[i] = C2[i] = NAN;
		be->sgemm_gelu(false, op == KERN_GEMM_GELU_BWD, M, N, K, 1.0f, A, K, B,
		               op == KERN_GEMM_GELU_BWD ? K : N, 0.0f, C2, N, bias, op, G2, X);
		same = same && memcmp(C1, C2, nc * sizeof(float)) == 0 &&
		       memcmp(G1, G2, nc * sizeof(float)) == 0;
	}
	kern_set_threads(2);
	ok(same, "[%s] sgemm_gelu %s %dx%dx%d: product and GELU equal the separate passes bit for bit",
	   kernel, op == KERN_GEMM_GELU_FWD ? "forward" : "backward", M, N, K);
	free(A);
	free(B);
	free(bias);
	free(X);
	free(C1);
	free(G1);
	free(C2);
	free(G2);
}

/* One term per element (K 1): C = a b within 2^-21 of the exact product,
 * fp32's accuracy (the AMX kernel sums six partial products, rounding each
 * addition in fp32: up to about 2^-22; bf16 parts alone would be 2^-8 off,
 * two of them 2^-16). */
static void run_precision(kern_rng *rng)
{
	if (!kern_gemm_usable()) {
		skip(1, "the GEMM driver is off");
		return;
	}
	enum { M = 64, N = 64 };
	float *A = randv(rng, M), *B = randv(rng, N), *C = malloc(M * N * sizeof(float));
	if (!C)
		bail_out("out of memory");
	kern_gemm(false, false, M, N, 1, 1.0f, A, 1, B, N, 0.0f, C, N, NULL, NULL, 1);
	double worst = 0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double exact = (double)A[i] * B[j];
			double rel = fabs(C[i * N + j] - exact) / fabs(exact);
			if (!(rel <= worst))
				worst = isnan(rel) ? INFINITY : rel;
		}
	ok(worst <= 0x1p-21, "[%s] 64 x 64 single products: relative error %.3g <= 2^-21", kernel, worst);
	free(A);
	free(B);
	free(C);
}

/* Every check above with the driver's current kernel. */
static void run_all(const shape *shapes, int n, kern_rng *rng)
{
	for (int i = 0; i < n; i++)
		run_shape(&shapes[i], rng);
	run_colsum(true, 64, 192, 256, rng);
	run_colsum(true, 131, 77, 300, rng);
	run_colsum(true, 40, 530, 1030, rng);
	run_colsum(false, 131, 77, 300, rng);
	run_colsum(false, 40, 530, 1030, rng);
	run_gelu(300, 200, 64, KERN_GEMM_GELU_FWD, rng);
	run_gelu(131, 77, 300, KERN_GEMM_GELU_FWD, rng);
	run_gelu(300, 200, 64, KERN_GEMM_GELU_BWD, rng);
	run_gelu(131, 530, 600, KERN_GEMM_GELU_BWD, rng);
	run_precision(rng);
}

/* Every shape through the AVX2 and the AVX-512 kernels: the same bits. */
static void run_same(const shape *shapes, int n, kern_rng *rng)
{
	if (!kern_gemm_use(KERN_GEMM_AVX512)) {
		skip(1, "no AVX-512 on this CPU: only the AVX2 kernel runs");
		return;
	}
	const char *differ = NULL;
	for (int i = 0; i < n && !differ; i++) {
		const shape *s = &shapes[i];
		int M = s->M, N = s->N, K = s->K, lda = s->ta ? M : K, ldb = s->tb ? K : N;
		size_t nc = (size_t)M * N;
		operands o = operands_new(s, rng);
		float *C[2];
		for (int v = 0; v < 2; v++) {
			if (!(C[v] = malloc(nc * sizeof(float))))
				bail_out("out of memory");
			memcpy(C[v], o.C0, nc * sizeof(float));
			kern_gemm_use(v ? KERN_GEMM_AVX2 : KERN_GEMM_AVX512);
			kern_gemm(s->ta, s->tb, M, N, K, s->alpha, o.A, lda, o.B, ldb, s->beta, C[v], N,
			          o.bias, o.R, 2);
		}
		kern_gemm_use(KERN_GEMM_AVX512);
		static char what[96];
		if (memcmp(C[0], C[1], nc * sizeof(float)) != 0) {
			snprintf(what, sizeof what, "%dx%dx%d ta=%d tb=%d", M, N, K, s->ta, s->tb);
			differ = what;
		}
		operands_free(&o);
		free(C[0]);
		free(C[1]);
	}
	ok(!differ, "the AVX2 and AVX-512 kernels give the same bits on all %d shapes%s%s", n,
	   differ ? "; they differ at " : "", differ ? differ : "");
}

/* kern_gemm called with the driver off (against its contract) still
 * computes the product, on its plain loop, instead of running a kernel the
 * CPU may lack. */
static void run_off(const shape *s, kern_rng *rng)
{
	int M = s->M, N = s->N, K = s->K, lda = s->ta ? M : K, ldb = s->tb ? K : N;
	size_t nc = (size_t)M * N;
	operands o = operands_new(s, rng);
	double *ref = malloc(nc * sizeof *ref), scale;
	if (!ref)
		bail_out("out of memory");
	reference(s, o.A, o.B, o.C0, o.bias, o.R, ref, &scale);
	kern_gemm_use(KERN_GEMM_BLAS);
	kern_gemm(s->ta, s->tb, M, N, K, s->alpha, o.A, lda, o.B, ldb, s->beta, o.C0, N, o.bias, o.R, 2);
	double e = max_err(o.C0, ref, nc), tol = 1e-5 * (scale > 1 ? scale : 1);
	ok(e <= tol, "driver off: kern_gemm %dx%dx%d still computes the product (max error %.3g <= %.3g)", M,
	   N, K, e, tol);
	operands_free(&o);
	free(ref);
}

int main(void)
{
	kern_set_threads(2);
	kern_rng rng;
	kern_rng_seed(&rng, 42);
	static const shape shapes[] = {
		/* the model's forward, dinp and dW forms at small sizes */
		{ 256, 192, 64, false, false, 1.0f, 0.0f, true, false },
		{ 256, 64, 64, false, false, 1.0f, 1.0f, true, true },
		{ 256, 64, 256, false, true, 1.0f, 0.0f, false, false },
		{ 64, 192, 256, true, false, 1.0f, 1.0f, false, false },
		{ 256, 256, 64, true, true, 1.0f, 0.0f, false, false },
		/* ragged: rows % 12, columns % 32 and % 16, K over a block */
		{ 131, 77, 300, false, false, 1.0f, 0.0f, true, false },
		{ 131, 77, 300, false, true, 0.5f, 1.0f, false, false },
		{ 131, 77, 300, true, false, 1.0f, 0.5f, true, false },
		{ 131, 77, 300, true, true, -2.0f, 0.0f, false, false },
		{ 37, 530, 600, false, false, 1.0f, 1.0f, true, true },
		{ 600, 13, 1030, true, false, 1.0f, 1.0f, false, false },
		{ 1100, 600, 17, false, true, 1.0f, 0.0f, true, false },
		{ 5, 3, 1, false, false, 1.0f, 0.0f, false, false },
		{ 12, 32, 512, false, false, 1.0f, 0.0f, true, true },
		{ 700, 1100, 3, true, true, 1.0f, 0.0f, false, true },
	};
	int n = (int)(sizeof shapes / sizeof shapes[0]);
	int per_kernel = 3 * n + 2 * 5 + 4 + 1;
	static const struct {
		kern_gemm_kind kind;
		const char *why; /* when this CPU lacks it */
	} kinds[] = {
		{ KERN_GEMM_AVX2, "no AVX2 and FMA on this CPU" },
		{ KERN_GEMM_AVX512, "no AVX-512 on this CPU" },
		{ KERN_GEMM_AMX, "no AMX-BF16 on this CPU, or the kernel does not grant it" },
	};
	plan(3 * per_kernel + 2);
	for (int k = 0; k < 3; k++) {
		kernel = kern_gemm_kind_name(kinds[k].kind);
		if (kern_gemm_use(kinds[k].kind))
			run_all(shapes, n, &rng);
		else
			skip(per_kernel, kinds[k].why);
	}
	if (kern_gemm_use(KERN_GEMM_AVX2))
		run_same(shapes, n, &rng);
	else
		skip(1, "no AVX2 and FMA on this CPU");
	run_off(&shapes[9], &rng);
	return exit_status();
}
