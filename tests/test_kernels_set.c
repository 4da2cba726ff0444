/* The "_set" variants of the backward kernels, which write their output
 * instead of adding to it (so the model skips a zeroing pass), must give
 * exactly what the accumulating ones give into zeros, whatever the output
 * held before (garbage and NaN included), and leave the accumulated weight
 * gradients as the accumulating ones do.  Likewise the residual projection,
 * which copies the residual per tile, against a copy then an add. */
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "kernels/rng.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kern_rng rng;

static float *randv(size_t n)
{
	float *x = malloc(n * sizeof *x);
	if (!x)
		bail_out("out of memory");
	for (size_t i = 0; i < n; i++)
		x[i] = (float)kern_rng_normal(&rng);
	return x;
}

static float *zerov(size_t n)
{
	float *x = calloc(n, sizeof *x);
	if (!x)
		bail_out("out of memory");
	return x;
}

/* garbage: large values, and a NaN every 7th element */
static float *junkv(size_t n)
{
	float *x = randv(n);
	for (size_t i = 0; i < n; i++)
		x[i] = i % 7 == 0 ? NAN : x[i] * 1e30f;
	return x;
}

/* element-wise equality (+0 and -0 are equal: 0 + -0 is +0) */
static bool same(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!(a[i] == b[i]))
			return false;
	return true;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	plan_lazy();
	kern_rng_seed(&rng, 11);
	kern_set_threads(2);

	{ /* GELU */
		size_t n = 100003;
		float *x = randv(n), *d = randv(n), *a = zerov(n), *b = junkv(n);
		kern_gelu_backward(a, x, d, n);
		kern_gelu_backward_set(b, x, d, n);
		ok(same(a, b, n), "gelu: set equals accumulate into zeros");
		free(x);
		free(d);
		free(a);
		free(b);
	}
	{ /* cross-entropy */
		int N = 300, V = 256;
		float *l = randv((size_t)N * V), *a = zerov((size_t)N * V), *b = junkv((size_t)N * V);
		int32_t *t = malloc(sizeof(int32_t) * N);
		for (int i = 0; i < N; i++)
			t[i] = (int32_t)(kern_rng_next(&rng) % (uint64_t)V);
		kern_crossentropy_backward(a, l, t, 1.0f / N, N, V);
		kern_crossentropy_backward_set(b, l, t, 1.0f / N, N, V);
		ok(same(a, b, (size_t)N * V), "cross-entropy: set equals accumulate into zeros");
		free(l);
		free(a);
		free(b);
		free(t);
	}
	{ /* linear, big enough to be tiled */
		int M = 1100, K = 200, N = 700;
		float *x = randv((size_t)M * K), *W = randv((size_t)K * N), *d = randv((size_t)M * N);
		float *a = zerov((size_t)M * K), *b = junkv((size_t)M * K);
		float *dW1 = randv((size_t)K * N), *dW2 = malloc(sizeof(float) * K * N);
		float *db1 = randv(N), *db2 = malloc(sizeof(float) * N);
		memcpy(dW2, dW1, sizeof(float) * K * N);
		memcpy(db2, db1, sizeof(float) * N);
		kern_linear_backward(a, dW1, db1, d, x, W, M, K, N);
		kern_linear_backward_set(b, dW2, db2, d, x, W, M, K, N);
		ok(same(a, b, (size_t)M * K), "linear: set dinp equals accumulate into zeros");
		ok(memcmp(dW1, dW2, sizeof(float) * K * N) == 0 && memcmp(db1, db2, sizeof(float) * N) == 0,
		   "linear: set still accumulates dW and dbias, bit for bit");
		free(x);
		free(W);
		free(d);
		free(a);
		free(b);
		free(dW1);
		free(dW2);
		free(db1);
		free(db2);
	}
	{ /* the residual projection against copy-then-add, with and without bias */
		int M = 1100, K = 300, N = 200;
		float *x = randv((size_t)M * K), *W = randv((size_t)K * N), *r = randv((size_t)M * N);
		float *bias = randv(N), *a = malloc(sizeof(float) * M * N), *b = junkv((size_t)M * N);
		for (int withb = 0; withb < 2; withb++) {
			memcpy(a, r, sizeof(float) * M * N);
			kern_linear_forward_add(a, x, W, withb ? bias : NULL, M, K, N);
			kern_linear_forward_residual(b, r, x, W, withb ? bias : NULL, M, K, N);
			ok(memcmp(a, b, sizeof(float) * M * N) == 0,
			   "residual projection%s equals copy then add, bit for bit",
			   withb ? " with bias" : "");
		}
		free(x);
		free(W);
		free(r);
		free(bias);
		free(a);
		free(b);
	}
	{ /* attention, two row blocks and a ragged one */
		int B = 2, T = 150, C = 64, NH = 4;
		size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
		float *qkv = randv(n3), *y = zerov(n1), *att = zerov(na), *dy = randv(n1);
		float *datt = zerov(na), *a = zerov(n3), *b = junkv(n3);
		kern_attention_forward(y, att, qkv, B, T, C, NH);
		kern_attention_backward(a, datt, dy, qkv, att, B, T, C, NH);
		kern_attention_backward_set(b, datt, dy, qkv, att, B, T, C, NH);
		ok(same(a, b, n3), "attention: set equals accumulate into zeros");
		free(qkv);
		free(y);
		free(att);
		free(dy);
		free(datt);
		free(a);
		free(b);
	}
	done_testing();
	return exit_status();
}
