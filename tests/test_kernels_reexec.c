/* kern_blas_reexec_if_needed: a program that calls it first thing runs on the
 * BLAS core kern_blas_coretype_hint() suggests with OpenMP threads that sleep
 * when idle (unless the environment says otherwise), re-executes at most once,
 * keeps its arguments and pid, and runs on when told not to re-execute.
 *
 * Every start of this program (the first and a re-executed one) bumps a
 * counter in the environment before the call, so the run that reaches the
 * checks knows how many times main() began. */
#include "kernels/backend.h"
#include "tests/tap.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define COUNT_ENV "COTRAIN_TEST_REEXEC_STARTS"
#define PID_ENV "COTRAIN_TEST_REEXEC_PID"

int main(int argc, char **argv)
{
	if (argc == 1) { /* as make check starts it: add the arguments to keep */
		char *args[] = { argv[0], "--keep", "these args", NULL };
		execv("/proc/self/exe", args);
		bail_out("could not re-execute with arguments");
	}
	/* state of the first start, carried through the exec by the environment */
	const char *c = getenv(COUNT_ENV);
	int starts = (c ? atoi(c) : 0) + 1;
	char buf[32];
	snprintf(buf, sizeof buf, "%d", starts);
	setenv(COUNT_ENV, buf, 1);
	if (starts == 1) {
		snprintf(buf, sizeof buf, "%ld", (long)getpid());
		setenv(PID_ENV, buf, 1);
		/* what the first start saw, before anything was set */
		const char *h = kern_blas_coretype_hint();
		setenv("COTRAIN_TEST_REEXEC_HINT", h ? h : "", 1);
		setenv("COTRAIN_TEST_REEXEC_FORBIDDEN", getenv(KERN_BLAS_REEXEC_ENV) ? "1" : "0", 1);
		setenv("COTRAIN_TEST_REEXEC_CORE", getenv("OPENBLAS_CORETYPE") ? "set" : "", 1);
		setenv("COTRAIN_TEST_REEXEC_WAIT",
		       getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") ? "set" : "", 1);
	}
	kern_blas_reexec_if_needed(argc, argv);

	plan_lazy();
	const char *hint = getenv("COTRAIN_TEST_REEXEC_HINT");
	bool forbidden = strcmp(getenv("COTRAIN_TEST_REEXEC_FORBIDDEN"), "0") != 0;
	bool want_core = *hint && !*getenv("COTRAIN_TEST_REEXEC_CORE");
	bool want_wait = !*getenv("COTRAIN_TEST_REEXEC_WAIT");
	const char *core = openblas_get_corename();
	diag("first start's hint: %s; re-exec %s; core now: %s; starts: %d", *hint ? hint : "(none)",
	     forbidden ? "forbidden" : "allowed", core, starts);
	ok(argc == 3 && strcmp(argv[1], "--keep") == 0 && strcmp(argv[2], "these args") == 0,
	   "arguments survive (argc %d)", argc);
	ok(atol(getenv(PID_ENV)) == (long)getpid(), "the pid is the same");
	if ((want_core || want_wait) && !forbidden) {
		is_int(starts, 2, "main began twice: one re-exec, no loop");
		if (want_core) {
			is_str(getenv("OPENBLAS_CORETYPE"), hint, "OPENBLAS_CORETYPE is the hint");
			ok(core && strcasecmp(core, hint) == 0, "OpenBLAS runs the hinted core (%s)", core);
			ok(kern_blas_coretype_hint() == NULL, "no further hint once on it");
		}
		if (want_wait)
			is_str(getenv("GOMP_SPINCOUNT"), KERN_OMP_SPINCOUNT,
			       "OpenMP threads spin briefly, then sleep");
		/* a second call in the re-executed process must return, not exec */
		kern_blas_reexec_if_needed(argc, argv);
		ok(1, "a second call returns");
	} else {
		is_int(starts, 1, "main began once: nothing to do or re-exec forbidden");
		if (forbidden && *hint && !getenv("OPENBLAS_CORETYPE"))
			ok(kern_blas_coretype_hint() != NULL, "still on the generic core");
	}
	if (argc == 3 && !getenv("COTRAIN_TEST_REEXEC_NESTED")) {
		/* A child of a re-executed program inherits the variables and must
		 * not re-execute either; a child told COTRAIN_BLAS_REEXEC must run
		 * on the core it loads with. */
		setenv("COTRAIN_TEST_REEXEC_NESTED", "1", 1);
		unsetenv(COUNT_ENV);
		unsetenv(PID_ENV);
		unsetenv("OPENBLAS_CORETYPE");
		unsetenv("OMP_WAIT_POLICY");
		unsetenv("GOMP_SPINCOUNT");
		setenv(KERN_BLAS_REEXEC_ENV, "off", 1);
		fflush(stdout);
		char cmd[4200];
		snprintf(cmd, sizeof cmd, "'%s' --keep 'these args' >/dev/null", argv[0]);
		ok(system(cmd) == 0, "with %s set, a start that may not re-exec passes its checks",
		   KERN_BLAS_REEXEC_ENV);
	}
	done_testing();
	return exit_status();
}
