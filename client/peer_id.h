/* cotrain client: this host's identity among a project's peers.
 *
 * Per project, under <state_dir>/peer/:
 *   <name>.ca.pem    the project CA, fetched once and then pinned: a server
 *                    that later shows another CA is refused (an attacker
 *                    who takes over the address cannot mint peers);
 *   <name>.key.pem   our private key (Ed25519, 0600), made once;
 *   <name>.pub.pem   its public key, sent to the server for signing.
 * The certificate (CN=host:<id>, O=<project>) is short-lived: it is asked
 * for again when less than a tenth of its lifetime (at least 10 minutes) is
 * left, and kept in memory only.  The listener peers dial for averaging is
 * opened once, on the configured address and port. */
#ifndef CL_PEER_ID_H
#define CL_PEER_ID_H

#include <stdint.h>

#include "client/api.h"
#include "client/conf.h"
#include "client/links.h"
#include "client/portmap.h"
#include "shared/common/json.h"
#include "shared/nat/nat.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"

typedef struct {
	peer_ctx *ctx;        /* our identity; NULL until ready */
	int64_t cert_expires; /* unix seconds */
	int64_t cert_renew_at;
	listener *lst;
	char endpoint[80];  /* what peers dial: "addr:port" or "[v6]:port" */
	char nat_class[16]; /* the NAT service's view of us, "" without one */
	char nat_mapping[16];
	char nat_endpoint[80];   /* our public endpoint as the NAT service saw it */
	int64_t nat_observed_at; /* time(NULL) of the last registration */
	cl_portmap *pm;          /* our mapping on the home router, NULL when none */
	int64_t pm_retry_at;     /* time(NULL) to ask for one again */
	size_t n_rtt;            /* round-trip times measured to peers (links.h), newest first */
	struct {
		int64_t host;
		double ms;
	} rtt[CL_LINKS_MAX];
} cl_peer;

/* Fetch the project's CA and pin it (or check it against the pinned one).
 * local_ip (may be NULL) receives our address on the connection to the
 * server.  COT_ERR_AUTH when the server shows another CA than the pinned
 * one. */
cot_err cl_peer_pin_ca(const cl_api_opts *o, const cl_project *p, const char *state_dir, char *local_ip,
                       size_t iplen, cot_errbuf *eb);

/* Make pe usable for a round of project p: the CA pinned, our key, a fresh
 * enough certificate, the listener open and the endpoint known.  With a
 * NAT service configured, we ask the home router for a port mapping (when
 * port_mapping is on; renewed at half its lease, retried every 10 minutes
 * when no router answers) and register with the service (nat_observe, every
 * 5 minutes): the endpoint is then our public one as the server sees it,
 * and a host offers to aggregate when peers can reach it: public, port
 * mapped, or behind a NAT that keeps its public port for every destination
 * (hole punching works); not behind a symmetric NAT (relay only). */
cot_err cl_peer_ready(cl_peer *pe, const cl_api_opts *o, const cl_project *p, const cl_config *cfg,
                      cot_errbuf *eb);

/* The NAT service settings for project p (cfg's service, p's host) into
 * nc, for nat_dialer_new and nat_acceptor_start; false without one. */
bool cl_peer_nat_config(const cl_peer *pe, const cl_project *p, const cl_config *cfg, nat_config *nc);

/* Remember the round-trip times of links (newest first, CL_LINKS_MAX at
 * most), and write them as the report's "rtt" object ({"<host id>": ms});
 * NULL when none is known. */
void cl_peer_note_links(cl_peer *pe, cl_links *links);
json_t *cl_peer_rtt_json(const cl_peer *pe);

/* Whether peers can reach us to aggregate: always without a NAT service;
 * with one, when public, port mapped, or behind a NAT that keeps one public
 * port per local port (hole punching); not behind a symmetric NAT (only the
 * relay reaches us). */
int cl_peer_can_aggregate(const cl_peer *pe);

/* One line for status: how the NAT service sees us, "" without one. */
void cl_peer_network(const cl_peer *pe, char *out, size_t len);

/* Drop the identity files of project p (on detach). */
void cl_peer_forget(const cl_project *p, const char *state_dir);

void cl_peer_free(cl_peer *pe);

#endif
