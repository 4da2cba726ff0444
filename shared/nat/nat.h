/* cotrain: NAT traversal brokered by the project server (doc/nat.md).
 *
 * The server's NAT service (server/relay.h, `cotrain-server --relay-port P`)
 * listens on P and P+1.  A host:
 *
 *   1. registers with nat_observe(): two connections made FROM ITS LISTENING
 *      PORT to P+1 and P, so the server sees the public endpoint that port
 *      maps to (and whether the NAT keeps that public port for both
 *      destinations), then dials it back to classify the host (public,
 *      mapped, nat, with mapping independent or dependent);
 *   2. dials peers with the dialer of nat_dialer_new(): for each target it
 *      asks the server to MEET the peer; the server answers both with a plan
 *      (lan, direct, punch or relay), the endpoint and the moment; the dialer
 *      follows the plan and falls back to the relay.  dialer_result.rung
 *      says which rung connected: "lan", "direct", "punch" or "relay", and
 *      dialer_result.plan which one the server planned;
 *   3. on the accepting side (an aggregator), runs nat_acceptor_start() for
 *      the peers that will dial it: it meets each peer once per connection
 *      the peer opens; for a punch both connect at the same moment, each
 *      from the port its meeting left from, to the public endpoint the
 *      server saw for the other's meeting (TCP simultaneous open: each
 *      side's SYN opens its own NAT's mapping for the other's),
 *      and when the dialer falls back to the relay it joins the relay; either
 *      connection is bridged to its own listener over loopback, so the
 *      accepting code (allreduce.c) sees one more incoming connection and
 *      needs no change.  (A listener_inject() would save that local copy.)
 *
 * The TLS session (peer.h) runs end to end over whatever socket these
 * produce; the relay only copies ciphertext.  Every call is bounded by its
 * deadline; nothing here keeps state between calls except the acceptor. */
#ifndef COT_NAT_H
#define COT_NAT_H

#include <stdbool.h>
#include <stdint.h>

#include "shared/peer/dialer.h"
#include "shared/common/error.h"
#include "shared/nat/nat_line.h"

#define NAT_PUNCH_WINDOW_MS 4000 /* how long a punch keeps trying after the moment */
#define NAT_LAN_WINDOW_MS 1500   /* how long a dial to a peer's local endpoint may take */
/* TCP keepalive on the NAT service's connections (and the client's HTTP long
 * polls): the first probe after this many idle seconds, then one every
 * NAT_KEEPALIVE_INTVL_S, so that no router forgets a connection that idles
 * (conntrack timeouts of 15 s and more are kept alive). */
#define NAT_KEEPALIVE_IDLE_S 10
#define NAT_KEEPALIVE_INTVL_S 5
#define NAT_KEEPALIVE_CNT 3

typedef struct {
	const char *server_addr; /* numeric address of the project server's NAT service */
	uint16_t server_port;    /* its first port (cotrain-server --relay-port) */
	int64_t host_id;         /* this host */
	const char *token;       /* this host's token (sent on the NAT service's port) */
	const char *listen_addr; /* our listener's numeric address ("0.0.0.0") */
	uint16_t listen_port;    /* our listener's port: registrations and punches leave from it */
	uint16_t mapped_port;    /* external port a port mapping gave us (portmap.h); 0: none */
} nat_config;

typedef struct {
	char addr[64];    /* our public address as the server sees it */
	uint16_t port;    /* the public port our listening port maps to (first port) */
	uint16_t port2;   /* ... toward the second port */
	char klass[16];   /* "public", "mapped", "nat", "unknown" */
	char mapping[16]; /* "independent", "dependent", "unknown" */
} nat_observation;

/* Register with the NAT service and learn how the server sees us.  The
 * listener must be open (the server dials it back; that connection carries
 * nothing and fails the TLS handshake harmlessly).  Errors: COT_ERR_NETWORK
 * (server unreachable), COT_ERR_AUTH / COT_ERR_FORBIDDEN (token refused),
 * COT_ERR_TIMEOUT. */
cot_err nat_observe(const nat_config *c, int64_t deadline, nat_observation *out, cot_errbuf *eb);

/* The brokered ladder for round (project, version): see above.  c and its
 * strings must outlive the dialer.  When the server cannot be asked, it
 * dials the target directly. */
cot_err nat_dialer_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                       cot_errbuf *eb);

/* Single rungs, for tests and benchmarks: "punch" (meets, then only punches;
 * fails when the plan is not punch) and "relay" (only the relay). */
cot_err dialer_punch_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                         cot_errbuf *eb);
cot_err dialer_relay_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                         cot_errbuf *eb);

typedef struct nat_acceptor nat_acceptor;

/* Accept side: one thread per peer in peers[0..n) (n <= 256) meets that
 * peer and helps its connection in (see above), until deadline or
 * nat_acceptor_stop.  c and its strings must outlive the acceptor. */
cot_err nat_acceptor_start(const nat_config *c, const char *project, int64_t version, const int64_t *peers,
                           size_t n, int64_t deadline, nat_acceptor **out, cot_errbuf *eb);

