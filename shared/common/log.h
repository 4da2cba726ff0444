/* cotrain: leveled logging to stderr (journald picks it up under systemd).
 * Thread-safe: each line is written with one write(2).  A message's control
 * characters and bytes that are not UTF-8 (a path or a field a peer sent)
 * are written as "\xNN" (shared/common/text.h): one call, one line. */
#ifndef COT_LOG_H
#define COT_LOG_H

typedef enum { COT_LOG_DEBUG, COT_LOG_INFO, COT_LOG_WARN, COT_LOG_ERROR } cot_log_level;

/* Lines below this level are dropped.  Default COT_LOG_INFO, or the value of
 * the environment variable COTRAIN_LOG (debug, info, warn, error). */
void cot_log_set_level(cot_log_level lvl);
/* Parse "debug"/"info"/"warn"/"error"; returns -1 for anything else. */
int cot_log_parse_level(const char *s);
/* Prefix for every line, e.g. the program name; the string is not copied. */
void cot_log_set_ident(const char *ident);

void cot_log(cot_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) cot_log(COT_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) cot_log(COT_LOG_INFO, __VA_ARGS__)
#define log_warn(...) cot_log(COT_LOG_WARN, __VA_ARGS__)
#define log_error(...) cot_log(COT_LOG_ERROR, __VA_ARGS__)

#endif
