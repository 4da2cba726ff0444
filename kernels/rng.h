/* cotrain kernels: a portable pseudo-random generator for initialisation.
 *
 * xoshiro256** seeded through splitmix64, normals by Marsaglia's polar
 * method with a logarithm of our own: only IEEE basic operations and sqrt,
 * so a seed gives the same numbers on every machine and C library. */
#ifndef KERN_RNG_H
#define KERN_RNG_H

#include <stdint.h>

typedef struct {
	uint64_t s[4];
	int has_spare;
	double spare;
} kern_rng;

void kern_rng_seed(kern_rng *r, uint64_t seed);
uint64_t kern_rng_next(kern_rng *r);
/* uniform in [0, 1), 53 random bits */
double kern_rng_uniform(kern_rng *r);
/* standard normal */
double kern_rng_normal(kern_rng *r);

#endif
