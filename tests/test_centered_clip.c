/* cotrain tests: CenteredClip (shared/averaging/centered_clip.h).
 *
 * Equal contributions come out exactly; with a tau no difference reaches,
 * the result is the sample-weighted mean; a poisoner (-5 times the honest
 * gradient, or 100 times) moves the result by a bounded amount where the
 * mean follows it; the same inputs give the same bits; bad parameters are
 * refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shared/averaging/centered_clip.h"
#include "tests/tap.h"

#define LEN 4096

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* ||a / sa - b / sb|| over LEN values. */
static double dist(const float *a, double sa, const float *b, double sb)
{
	double d = 0;
	for (size_t i = 0; i < LEN; i++) {
		double x = a[i] / sa - b[i] / sb;
		d += x * x;
	}
	return sqrt(d);
}

int main(void)
{
	plan_lazy();
	cot_errbuf eb = { 0 };
	static float x[5][LEN], out[LEN], again[LEN], mean[LEN], honest[LEN];
	const float *xs[5] = { x[0], x[1], x[2], x[3], x[4] };
	uint64_t s[5] = { 4, 8, 4, 12, 4 };

	/* Equal per-sample means: the result is the sum, exactly. */
	for (size_t i = 0; i < LEN; i++) {
		float g = (float)(urand() - 0.5);
		for (int k = 0; k < 5; k++)
			x[k][i] = g * (float)s[k];
	}
	ok(cclip_combine(xs, s, 5, LEN, 1.0, 20, out, &eb) == COT_OK, "five equal contributions combine");
	int exact = 1;
	for (size_t i = 0; i < LEN; i++)
		exact &= out[i] == x[0][i] / 4 * 32;
	ok(exact, "equal per-sample means come out as their sum, exactly");

	/* Honest gradients around a common one; tau beyond every difference:
	 * the sample-weighted mean. */
	for (size_t i = 0; i < LEN; i++) {
		double g = urand() - 0.5;
		for (int k = 0; k < 5; k++)
			x[k][i] = (float)((g + 0.05 * (urand() - 0.5)) * (double)s[k]);
	}
	double m2 = 0;
	for (size_t i = 0; i < LEN; i++) {
		double sum = 0;
		for (int k = 0; k < 5; k++)
			sum += x[k][i];
		mean[i] = (float)sum;
		m2 += (sum / 32) * (sum / 32);
	}
	cclip_combine(xs, s, 5, LEN, 1e6, 5, out, &eb);
	ok(dist(out, 32, mean, 32) <= 1e-6 * sqrt(m2),
	   "a tau no difference reaches gives the weighted mean (%.2g away)", dist(out, 32, mean, 32));
	cclip_combine(xs, s, 5, LEN, 1e6, 5, again, &eb);
	ok(memcmp(out, again, sizeof out) == 0, "the same inputs give the same bits");

	/* A poisoner: member 4 sends -5 times the honest mean, then 100 times. */
	double hs = 28;
	for (size_t i = 0; i < LEN; i++)
		honest[i] = (float)((double)x[0][i] + x[1][i] + x[2][i] + x[3][i]);
	double spread = 0;
	for (int k = 0; k < 4; k++)
		spread = fmax(spread, dist(x[k], (double)s[k], honest, hs));
	double scale[] = { -5, 100 };
	for (int a = 0; a < 2; a++) {
		for (size_t i = 0; i < LEN; i++)
			x[4][i] = (float)(scale[a] * honest[i] / hs * (double)s[4]);
		double msum = 0, off = 0;
		for (size_t i = 0; i < LEN; i++)
			mean[i] = (float)((double)honest[i] + x[4][i]);
		msum = dist(mean, 32, honest, hs);
		cclip_combine(xs, s, 5, LEN, spread, 20, out, &eb);
		off = dist(out, 32, honest, hs);
		ok(off < 0.5 * spread && off < 0.05 * msum,
		   "a poisoner at %gx: CenteredClip (tau %.3g) ends %.3g from the honest mean, the mean %.3g",
		   scale[a], spread, off, msum);
	}

	ok(cclip_combine(xs, s, 0, LEN, 1, 20, out, &eb) == COT_ERR_INVALID, "no contributions: refused");
	ok(cclip_combine(xs, s, 5, LEN, 0, 20, out, &eb) == COT_ERR_INVALID, "tau 0: refused (%s)", eb.msg);
	ok(cclip_combine(xs, s, 5, LEN, NAN, 20, out, &eb) == COT_ERR_INVALID, "tau NaN: refused");
	ok(cclip_combine(xs, s, 5, LEN, 1, 0, out, &eb) == COT_ERR_INVALID, "0 iterations: refused");
	uint64_t z[5] = { 4, 0, 4, 4, 4 };
	ok(cclip_combine(xs, z, 5, LEN, 1, 20, out, &eb) == COT_ERR_INVALID,
	   "a contribution of 0 samples: refused");
	done_testing();
	return exit_status();
}
