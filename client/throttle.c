/* cotrain client: the CPU-time duty cycle (throttle.h). */
#include "client/throttle.h"

#include <time.h>

#include "client/backoff.h"

#define SLICE_S 0.05

void cl_throttle_rest(double busy, int percent, volatile int *stop, volatile int *interrupt)
{
	if (percent >= 100 || percent < 1 || !(busy > 0))
		return;
	double end = cl_now_mono() + busy * (100 - percent) / percent;
	for (;;) {
		if ((stop && *stop) || (interrupt && *interrupt))
			return;
		double left = end - cl_now_mono();
		if (left <= 0)
			return;
		if (left > SLICE_S)
			left = SLICE_S;
		struct timespec ts = { (time_t)left, (long)((left - (double)(time_t)left) * 1e9) };
		nanosleep(&ts, NULL);
	}
}
