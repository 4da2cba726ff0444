/* cotrain client: what the host is (CPU model, cores, memory, OS), reported
 * when it registers, and a fingerprint of it: a change of fingerprint means
 * new hardware, so the benchmark runs again. */
#ifndef CL_HOSTINFO_H
#define CL_HOSTINFO_H

#include "client/api.h"

/* Fill h from /proc/cpuinfo, sysconf, sysinfo and uname (flops left 0).
 * Missing sources leave empty strings; never fails. */
void cl_hostinfo_read(cl_hostinfo *h);

/* The hardware fingerprint of h: hex sha256 of CPU model, cores and memory
 * rounded to 256 MiB. */
void cl_hostinfo_fingerprint(const cl_hostinfo *h, char out[65]);

/* The machine id this host gives project name at server base: the hex
 * sha256 of the state's machine secret, the base URL and the name, so one
 * machine keeps one host per project and account across detach and attach,
 * while no two projects (of one server or of two) see the same id.  An
 * empty secret gives "" (no id). */
void cl_hostinfo_machine_id(const char *secret, const char *base, const char *name, char out[65]);

#endif
