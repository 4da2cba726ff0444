/* cotrain client: user idleness (see idle.h). */
#include "client/idle.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IDLE_FOREVER CL_IDLE_FOREVER

int cl_idle_parse_loginctl(const char *out, double now_us, double *secs)
{
	int hint = -1;
	unsigned long long since = 0;
	for (const char *line = out; line && *line;
	     line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		if (strncmp(line, "IdleHint=", 9) == 0) {
			if (strncmp(line + 9, "yes", 3) == 0)
				hint = 1;
			else if (strncmp(line + 9, "no", 2) == 0)
				hint = 0;
		} else if (strncmp(line, "IdleSinceHint=", 14) == 0) {
			since = strtoull(line + 14, NULL, 10);
		}
	}
	if (hint < 0)
		return 0;
	if (!hint) {
		*secs = 0;
		return 1;
	}
	*secs = since > 0 && (double)since < now_us ? (now_us - (double)since) / 1e6 : IDLE_FOREVER;
	return 1;
}

/* logind through loginctl: 1 and *secs when it answered, 0 otherwise. */
static int logind_idle(double *secs)
{
	if (access("/run/systemd/seats", F_OK) != 0 && access("/run/systemd/system", F_OK) != 0)
		return 0;
	FILE *p = popen("loginctl show --property=IdleHint --property=IdleSinceHint 2>/dev/null", "r");
	if (!p)
		return 0;
	char out[1024];
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 0;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return cl_idle_parse_loginctl(out, ts.tv_sec * 1e6 + ts.tv_nsec / 1e3, secs);
}

double cl_idle_tty_seconds(const char *globs, time_t now)
{
	char copy[1024];
	snprintf(copy, sizeof copy, "%s", globs);
	time_t newest = 0;
	char *save = NULL;
	for (char *pat = strtok_r(copy, " \t", &save); pat; pat = strtok_r(NULL, " \t", &save)) {
		glob_t g;
		if (glob(pat, GLOB_NOSORT, NULL, &g) != 0)
			continue;
		for (size_t i = 0; i < g.gl_pathc; i++) {
			struct stat st;
			if (stat(g.gl_pathv[i], &st) == 0 && st.st_atime > newest)
				newest = st.st_atime;
		}
		globfree(&g);
	}
	if (newest == 0)
		return IDLE_FOREVER;
	double d = difftime(now, newest);
	return d > 0 ? d : 0;
}

double cl_idle_seconds(const cl_config *c, const char **source)
{
	double s;
	const char *dummy;
	if (!source)
		source = &dummy;
	switch (c->idle_mode) {
	case IDLE_NONE:
		*source = "none";
		return IDLE_FOREVER;
	case IDLE_TTY:
		*source = "tty";
		return cl_idle_tty_seconds(c->idle_tty_glob, time(NULL));
	case IDLE_LOGIND:
		*source = "logind";
		return logind_idle(&s) ? s : IDLE_FOREVER;
	case IDLE_AUTO:
	default:
		if (logind_idle(&s)) {
			*source = "logind";
			return s;
		}
		*source = "tty";
		return cl_idle_tty_seconds(c->idle_tty_glob, time(NULL));
	}
}
