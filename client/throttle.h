/* cotrain client: BOINC's "use at most N% of CPU time" (the
 * cpu_time_percent preference): a duty cycle over the compute loops.  After
 * each piece of work (a microbatch) that took busy seconds, the computing
 * thread rests busy * (100 - percent) / percent seconds, so over any stretch
 * longer than a few microbatches it computes percent of the wall time, and
 * its compute threads (OpenMP's, which sleep while it rests) use at most
 * that share of the CPU time they would use otherwise.  Throttling by a
 * share of the cores (cpu_percent) is the other knob; both apply. */
#ifndef CL_THROTTLE_H
#define CL_THROTTLE_H

/* Rest after busy seconds of work at percent (1..100; 100 or more returns
 * at once).  The rest is taken in slices of at most 50 ms and cut short as
 * soon as *stop or *interrupt (either may be NULL) is set. */
void cl_throttle_rest(double busy, int percent, volatile int *stop, volatile int *interrupt);

#endif
