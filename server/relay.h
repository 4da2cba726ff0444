/* cotrain-server: the NAT service: a TCP port (and the next one) where hosts
 * register their public endpoint, meet a peer (the server tells both how and
 * when to connect) and, when nothing direct works, have their connections
 * spliced by the server (the relay).  doc/nat.md gives the line protocol.
 *
 * One thread accepts on both ports; a small pool of workers reads each
 * connection's request line (bounded in size and time), authenticates it
 * (host token, rendezvous.h) and answers it; each relay session is one
 * thread copying between two sockets through bounded buffers, capped per
 * host (reachability.h holds the token buckets and byte counts) and closed
 * after an idle timeout.  The TLS session inside a relay stays end to end
 * between the peers: the server sees only ciphertext. */
#ifndef COT_SERVER_RELAY_H
#define COT_SERVER_RELAY_H

#include <stdint.h>

#include "shared/common/error.h"

typedef struct {
	const char *listen; /* numeric address to bind ("0.0.0.0") */
	int port;           /* the service port; port + 1 is the second one */
	uint64_t bandwidth; /* relay cap per host, bytes per second each way (0: none) */
	int idle_s;         /* a relay session idle this long is closed */
	int wait_s;         /* how long the first half of a meeting waits */
	int max_sessions;   /* relay sessions at once */
	int meet_lead_ms;   /* from the meeting to the moment to connect */
	int dialback_ms;    /* dial-back timeout of the reachability check */
} relay_config;

typedef struct relay_service relay_service;

/* Bind both ports and start the threads.  COT_ERR_IO when a port cannot be
 * bound; nothing is left running on error. */
cot_err relay_start(const relay_config *cfg, relay_service **out, cot_errbuf *eb);

/* The first service port (as bound). */
int relay_port(const relay_service *s);

/* Stop accepting, close every parked and relayed connection, wait for the
 * threads, free s (NULL is fine). */
void relay_stop(relay_service *s);

#endif
