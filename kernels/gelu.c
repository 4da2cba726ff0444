/* cotrain kernels: GELU, tanh approximation and exact.  See gelu.h. */
#include "kernels/gelu.h"

#include "kernels/backend.h"
#include "kernels/vecmath.h"

#include <math.h>

#define GELU_BETA 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f
#define GELU_CHUNK 4096

KERN_SIMD static void gelu_fwd(float *out, const float *inp, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = inp[i];
		float u = GELU_BETA * (x + GELU_KAPPA * x * x * x);
		out[i] = 0.5f * x * (1.0f + kern_tanhf(u));
	}
}

/* gelu'(x) */
static inline float gelu_grad(float x)
{
	float x2 = x * x;
	float t = kern_tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
	float left_d = 0.5f * (1.0f + t);
	float right_d = 0.5f * x * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
	return left_d + right_d;
}

/* dinp = dout * gelu'(inp), added to dinp when acc */
KERN_SIMD static void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n, int acc)
{
	if (acc)
		for (size_t i = 0; i < n; i++)
			dinp[i] += dout[i] * gelu_grad(inp[i]);
	else
		for (size_t i = 0; i < n; i++)
			dinp[i] = dout[i] * gelu_grad(inp[i]);
}

void kern_gelu_forward(float *out, const float *inp, size_t n)
{
	int nt = kern_threads();
	long nchunks = (long)((n + GELU_CHUNK - 1) / GELU_CHUNK);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nchunks > 1)
	for (long ch = 0; ch < nchunks; ch++) {
		size_t lo = (size_t)ch * GELU_CHUNK;
		size_t hi = lo + GELU_CHUNK < n ? lo + GELU_CHUNK : n;
		gelu_fwd(out + lo, inp + lo, hi - lo);
	}
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, int acc)
{
	int nt = kern_threads();
	long nchunks = (long)((n + GELU_CHUNK - 1) / GELU_CHUNK);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nchunks > 1)
	for (long ch = 0; ch < nchunks; ch++) {
		size_t lo = (size_t)ch * GELU_CHUNK;
		size_t hi = lo + GELU_CHUNK < n ? lo + GELU_CHUNK : n;
		gelu_bwd(dinp + lo, inp + lo, dout + lo, hi - lo, acc);
	}
}

void kern_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
	gelu_backward(dinp, inp, dout, n, 1);
}

void kern_gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n)
{
	gelu_backward(dinp, inp, dout, n, 0);
}

void kern_gelu_forward_span(float *out, const float *inp, size_t n) { gelu_fwd(out, inp, n); }

void kern_gelu_backward_set_span(float *dinp, const float *inp, const float *dout, size_t n)
{
	gelu_bwd(dinp, inp, dout, n, 0);
}

#define GELU_RSQRT2 0.70710678118654752f   /* 1/sqrt(2) */
#define GELU_RSQRT2PI 0.39894228040143268f /* 1/sqrt(2 pi) */

static void gelu_erf_fwd(float *out, const float *inp, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = inp[i];
		out[i] = 0.5f * x * (1.0f + erff(x * GELU_RSQRT2));
	}
}

/* gelu'(x) = Phi(x) + x phi(x) */
static void gelu_erf_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = inp[i];
		float cdf = 0.5f * (1.0f + erff(x * GELU_RSQRT2));
		float pdf = GELU_RSQRT2PI * kern_expf(-0.5f * x * x);
		dinp[i] = dout[i] * (cdf + x * pdf);
	}
}

void kern_gelu_erf_forward(float *out, const float *inp, size_t n)
{
	int nt = kern_threads();
	long nchunks = (long)((n + GELU_CHUNK - 1) / GELU_CHUNK);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nchunks > 1)
	for (long ch = 0; ch < nchunks; ch++) {
		size_t lo = (size_t)ch * GELU_CHUNK;
		size_t hi = lo + GELU_CHUNK < n ? lo + GELU_CHUNK : n;
		gelu_erf_fwd(out + lo, inp + lo, hi - lo);
	}
}

void kern_gelu_erf_backward_set(float *dinp, const float *inp, const float *dout, size_t n)
{
	int nt = kern_threads();
	long nchunks = (long)((n + GELU_CHUNK - 1) / GELU_CHUNK);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nchunks > 1)
	for (long ch = 0; ch < nchunks; ch++) {
		size_t lo = (size_t)ch * GELU_CHUNK;
		size_t hi = lo + GELU_CHUNK < n ? lo + GELU_CHUNK : n;
		gelu_erf_bwd(dinp + lo, inp + lo, dout + lo, hi - lo);
	}
}
