/* cotrain client: retry delays with exponential backoff and full jitter.
 *
 * After the n-th consecutive failure the next attempt waits a random time in
 * [base * 2^(n-1) / 2, base * 2^(n-1)], capped at max: half fixed, half
 * jitter, so that many clients cut off by the same outage do not come back
 * in lockstep, while one client never retries sooner than half the nominal
 * delay.  A success resets the count.  Plain data, no locking: each user
 * owns its own. */
#ifndef CL_BACKOFF_H
#define CL_BACKOFF_H

#include <stdint.h>

typedef struct {
	double base_s;     /* delay after the first failure, seconds (> 0) */
	double max_s;      /* cap, seconds (>= base_s) */
	unsigned failures; /* consecutive failures so far */
	double next_at;    /* monotonic time (seconds) before which not to retry */
} cl_backoff;

/* A backoff with no failures yet. */
void cl_backoff_init(cl_backoff *b, double base_s, double max_s);

/* Record a failure at monotonic time now; returns the delay chosen, in
 * seconds, and sets next_at = now + delay.  rnd is a uniform random number
 * in [0, 1) (the caller picks the source, so tests can be exact). */
double cl_backoff_fail(cl_backoff *b, double now, double rnd);

/* Record a success: failures = 0, next_at = 0. */
void cl_backoff_ok(cl_backoff *b);

/* True when an attempt is allowed at time now. */
int cl_backoff_ready(const cl_backoff *b, double now);

/* Seconds on the monotonic clock (CLOCK_MONOTONIC: immune to clock jumps). */
double cl_now_mono(void);

/* A uniform random number in [0, 1) from a per-thread generator seeded from
 * the OS. */
double cl_random01(void);

#endif
