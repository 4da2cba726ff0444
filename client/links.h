/* cotrain client: the connections we opened to our group in a round, and
 * what they tell about the network.
 *
 * A recording dialer wraps the round's dialer (the NAT ladder or the direct
 * rung): for each peer it notes the rung that connected, how long the
 * connect took, and the round-trip time the kernel measured on the TCP
 * connection (TCP_INFO; not for relayed connections, whose TCP peer is the
 * server).  The daemon reports the links with the round's outcome (the
 * server's per-host view shows them), keeps the round-trip times for the
 * reports of later rounds (groups are formed from nearby peers), and shows
 * them in `cotrainctl status`. */
#ifndef COT_CLIENT_LINKS_H
#define COT_CLIENT_LINKS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "shared/peer/dialer.h"
#include "shared/common/error.h"

#define CL_LINKS_MAX 64

typedef struct {
	int64_t peer;
	char rung[8];      /* "lan", "direct", "punch", "relay" */
	char plan[8];      /* the rung the broker planned ("" when none) */
	double connect_ms; /* the first connection's dialer_connect, all rungs tried */
	double rtt_ms;     /* the kernel's smoothed RTT; < 0 when not measured */
	int conns;         /* connections opened to this peer */
} cl_link;

typedef struct {
	pthread_mutex_t mu;
	size_t n;
	cl_link l[CL_LINKS_MAX];
} cl_links;

void cl_links_init(cl_links *ls);
void cl_links_destroy(cl_links *ls);

/* A dialer that connects through inner (which it owns from now on, even
 * on error) and records each connection in ls (which must outlive it). */
cot_err cl_links_dialer_new(dialer *inner, cl_links *ls, dialer **out, cot_errbuf *eb);

/* One line for status: "host 3 direct 0.4 ms, host 5 relay" ("" when none). */
void cl_links_summary(cl_links *ls, char *out, size_t len);

#endif
