/* cotrain tests: the linear sketch of shared/common/sketch.h.
 *
 * Against a plain implementation of the definition written from the
 * header's formula; linearity and range splitting (exact on vectors whose
 * sums are exact in fp32 and double, within 1e-12 on any); the same bits
 * from threads run at once; and that a perturbation of 1% of a vector's
 * norm moves its sketch past the 1e-3 tolerance for every seed tried.
 * The cost is printed beside one pass summing the same vector. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/common/sketch.h"
#include "tests/tap.h"

static uint64_t ref_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/* d_j(i) exactly as sketch.h states it. */
static int ref_sign(uint64_t seed, int j, uint64_t i)
{
	const uint64_t G = 0x9E3779B97F4A7C15ULL;
	uint64_t r = ref_mix64(seed + G * (i / 64 + 1));
	uint64_t a = ref_mix64(seed + G * ((((uint64_t)j / 64 + 1) << 56) + i / 64 + 1));
	int rs = (r >> (i % 64)) & 1 ? -1 : 1, as = (a >> (j % 64)) & 1 ? -1 : 1;
	return rs * as;
}

static uint64_t rng = 88172645463325252ULL;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* Values k/1024 with |k| < 2^10: every sum of a few thousand is exact in
 * fp32 and in double, whatever the order. */
static void fill_exact(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((int)(urand() * 2047) - 1023) / 1024.0f;
}

static double maxabs(const double *a, int k)
{
	double m = 0;
	for (int j = 0; j < k; j++)
		m = fmax(m, fabs(a[j]));
	return m;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
	const float *x;
	size_t n;
	double out[SKETCH_K_MAX];
} thread_job;

static void *sketch_thread(void *arg)
{
	thread_job *t = arg;
	memset(t->out, 0, sizeof t->out);
	sketch_add(t->x, t->n, 0, 0xC0FFEE, 100, t->out);
	return NULL;
}

