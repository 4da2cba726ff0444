/* cotrain: absolute deadlines on the monotonic clock.
 *
 * Network calls take a deadline (milliseconds on CLOCK_MONOTONIC) rather than
 * a timeout, so that a loop of reads and writes shares one time limit instead
 * of restarting it at every step. */
#ifndef COT_DEADLINE_H
#define COT_DEADLINE_H

#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC (never jumps with the wall clock). */
int64_t deadline_now_ms(void);

/* The deadline ms milliseconds from now (ms < 0 is treated as 0). */
int64_t deadline_after_ms(int64_t ms);

/* Milliseconds left before deadline, clamped to [0, INT32_MAX] so that it
 * can be passed to poll(); 0 means the deadline has passed. */
int deadline_left_ms(int64_t deadline);

#endif
