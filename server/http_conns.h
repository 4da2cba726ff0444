/* cotrain-server: the HTTP API's connections, policed (doc/limits.md).
 *
 * libmicrohttpd's idle timeout restarts at every byte, so a request head
 * (line and headers) sent a byte a second held its connection for good,
 * and 4,096 of them from as many addresses (each under the per-address cap)
 * took every connection slot: ordinary requests got no answer at all
 * (tests/bench/bench-slow-connections.sh).  This module keeps the
 * connections in accept order with the time their current head began (the
 * accept, or the end of the previous request on a kept-alive connection)
 * and, from a thread of its own, once a second:
 *   - shuts down every connection whose head has taken longer than
 *     HTTP_HEAD_TIMEOUT_S (the first request) or the idle timeout (a later
 *     one on a kept-alive connection);
 *   - while more than HTTP_SHED_AT connections are open, shuts down those
 *     whose head is unfinished after HTTP_SHED_AGE_S, oldest first, until
 *     no more than that remain: an ordinary client's head arrives in
 *     milliseconds, so the slots that trickling senders would take stay
 *     free for it.
 * A connection is shut down (shutdown(2)); libmicrohttpd sees the end of
 * the stream and closes it.  Its socket is never touched after
 * libmicrohttpd's close notification, which comes before the close. */
#ifndef COT_SERVER_HTTP_CONNS_H
#define COT_SERVER_HTTP_CONNS_H

#include <microhttpd.h>

#include "shared/common/error.h"

#define HTTP_HEAD_TIMEOUT_S 10.0 /* the first head of a connection */
#define HTTP_SHED_AT 3072        /* 3/4 of MHD_OPTION_CONNECTION_LIMIT (4096) */
#define HTTP_SHED_AGE_S 1.0      /* an unfinished head older than this may be shed */

/* Start the policing thread; idle_timeout_s bounds the head of a later
 * request on a kept-alive connection.  COT_ERR_INTERNAL when the thread
 * cannot start. */
cot_err http_conns_start(double idle_timeout_s, cot_errbuf *eb);

/* Stop and join the thread (after MHD_stop_daemon: no connection is left). */
void http_conns_stop(void);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback. */
void http_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);

/* The head of conn's current request is in (the access handler's first
 * call), and its request is over (the completion callback): a later head
 * on the same connection is timed from then.  http_conns_head_done returns,
 * for a connection's first request, the seconds from its accept to now (the
 * head's transfer and the wait for a server thread to read it), else -1. */
double http_conns_head_done(struct MHD_Connection *conn);
void http_conns_request_done(struct MHD_Connection *conn);

/* Connections shut down so far for a head too slow and for shedding
 * (for the log and /metrics-style diagnostics). */
void http_conns_counts(unsigned long *timed_out, unsigned long *shed);

#endif