int main(void)
{
	plan_lazy();

	/* The definition, at k = 70 (two hash blocks of projections) and an
	 * offset that is not a multiple of 64. */
	{
		enum { N = 1000, K = 70 };
		static float x[N];
		fill_exact(x, N);
		double got[K] = { 0 }, want[K] = { 0 };
		uint64_t first = 12345, seed = 0xDEADBEEFCAFEULL;
		sketch_add(x, N, first, seed, K, got);
		for (int j = 0; j < K; j++)
			for (size_t i = 0; i < N; i++)
				want[j] += ref_sign(seed, j, first + i) * (double)x[i];
		int same = 1;
		for (int j = 0; j < K; j++)
			same &= got[j] == want[j];
		ok(same, "sketch_add matches the header's definition exactly (k 70, first 12345)");
		double again[K] = { 0 };
		sketch_add(x, N, first, seed, K, again);
		ok(memcmp(again, got, sizeof got) == 0, "the same inputs give the same bits");
		double other[K] = { 0 };
		sketch_add(x, N, first, seed + 1, K, other);
		ok(sketch_distance(got, other, K) > 0.5,
		   "another seed gives an unrelated sketch (distance %.2f)", sketch_distance(got, other, K));
	}

	/* Linearity and range splitting, exact on exact sums. */
	{
		enum { N = 5000, K = 16 };
		static float x[N], y[N], z[N];
		fill_exact(x, N);
		fill_exact(y, N);
		for (size_t i = 0; i < N; i++)
			z[i] = x[i] + y[i]; /* exact */
		double sx[K] = { 0 }, sy[K] = { 0 }, sz[K] = { 0 }, sxy[K] = { 0 };
		sketch_add(x, N, 0, 7, K, sx);
		sketch_add(y, N, 0, 7, K, sy);
		sketch_add(z, N, 0, 7, K, sz);
		memcpy(sxy, sx, sizeof sx);
		sketch_add(y, N, 0, 7, K, sxy); /* accumulating: sketch(x) + sketch(y) */
		int lin = 1, acc = 1;
		for (int j = 0; j < K; j++) {
			lin &= sz[j] == sx[j] + sy[j];
			acc &= sxy[j] == sz[j];
		}
		ok(lin, "sketch(x + y) = sketch(x) + sketch(y)");
		ok(acc, "sketch_add accumulates into acc");
		/* Tiling at cut points that split hash blocks. */
		size_t cuts[] = { 0, 1, 63, 64, 65, 700, 1999, 2048, 4097, N };
		double parts[K] = { 0 };
		for (size_t c = 0; c + 1 < sizeof cuts / sizeof *cuts; c++)
			sketch_add(x + cuts[c], cuts[c + 1] - cuts[c], cuts[c], 7, K, parts);
		int tiles = 1;
		for (int j = 0; j < K; j++)
			tiles &= parts[j] == sx[j];
		ok(tiles, "the sketches of 9 ranges that tile x sum to the sketch of x");
		double s2[K] = { 0 };
		for (size_t i = 0; i < N; i++)
			z[i] = 2 * x[i];
		sketch_add(z, N, 0, 7, K, s2);
		int scale = 1;
		for (int j = 0; j < K; j++)
			scale &= s2[j] == 2 * sx[j];
		ok(scale, "sketch(2x) = 2 sketch(x)");
	}

	/* Any floats: splitting within double rounding. */
	{
		enum { N = 100000, K = 32 };
		float *x = malloc(N * sizeof *x);
		for (size_t i = 0; i < N; i++)
			x[i] = (float)((urand() - 0.5) * pow(10, (int)(urand() * 12) - 6));
		double whole[K] = { 0 }, parts[K] = { 0 }, d[K];
		sketch_add(x, N, 0, 99, K, whole);
		for (size_t lo = 0; lo < N;) {
			size_t len = 1 + (size_t)(urand() * 9000);
			if (len > N - lo)
				len = N - lo;
			sketch_add(x + lo, len, lo, 99, K, parts);
			lo += len;
		}
		for (int j = 0; j < K; j++)
			d[j] = whole[j] - parts[j];
		ok(maxabs(d, K) <= 1e-12 * maxabs(whole, K),
		   "random ranges of any floats: relative error %.1e", maxabs(d, K) / maxabs(whole, K));
		free(x);
	}

	/* Threads computing at once get the same bits. */
	{
		size_t n = 1 << 20;
		float *x = malloc(n * sizeof *x);
		for (size_t i = 0; i < n; i++)
			x[i] = (float)(urand() - 0.5);
		thread_job t[4];
		pthread_t th[4];
		for (int i = 0; i < 4; i++) {
			t[i] = (thread_job){ .x = x, .n = n };
			pthread_create(&th[i], NULL, sketch_thread, &t[i]);
		}
		for (int i = 0; i < 4; i++)
			pthread_join(th[i], NULL);
		int same = 1;
		for (int i = 1; i < 4; i++)
			same &= memcmp(t[i].out, t[0].out, sizeof t[0].out) == 0;
		ok(same, "4 threads sketching at once get the same bits");
		free(x);
	}

	/* Sensitivity: a 1% perturbation is seen at the 1e-3 tolerance. */
	{
		enum { N = 50000, K = 16, SEEDS = 200 };
		float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
		double nx = 0, nd = 0;
		for (size_t i = 0; i < N; i++)
			nx += (x[i] = (float)(urand() - 0.5)) * (double)x[i];
		for (size_t i = 0; i < N; i++) {
			double dl = urand() - 0.5;
			nd += dl * dl;
			y[i] = (float)dl;
		}
		for (size_t i = 0; i < N; i++)
			y[i] = x[i] + (float)(0.01 * sqrt(nx / nd)) * y[i];
		double least = 1;
		for (int s = 0; s < SEEDS; s++) {
			double a[K] = { 0 }, b[K] = { 0 };
			sketch_add(x, N, 0, (uint64_t)s * 7919, K, a);
			sketch_add(y, N, 0, (uint64_t)s * 7919, K, b);
			least = fmin(least, sketch_distance(a, b, K));
		}
		ok(least > 1e-3, "a 1%% perturbation: the least distance over %d seeds is %.4f (> 1e-3)",
		   SEEDS, least);
		free(x);
		free(y);
	}

	/* Cost: a sketch of 18M values beside one pass summing them (printed
	 * only: timings are the benchmarks' business). */
	{
		size_t n = 18u << 20;
		float *x = malloc(n * sizeof *x);
		for (size_t i = 0; i < n; i++)
			x[i] = (float)(i & 1023);
		double acc[16] = { 0 }, sum = 0;
		double t0 = now_s();
		for (size_t i = 0; i < n; i++)
			sum += x[i];
		double t1 = now_s();
		sketch_add(x, n, 0, 1, 16, acc);
		double t2 = now_s();
		diag("a sketch of 18M values at k 16: %.1f ms, %.1f x one pass summing them (%.1f ms, %g)",
		     (t2 - t1) * 1e3, (t2 - t1) / (t1 - t0), (t1 - t0) * 1e3, sum + 0 * acc[0]);
		free(x);
	}
	done_testing();
	return exit_status();
}