/* The rung that carried the first connection peer i opened to us, as this
 * side saw it: "punch" when our half of the punch connected, "relay" when
 * the relay joined us, else the plan ("direct", "lan") when the dialer did
 * not fall back to the relay; "" when no connection of that peer has been
 * decided (or every meeting failed). */
const char *nat_acceptor_rung(nat_acceptor *a, size_t i);

/* The plan of the same connection ("" likewise). */
const char *nat_acceptor_plan(nat_acceptor *a, size_t i);

/* Turn on TCP keepalive on fd (NAT_KEEPALIVE_*); best effort. */
void nat_keepalive(int fd);

/* Stop the threads (relayed sessions still open are closed), join, free. */
void nat_acceptor_stop(nat_acceptor *a);

/* ---- Internals shared by the rungs (nat_proto.c) ---- */

/* A TCP socket bound to c's listening address and port (SO_REUSEADDR and
 * SO_REUSEPORT; the listener must have set SO_REUSEPORT too) connecting,
 * non-blocking, to addr:port.  With ttl > 0 the SYN carries that TTL (for
 * experiments with one-sided punching).
 * Returns the fd (connect in progress) or -1 with eb set. */
int nat_bound_connect(const nat_config *c, const char *addr, uint16_t port, int ttl, cot_errbuf *eb);

/* The same from local_port (SO_REUSEADDR and SO_REUSEPORT): a punch
 * leaves from the port its meeting was made from. */
int nat_port_connect(const nat_config *c, uint16_t local_port, const char *addr, uint16_t port,
                     cot_errbuf *eb);

/* The same from an ephemeral port. */
int nat_plain_connect(const char *addr, uint16_t port, cot_errbuf *eb);

/* Wait for a non-blocking connect on fd to finish before deadline: COT_OK,
 * COT_ERR_TIMEOUT or COT_ERR_NETWORK (eb names addr). */
cot_err nat_connect_wait(int fd, const char *addr, uint16_t port, int64_t deadline, cot_errbuf *eb);

/* Open a connection to the NAT service (port c->server_port + which), send
 * line (without "\n"; sent as given even when longer than the protocol
 * allows, which the service then refuses) and read the answer line into
 * reply (NAT_LINE_MAX, nat_line.h).  On COT_OK *fd (when fd is not
 * NULL) is the open connection; otherwise it is closed.  An "ERR status code
 * message" answer returns the matching error (401 COT_ERR_AUTH, 403
 * COT_ERR_FORBIDDEN, 404 COT_ERR_NOT_FOUND, 408 COT_ERR_TIMEOUT, 409
 * COT_ERR_CONFLICT, else COT_ERR_NETWORK) with the message in eb.  With
 * cancel, waiting for the answer ends (COT_ERR_TIMEOUT) once *cancel is set
 * (checked every 200 ms): how the acceptor's threads stop early.  With
 * local_port, the connection leaves from a port of its own, bound with
 * SO_REUSEADDR, whose number is stored there: a punch can leave from it
 * again, and the NAT (when it maps independently of the destination) gives
 * it the public port the server saw. */
cot_err nat_request(const nat_config *c, int which, uint16_t *local_port, const char *line, int64_t deadline,
                    const volatile int *cancel, char *reply, int *fd, cot_errbuf *eb);

/* The answer to MEET: the plan, the peer's endpoint for it and the moment
 * (monotonic ms) to connect.  For a punch, the endpoint is the public one
 * of the peer's meeting connection, and we punch from our meeting's port. */
typedef struct {
	char plan[8]; /* "lan", "direct", "punch", "relay" */
	char addr[64];
	uint16_t port;
	int64_t moment;
	uint16_t local_port; /* the local port our meeting connection left from */
} nat_meeting;

cot_err nat_meet(const nat_config *c, const char *project, int64_t version, int64_t peer, bool dial,
                 int64_t deadline, const volatile int *cancel, nat_meeting *m, cot_errbuf *eb);

/* Join the relay for peer, as the side that dials (the connection's
 * sender) or the one that accepts: the two directions between two hosts are
 * two sessions.  On COT_OK *fd is the spliced connection (blocking
 * mode off, TCP_NODELAY). */
cot_err nat_relay_join(const nat_config *c, const char *project, int64_t version, int64_t peer, bool dial,
                       int64_t deadline, const volatile int *cancel, int *fd, cot_errbuf *eb);

/* Punch: from the moment (plus a little, so that the acceptor's mapping is
 * open), connect from m's local port to m's endpoint, retrying refused
 * attempts, until deadline or the punch window ends.  On COT_OK *fd is the
 * connection, ready for the transport. */
cot_err nat_punch_connect(const nat_config *c, const nat_meeting *m, int64_t deadline, int *fd,
                          cot_errbuf *eb);

/* Copy both ways between connected sockets a and b until both directions
 * ended, one fails, or deadline; once *stop is set (polled every 200 ms), for
 * NAT_BRIDGE_GRACE_MS more at most, so bytes in flight still arrive.  Closes
 * neither. */
#define NAT_BRIDGE_GRACE_MS 3000
void nat_bridge(int a, int b, int64_t deadline, const volatile int *stop);

#endif
