/* cotrain: the fingerprint of a gradient for spot checks (doc/credit.md).
 *
 * The gradient g of a work range (the sum over its samples of the per-sample
 * mean-loss gradients, fp32, the model's flat parameter order, n values) is
 * projected on k pseudo-random sign vectors derived from the check's seed:
 *
 *   u(j, i) = mix64(seed + 0x9E3779B97F4A7C15 * (j * 2^40 + i + 1))  (mod 2^64)
 *   d_j[i]  = -1 if the top bit of u(j, i) is set, else +1
 *   f_j     = (sum_i d_j[i] * g[i]) / sqrt(n)       accumulated in double
 *
 * mix64 is SplitMix64's finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
 * z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31.  The server compares
 * two fingerprints a, b by ||a - b|| / max(||a||, ||b||) <= tolerance.
 *
 * Pure code with no dependencies, so the client can link it as it is. */
#ifndef COT_FINGERPRINT_H
#define COT_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#define SPOT_K_MAX 256
/* The values a spot check's answer may hold: k per microbatch of the
 * checked range, at most a block of 1,024 (the client's CL_BLOCK_MAX), and
 * k more for a block check's sum under the round's second seed; the
 * database checks the exact count of each check. */
#define SPOT_VALUES_MAX ((1024 + 1) * SPOT_K_MAX)

/* Write the k (1..SPOT_K_MAX) fingerprint values of g[0..n) for seed into
 * out[0..k).  Deterministic: the same inputs give the same bits. */
void spot_fingerprint_compute(const float *g, size_t n, uint64_t seed, int k, double *out);

/* The relative distance the server compares with the tolerance. */
double spot_fingerprint_distance(const double *a, const double *b, int k);

#endif
