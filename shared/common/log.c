/* cotrain: leveled logging. */
#include "shared/common/log.h"

#include "shared/common/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int min_level = -1;
static const char *log_ident = "cotrain";

void cot_log_set_level(cot_log_level lvl) { min_level = (int)lvl; }
void cot_log_set_ident(const char *ident) { log_ident = ident; }

int cot_log_parse_level(const char *s)
{
	static const char *names[] = { "debug", "info", "warn", "error" };
	for (int i = 0; i < 4; i++)
		if (s && strcmp(s, names[i]) == 0)
			return i;
	return -1;
}

void cot_log(cot_log_level lvl, const char *fmt, ...)
{
	static const char *tags[] = { "DEBUG", "INFO", "WARNING", "ERROR" };
	if (min_level < 0) {
		int env = cot_log_parse_level(getenv("COTRAIN_LOG"));
		min_level = env >= 0 ? env : COT_LOG_INFO;
	}
	if ((int)lvl < min_level)
		return;

	char line[2048];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%03ld %s %s: ", tm.tm_year + 1900,
	                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
	                 log_ident, tags[lvl]);
	/* The message may quote what a peer sent: control characters and bytes
	 * that are not UTF-8 are written escaped, so no line can be forged. */
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof line - 2)
		n = 0;
	n += (int)text_escape(msg, line + n, sizeof line - 1 - n);
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}
