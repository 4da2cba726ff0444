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
#include "shared/listener.h"
#include "shared/peer.h"

typedef struct {
	peer_ctx *ctx;             /* our identity; NULL until ready */
	int64_t cert_expires;      /* unix seconds */
	int64_t cert_renew_at;
	listener *lst;
	char endpoint[80];         /* what peers dial: "addr:port" or "[v6]:port" */
} cl_peer;

/* Fetch the project's CA and pin it (or check it against the pinned one).
 * local_ip (may be NULL) receives our address on the connection to the
 * server.  COT_ERR_AUTH when the server shows another CA than the pinned
 * one. */
cot_err cl_peer_pin_ca(const cl_api_opts *o, const cl_project *p, const char *state_dir, char *local_ip,
                       size_t iplen, cot_errbuf *eb);

/* Make pe usable for a round of project p: the CA pinned, our key, a fresh
 * enough certificate, the listener open and the endpoint known. */
cot_err cl_peer_ready(cl_peer *pe, const cl_api_opts *o, const cl_project *p, const cl_config *cfg,
                      cot_errbuf *eb);

/* Drop the identity files of project p (on detach). */
void cl_peer_forget(const cl_project *p, const char *state_dir);

void cl_peer_free(cl_peer *pe);

#endif
