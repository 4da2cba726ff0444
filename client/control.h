/* cotrain client: the daemon's local control socket.
 *
 * A Unix stream socket; the file's permissions decide who may control the
 * daemon: mode 0660 with the group set to the configured group (default
 * "cotrain") when that group exists, else 0600 (the daemon's user only).
 * There is no network control port.  Root may always connect.
 *
 * Protocol (doc/client.md): the client sends one request, a JSON object of
 * at most CL_CTL_MAX_REQUEST bytes ending with a newline, e.g.
 * {"cmd": "status"}; the daemon answers one JSON object ending with a
 * newline and closes: {"ok": true, ...} or
 * {"ok": false, "error": {"code": "...", "message": "...", "hint": "..."}}.
 * A malformed, oversized or slow request gets an error answer and never
 * affects the daemon. */
#ifndef CL_CONTROL_H
#define CL_CONTROL_H

#include <jansson.h>

#include "shared/common/error.h"

#define CL_CTL_MAX_REQUEST (64 << 10)
#define CL_CTL_TIMEOUT_S 5 /* to read a request */

/* Called for each valid request (an object with a string "cmd").  Returns a
 * new JSON object, the answer without "ok" (added here), or NULL with rc and
 * eb set for an error answer.  Runs on the control thread. */
typedef json_t *(*cl_ctl_handler)(const json_t *req, void *ctx, cot_err *rc, cot_errbuf *eb);

typedef struct cl_control cl_control;

/* Create the socket at path, set its permissions, start the thread that
 * serves it.  A stale socket file (nobody listening) is replaced; a live one
 * means another daemon: COT_ERR_EXISTS.  COT_ERR_IO, COT_ERR_TOO_LARGE (path
 * longer than a socket address holds).  On success *out owns the thread. */
cot_err cl_control_start(const char *path, const char *group, cl_ctl_handler h, void *ctx, cl_control **out,
                         cot_errbuf *eb);

/* Stop the thread, close and remove the socket.  NULL allowed. */
void cl_control_stop(cl_control *c);

/* Build an error answer object (used by the handler and by cotrainctl's
 * tests): {"ok": false, "error": {...}}.  New reference. */
json_t *cl_ctl_error_json(cot_err rc, const cot_errbuf *eb);

#endif
