/* cotrain client: idle priorities (see priority.h). */
#include "client/priority.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shared/common/log.h"

#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_CLASS_IDLE 3
#define IOPRIO_WHO_PROCESS 1

static int make_idle(pid_t tid)
{
	int rc = 0;
	struct sched_param sp = { .sched_priority = 0 };
	if (sched_setscheduler(tid, SCHED_IDLE, &sp) < 0) {
		log_debug("could not set SCHED_IDLE on thread %d: %s", (int)tid, strerror(errno));
		rc = -1;
	}
	if (setpriority(PRIO_PROCESS, (id_t)tid, 19) < 0) {
		log_debug("could not set nice 19 on thread %d: %s", (int)tid, strerror(errno));
		rc = -1;
	}
	if (syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) < 0) {
		log_debug("could not set the idle I/O class on thread %d: %s", (int)tid, strerror(errno));
		rc = -1;
	}
	return rc;
}

int cl_priority_idle_thread(void) { return make_idle((pid_t)syscall(SYS_gettid)); }

void cl_priority_idle_others(void)
{
	pid_t self = (pid_t)syscall(SYS_gettid);
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));) {
		pid_t tid = (pid_t)atoi(e->d_name);
		if (tid > 0 && tid != self && tid != getpid())
			make_idle(tid);
	}
	closedir(d);
}
