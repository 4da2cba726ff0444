/* cotrain: linear sketches of gradients (doc/credit.md, "Spot checks").
 *
 * The sketch of a vector x of n values (fp32, the model's flat parameter
 * order) under a 64-bit seed is k (1..SKETCH_K_MAX) values
 *
 *   s_j = sum_i d_j(i) x[i]                       accumulated in double
 *   d_j(i) = r(i) a_j(i / 64)                     (+1 or -1)
 *   r(i)   = -1 when bit (i mod 64) of mix64(seed + G (i / 64 + 1)) is set
 *   a_j(B) = -1 when bit (j mod 64) of mix64(seed + G ((j / 64 + 1) 2^56 + B + 1))
 *            is set                                (arithmetic mod 2^64)
 *
 * with G = 0x9E3779B97F4A7C15 and mix64 SplitMix64's finaliser (z ^= z >>
 * 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^=
 * z >> 31).  Each d_j is a pseudo-random +-1 vector; computed as
 * s_j = sum_B a_j(B) y_B with y_B = sum_{i in block B} r(i) x[i], it costs
 * about one addition per coordinate plus k per 64 coordinates, instead of
 * k per coordinate.  For any fixed x, E[s_j^2] = ||x||^2 over the seed, as
 * for independent signs; the k projections share each block's r, so a
 * vector built to vanish on them needs the seed (doc/credit.md says who
 * learns it when).
 *
 * The signs are counter-based: any coordinate range [first, first + len)
 * can be sketched alone, and the sketch of a vector is the sum of the
 * sketches of the ranges that tile it (an aggregator sketches its slice, a
 * member its whole vector).  The sketch is linear in x: the sketch of a sum
 * of microbatch gradients is the sum of their sketches.  Both hold exactly
 * in real arithmetic and to double rounding (about 1e-16 relative) here.
 *
 * Deterministic: one thread, one order, no FMA contraction of the sum
 * (each term is exactly +-x[i] in double), so the same inputs give the
 * same bits on every machine and at every thread count of the caller.
 * Pure code with no dependencies, so every program can link it. */
#ifndef COT_SKETCH_H
#define COT_SKETCH_H

#include <stddef.h>
#include <stdint.h>

#define SKETCH_K_MAX 256

/* Add the sketch of the coordinates [first, first + len) of a vector, whose
 * values are x[0..len), to acc[0..k): acc[j] += sum_i d_j(first + i) x[i].
 * k must be 1..SKETCH_K_MAX; first + len must stay below 2^48. */
void sketch_add(const float *x, size_t len, uint64_t first, uint64_t seed, int k, double *acc);

/* SplitMix64's finaliser, as above (the fingerprints of whole-range checks
 * use it too). */
uint64_t sketch_mix64(uint64_t z);

/* The relative distance of two sketches, ||a - b|| / max(||a||, ||b||)
 * (0 when both are 0): what a tolerance is compared with. */
double sketch_distance(const double *a, const double *b, int k);

#endif
