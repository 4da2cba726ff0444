/* cotrain: linear sketches of gradients (contract in sketch.h). */
#include "shared/common/sketch.h"

#include <math.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

uint64_t sketch_mix64(uint64_t z)
{
	z ^= z >> 30;
	z *= 0xBF58476D1CE4E5B9ULL;
	z ^= z >> 27;
	z *= 0x94D049BB133111EBULL;
	z ^= z >> 31;
	return z;
}

/* v with its sign flipped when bit is 1: exactly -v or v. */
static double signed_by(double v, uint64_t bit)
{
	uint64_t b;
	memcpy(&b, &v, sizeof b);
	b ^= bit << 63;
	memcpy(&v, &b, sizeof v);
	return v;
}

void sketch_add(const float *x, size_t len, uint64_t first, uint64_t seed, int k, double *acc)
{
	size_t i = 0;
	while (i < len) {
		uint64_t g = first + i, blk = g >> 6;
		size_t in_blk = 64 - (size_t)(g & 63);
		size_t end = len - i < in_blk ? len : i + in_blk;
		/* y = sum over this block's coordinates of r(g) x[g]. */
		uint64_t r = sketch_mix64(seed + GOLDEN * (blk + 1));
		double y = 0;
		for (; i < end; i++, g++)
			y += signed_by((double)x[i], (r >> (g & 63)) & 1);
		for (int b = 0; b * 64 < k; b++) {
			uint64_t a = sketch_mix64(seed + GOLDEN * ((((uint64_t)b + 1) << 56) + blk + 1));
			int kb = k - b * 64 < 64 ? k - b * 64 : 64;
			double *out = acc + b * 64;
			for (int j = 0; j < kb; j++)
				out[j] += signed_by(y, (a >> j) & 1);
		}
	}
}

double sketch_distance(const double *a, const double *b, int k)
{
	double d = 0, na = 0, nb = 0;
	for (int j = 0; j < k; j++) {
		d += (a[j] - b[j]) * (a[j] - b[j]);
		na += a[j] * a[j];
		nb += b[j] * b[j];
	}
	double m = sqrt(na > nb ? na : nb);
	return m > 0 ? sqrt(d) / m : 0;
}
