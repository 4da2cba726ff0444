/* cotrain: gradient fingerprints for spot checks (contract in fingerprint.h). */
#include "shared/common/fingerprint.h"

#include <math.h>

#include "shared/common/sketch.h"

void spot_fingerprint_compute(const float *g, size_t n, uint64_t seed, int k, double *out)
{
	double scale = n ? 1.0 / sqrt((double)n) : 0;
	for (int j = 0; j < k; j++) {
		double s = 0;
		uint64_t base = (uint64_t)j << 40;
		for (size_t i = 0; i < n; i++) {
			uint64_t u = sketch_mix64(seed + 0x9E3779B97F4A7C15ULL * (base + (uint64_t)i + 1));
			s += (u >> 63) ? -(double)g[i] : (double)g[i];
		}
		out[j] = s * scale;
	}
}

double spot_fingerprint_distance(const double *a, const double *b, int k) { return sketch_distance(a, b, k); }
