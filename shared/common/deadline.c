/* cotrain: absolute deadlines on the monotonic clock. */
#include "shared/common/deadline.h"

#include <stdint.h>
#include <time.h>

int64_t deadline_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t deadline_after_ms(int64_t ms) { return deadline_now_ms() + (ms > 0 ? ms : 0); }

int deadline_left_ms(int64_t deadline)
{
	int64_t left = deadline - deadline_now_ms();
	if (left <= 0)
		return 0;
	if (left > INT32_MAX)
		return INT32_MAX;
	return (int)left;
}
