/* cotrain: a listening TCP socket for incoming peer connections.
 *
 * The accepting side of dialer.h: bind a numeric address (IPv4, or IPv6 with
 * "::" accepting both families), accept one connection at a time with a
 * deadline, and hand the socket, prepared with dialer_prepare_fd(), to the
 * TLS layer (peer.h). */
#ifndef COT_LISTENER_H
#define COT_LISTENER_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define LISTENER_ADDR_MAX 64 /* "[addr]:port" of a peer, with the NUL */

typedef struct listener listener;

/* Listen on addr (numeric; "0.0.0.0", "::", "127.0.0.1"...) and port (0 for
 * one the kernel picks; see listener_port).  backlog <= 0 means 64. */
cot_err listener_open(const char *addr, uint16_t port, int backlog, listener **out, cot_errbuf *eb);

/* The bound port. */
uint16_t listener_port(const listener *l);

/* The listening socket, for callers that poll it with other descriptors. */
int listener_fd(const listener *l);

/* Accept one connection before deadline (deadline.h).  *fd (non-blocking,
 * TCP_NODELAY) is the caller's; peer (when not NULL, LISTENER_ADDR_MAX bytes)
 * receives "addr:port" or "[addr]:port".  COT_ERR_TIMEOUT at the deadline. */
cot_err listener_accept(listener *l, int64_t deadline, int *fd, char *peer, cot_errbuf *eb);

/* Close and free l (NULL is fine). */
void listener_close(listener *l);

#endif
