/* cotrain: the one way peers open connections to each other.
 *
 * A dialer turns a target (a peer's address and host id) into a connected,
 * non-blocking TCP socket before a deadline.  Dialers are rungs of the NAT
 * ladder (doc/nat.md): "direct" dials the peer's address (here), "punch"
 * (simultaneous open, timed by the server) and "relay" (through the server)
 * live in shared/nat/, and the ladder there tries its rungs in order.  Callers (the averaging
 * code) only ever see dialer_connect(), so new rungs need no change there; the
 * TLS layer (peer.h) takes the socket the dialer returns.
 *
 * An implementation embeds struct dialer as its first member and provides a
 * dialer_ops table (curl's vtls backends, Redis' ae pollers). */
#ifndef COT_DIALER_H
#define COT_DIALER_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define DIALER_ADDR_MAX 64 /* bytes of a numeric address, with the NUL */

typedef struct {
	const char *addr; /* numeric IPv4 or IPv6 address: no DNS lookups */
	uint16_t port;
	int64_t host_id; /* whom we expect; rungs that need the server use it */
} dialer_target;

typedef struct {
	int fd;           /* connected, non-blocking, TCP_NODELAY, close-on-exec */
	const char *rung; /* the rung that reached the peer ("direct") */
	const char *plan; /* the rung the broker planned (a static string), or NULL: none */
} dialer_result;

typedef struct dialer dialer;

typedef struct {
	const char *rung;
	/* Connect to t before deadline (deadline.h); on COT_OK res->fd belongs
	 * to the caller.  On error nothing is left open and eb says why:
	 * COT_ERR_TIMEOUT at the deadline, COT_ERR_NETWORK when the peer could
	 * not be reached, COT_ERR_INVALID for a bad target. */
	cot_err (*connect)(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
	                   cot_errbuf *eb);
	void (*free)(dialer *d);
} dialer_ops;

struct dialer {
	const dialer_ops *ops;
};

/* Connect through d; see dialer_ops.connect. */
cot_err dialer_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                       cot_errbuf *eb);

/* The rung name of d, for reports ("direct", "ladder"). */
const char *dialer_rung(const dialer *d);

/* Free d (NULL is fine). */
void dialer_free(dialer *d);

/* The direct rung: a TCP connect to t->addr:t->port. */
cot_err dialer_direct_new(dialer **out, cot_errbuf *eb);

/* A ladder over n rungs (1..8), which it owns from now on, even on error:
 * tries each in order until one connects.  Each rung gets a fair share of the
 * time left (what is left divided by the rungs left), so a rung that fails
 * fast leaves its time to the next.  When all fail, the error of the last
 * rung is returned and eb lists each rung's failure. */
cot_err dialer_ladder_new(dialer **rungs, size_t n, dialer **out, cot_errbuf *eb);

/* Make a connected socket ready for the transport: non-blocking,
 * close-on-exec, TCP_NODELAY (frames are written whole; Nagle would only
 * delay the last segment).  For dialers and listeners alike. */
cot_err dialer_prepare_fd(int fd, cot_errbuf *eb);

#endif
