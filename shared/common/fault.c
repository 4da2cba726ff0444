/* cotrain: fault points, a test hook (see fault.h). */
#include "shared/common/fault.h"

#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "shared/common/log.h"

static const char *const points[] = { "before-report",  "before-slices",      "mid-slice",   "after-slices",
	                              "before-outcome", "aggregator-mid-sum", "cross-stage", "gpu-step" };
static const char *const actions[] = { "stop", "die", "silent", "fail" };
enum { ACTION_FAIL = 3 };

static int point = -1; /* index in points, -1 when no hook is set */
static int action = -1;
static int64_t only_version = -1; /* -1: the first round that reaches the point */
static bool from_version;         /* "V+": the first round at or after only_version */
static atomic_int fired;

static int lookup(const char *const *names, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(names[i], s) == 0)
			return (int)i;
	return -1;
}

cot_err fault_init(cot_errbuf *eb)
{
	const char *env = getenv("COTRAIN_FAULT");
	point = -1;
	if (!env || !env[0])
		return COT_OK;
	char buf[96];
	if (strlen(env) >= sizeof buf)
		return cot_seterr(eb, COT_ERR_INVALID, "COTRAIN_FAULT is too long");
	snprintf(buf, sizeof buf, "%s", env);
	char *pt = buf, *ac = strchr(buf, ':'), *ver = NULL;
	if (ac) {
		*ac++ = '\0';
		if ((ver = strchr(ac, ':')))
			*ver++ = '\0';
	}
	int pi = lookup(points, sizeof points / sizeof *points, pt);
	if (pi < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "COTRAIN_FAULT names an unknown point \"%s\"", pt);
	if (!ac || (action = lookup(actions, sizeof actions / sizeof *actions, ac)) < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "COTRAIN_FAULT names an unknown action \"%s\"",
		                  ac ? ac : "");
	if (action == ACTION_FAIL && strcmp(pt, "gpu-step") != 0)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "COTRAIN_FAULT: the action \"fail\" is only for the point \"gpu-step\"");
	if (ver) {
		char *end;
		errno = 0;
		long long v = strtoll(ver, &end, 10);
		from_version = *end == '+';
		if (from_version)
			end++;
		if (errno || end == ver || *end || v < 0)
			return cot_seterr(eb, COT_ERR_INVALID, "COTRAIN_FAULT has a bad version \"%s\"", ver);
		only_version = v;
	}
	point = pi;
	log_warn("fault hook set: %s:%s%s%s (a test hook: this client will fail on purpose)", points[point],
	         actions[action], ver ? ":" : "", ver ? ver : "");
	return COT_OK;
}

/* Give the line just logged time to leave a pipe on stderr (the client
 * copies its stderr through one, client/logring.c) before the process
 * stops or dies: wait until the pipe is empty (at most 1 s), then a little
 * for the reader to write it out. */
static void drain_stderr(void)
{
	struct timespec ten_ms = { 0, 10 * 1000 * 1000 };
	for (int i = 0; i < 100; i++) {
		int n = 0;
		if (ioctl(STDERR_FILENO, FIONREAD, &n) != 0 || n <= 0)
			break;
		nanosleep(&ten_ms, NULL);
	}
	struct timespec settle = { 0, 50 * 1000 * 1000 };
	nanosleep(&settle, NULL);
}

bool fault_point(const char *name, int64_t version)
{
	if (point < 0 || strcmp(points[point], name) != 0 ||
	    (only_version >= 0 && (from_version ? version < only_version : version != only_version)))
		return false;
	int expected = 0;
	if (!atomic_compare_exchange_strong(&fired, &expected, 1))
		return false;
	log_warn("fault point %s: %s (round %lld)", name, actions[action], (long long)version);
	if (action == ACTION_FAIL)
		return true;
	drain_stderr();
	switch (action) {
	case 0:
		raise(SIGSTOP);
		return false;
	case 1:
		_exit(137);
	default:
		for (;;)
			pause();
	}
}
