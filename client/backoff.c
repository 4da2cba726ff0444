/* cotrain client: exponential backoff with jitter (see backoff.h). */
#include "client/backoff.h"

#include <math.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

void cl_backoff_init(cl_backoff *b, double base_s, double max_s)
{
	b->base_s = base_s > 0 ? base_s : 1;
	b->max_s = max_s >= b->base_s ? max_s : b->base_s;
	b->failures = 0;
	b->next_at = 0;
}

double cl_backoff_fail(cl_backoff *b, double now, double rnd)
{
	if (b->failures < 64)
		b->failures++;
	/* 2^(n-1) overflows nothing: cap the exponent before pow. */
	double nominal = b->base_s * ldexp(1.0, (int)(b->failures > 40 ? 40 : b->failures - 1));
	if (nominal > b->max_s)
		nominal = b->max_s;
	if (rnd < 0 || rnd >= 1)
		rnd = 0;
	double delay = nominal / 2 + rnd * nominal / 2;
	b->next_at = now + delay;
	return delay;
}

void cl_backoff_ok(cl_backoff *b)
{
	b->failures = 0;
	b->next_at = 0;
}

int cl_backoff_ready(const cl_backoff *b, double now) { return now >= b->next_at; }

double cl_now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

double cl_random01(void)
{
	static __thread unsigned short seed[3];
	static __thread int seeded;
	if (!seeded) {
		if (getrandom(seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			seed[0] = (unsigned short)ts.tv_nsec;
			seed[1] = (unsigned short)(ts.tv_nsec >> 16);
			seed[2] = (unsigned short)ts.tv_sec;
		}
		seeded = 1;
	}
	return erand48(seed);
}
