/* cotrain tests: the TAP producer. */
#include "tests/tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

static pthread_mutex_t tap_lock = PTHREAD_MUTEX_INITIALIZER;
static int planned = -1, run, failed;

void plan(int n)
{
	planned = n;
	printf("1..%d\n", n);
	fflush(stdout);
}

void plan_lazy(void) { planned = -2; }

static bool report(bool cond, const char *fmt, va_list ap)
{
	pthread_mutex_lock(&tap_lock);
	run++;
	if (!cond)
		failed++;
	printf("%s %d - ", cond ? "ok" : "not ok", run);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	pthread_mutex_unlock(&tap_lock);
	return cond;
}

bool ok(bool cond, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(cond, fmt, ap);
	va_end(ap);
	return cond;
}

bool is_int(long long got, long long want, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bool c = report(got == want, fmt, ap);
	va_end(ap);
	if (!c)
		diag("  got: %lld, expected: %lld", got, want);
	return c;
}

bool is_str(const char *got, const char *want, const char *fmt, ...)
{
	bool c = got && want ? strcmp(got, want) == 0 : got == want;
	va_list ap;
	va_start(ap, fmt);
	report(c, fmt, ap);
	va_end(ap);
	if (!c)
		diag("  got: \"%s\", expected: \"%s\"", got ? got : "(null)", want ? want : "(null)");
	return c;
}

void skip(int n, const char *reason)
{
	pthread_mutex_lock(&tap_lock);
	for (int i = 0; i < n; i++)
		printf("ok %d # SKIP %s\n", ++run, reason);
	fflush(stdout);
	pthread_mutex_unlock(&tap_lock);
}

void diag(const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&tap_lock);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
		printf("# %s\n", line);
	fflush(stdout);
	pthread_mutex_unlock(&tap_lock);
}

void skip_all(const char *fmt, ...)
{
	va_list ap;
	printf("1..0 # SKIP ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(0);
}

void bail_out(const char *fmt, ...)
{
	va_list ap;
	printf("Bail out! ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

void done_testing(void)
{
	if (planned == -2) {
		planned = run;
		printf("1..%d\n", run);
		fflush(stdout);
	}
}

int exit_status(void)
{
	if (planned == -2)
		done_testing();
	if (failed)
		return 1;
	if (planned >= 0 && run != planned) {
		diag("planned %d tests but ran %d", planned, run);
		return 1;
	}
	return 0;
}
