/* cotrain kernels: portable PRNG.  See rng.h. */
#include "kernels/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void kern_rng_seed(kern_rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&seed);
	r->has_spare = 0;
	r->spare = 0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kern_rng_next(kern_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double kern_rng_uniform(kern_rng *r) { return (double)(kern_rng_next(r) >> 11) * 0x1.0p-53; }

/* Natural logarithm of x > 0 from basic operations (libm's may differ in the
 * last bit between versions): x = 2^e m, m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172, by its series. */
static double portable_log(double x)
{
	int e;
	double m = frexp(x, &e); /* exact: takes the exponent apart */
	if (m < 0.70710678118654752440) {
		m *= 2;
		e--;
	}
	double s = (m - 1) / (m + 1), s2 = s * s, sum = 0;
	for (int k = 14; k >= 0; k--)
		sum = sum * s2 + 1.0 / (2 * k + 1);
	return 2 * s * sum + e * 0.69314718055994530942;
}

double kern_rng_normal(kern_rng *r)
{
	if (r->has_spare) {
		r->has_spare = 0;
		return r->spare;
	}
	double u, v, s;
	do {
		u = 2 * kern_rng_uniform(r) - 1;
		v = 2 * kern_rng_uniform(r) - 1;
		s = u * u + v * v;
	} while (s >= 1 || s == 0);
	double f = sqrt(-2 * portable_log(s) / s);
	r->spare = v * f;
	r->has_spare = 1;
	return u * f;
}
