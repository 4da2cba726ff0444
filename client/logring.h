/* cotrain client: the daemon's recent log lines, for "cotrainctl log".
 *
 * cl_logring_start() puts a pipe in place of stderr: a thread reads every
 * line written to it (shared/common/log.c writes each line with one write), passes
 * it on unchanged to the original stderr (the terminal, or journald under
 * systemd), and keeps the last CL_LOGRING_LINES lines in memory. */
#ifndef CL_LOGRING_H
#define CL_LOGRING_H

#include <jansson.h>

#include "shared/common/error.h"

#define CL_LOGRING_LINES 500

/* Start capturing.  COT_ERR_IO when the pipe or thread cannot be made (the
 * log then goes to stderr as before, uncaptured). */
cot_err cl_logring_start(cot_errbuf *eb);

/* The last n lines (n <= CL_LOGRING_LINES), oldest first, as a new JSON
 * array of strings; NULL when out of memory. */
json_t *cl_logring_tail(int n);

#endif
