/* cotrain client: idle CPU and I/O priority for the compute.
 *
 * cl_priority_idle_thread() puts the calling thread in the SCHED_IDLE
 * scheduling class at nice 19 and the idle I/O class, so computing never
 * slows what the user runs.  Threads it creates afterwards (OpenMP's)
 * inherit all three.  cl_priority_idle_others() does the same for threads
 * that already exist besides the caller (a BLAS thread pool started when
 * the library loaded). */
#ifndef CL_PRIORITY_H
#define CL_PRIORITY_H

/* 0 when everything applied, -1 when something did not (logged at debug:
 * an unprivileged container may refuse the I/O class; computing goes on). */
int cl_priority_idle_thread(void);
void cl_priority_idle_others(void);

#endif
