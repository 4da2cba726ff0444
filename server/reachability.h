/* cotrain-server: what the server knows of each host's network position.
 *
 * The NAT service (relay.h) tells this module what it observes: the public
 * endpoint (source address and port) of a host's registration made from its
 * listening port, on each of the service's two ports.  reach_classify() then
 * dials the host's advertised endpoint back and classifies it:
 *
 *   public       the dial-back connected and the host's own address is the
 *                one the server sees (no NAT)
 *   mapped       the dial-back connected through a NAT (a port mapped by
 *                UPnP-IGD or NAT-PMP, or a forwarded port)
 *   nat          the dial-back failed; "mapping" says whether the NAT kept
 *                the same public port for both server ports (independent:
 *                hole punching can work) or not (dependent: relay only)
 *   unknown      nothing observed yet
 *
 * The table also holds each host's relay accounting (bytes relayed) and
 * the token bucket that caps its relay bandwidth.  It lives in memory, and
 * is written through to the host's row (its columns: db/migrations/0009_nat_links.sql):
 * the class and public endpoint each time reach_classify() decides (in the
 * caller's thread, on its dbconn connection), the relay byte and session
 * counts in batches, by a thread of this module at most every
 * REACH_FLUSH_MS per host and once more in reach_free().  The broker plans
 * from memory; a restarted server reads a host it has not observed yet from
 * its row (reach_get_or_reload) until the host registers again.  Safe for
 * concurrent use. */
#ifndef COT_SERVER_REACHABILITY_H
#define COT_SERVER_REACHABILITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/http.h"

#define REACH_ADDR_MAX 64
#define REACH_FLUSH_MS 2000 /* relay counts reach the database this often */
#define REACH_RELOAD_S 900  /* a row's class serves a restarted server this long (3 registrations) */

typedef struct {
	int64_t host_id;
	char addr[REACH_ADDR_MAX];       /* public address as the server saw it */
	uint16_t port_a;                 /* public port seen on the first service port (0: none) */
	uint16_t port_b;                 /* ... on the second */
	uint16_t adv_port;               /* the port the host says it can be dialed on */
	char local_addr[REACH_ADDR_MAX]; /* the host's own address, as it says (its registration's source) */
	uint16_t local_port;             /* its listening port, as it says */
	const char *klass;               /* "public", "mapped", "nat", "unknown" */
	const char *mapping;             /* "independent", "dependent", "unknown" */
	int64_t observed_ms;             /* monotonic time of the last observation */
	uint64_t relay_bytes_in;         /* bytes the relay took from this host */
	uint64_t relay_bytes_out;        /* bytes the relay delivered to it */
	uint64_t relay_sessions;
} reach_info;

/* Create the table and start the thread that writes relay counts to the
 * database (call once before the NAT service starts, after dbc_init).
 * Returns 0, or -1 when out of memory or the thread could not start. */
int reach_init(void);
/* Write the relay counts not yet written, stop the thread and drop
 * everything (after the NAT service has stopped). */
void reach_free(void);

/* Record an observation of host on service port `which` (0 or 1): the public
 * addr:port the server saw, the host's own listening address and the port it
 * advertises (0: its listening port).  A new public address resets the
 * other port's observation and the class. */
void reach_observe(int64_t host, const char *addr, uint16_t port, int which, const char *local_addr,
                   uint16_t local_port, uint16_t adv_port);

/* Dial the host's advertised endpoint back (its observed public address, never
 * an address it names: the server cannot be made to dial a third party) for
 * at most timeout_ms and store its class, in memory and in the host's row
 * (a database error is logged; the class in memory stands).  Blocks;
 * returns the class. */
const char *reach_classify(int64_t host, int timeout_ms);

/* Copy what is known of host into *out; false when nothing is. */
bool reach_get(int64_t host, reach_info *out);

/* reach_get for planning a meeting: a host this server has not observed
 * since it started (a restart) is loaded from its row when the row was
 * written within REACH_RELOAD_S, and kept in the table until the host's
 * next registration replaces it.  Uses the calling thread's database
 * connection; false when neither knows the host. */
bool reach_get_or_reload(int64_t host, reach_info *out);

/* Relay bandwidth: take up to want bytes from host's token bucket filled at
 * cap bytes per second (cap 0: no cap; the bucket holds at most a quarter of
 * a second).  Returns the bytes allowed now (0: wait and retry) and, when 0,
 * the milliseconds to wait in *wait_ms. */
size_t reach_relay_take(int64_t host, size_t want, uint64_t cap, int *wait_ms);

/* Give back n bytes taken with reach_relay_take and not used. */
void reach_relay_refund(int64_t host, size_t n, uint64_t cap);

/* Account bytes relayed from host (in) or to it (out), and sessions.  Only
 * memory is touched here; the flush thread writes the sums. */
void reach_relay_account(int64_t host, uint64_t in, uint64_t out, bool new_session);

/* The relay counts of host accounted but not yet in its row (zeros when
 * none or the host is unknown): a view adds them to the row's totals. */
void reach_relay_pending(int64_t host, uint64_t *in, uint64_t *out, uint64_t *sessions);

/* Write every pending relay count now (the flush thread does this every
 * REACH_FLUSH_MS).  Counts a database error leaves unwritten stay pending.
 * Returns the number of hosts written. */
int reach_flush(void);

/* GET /v1/hosts/{id}/nat (account key of the host's owner): the host's
 * reachability and relay accounting, from memory when this server has
 * classified the host since it started, else from the host's row. */
void api_host_nat(http_req *req);

#endif
