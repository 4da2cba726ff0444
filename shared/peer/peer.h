/* cotrain: authenticated peer connections: TLS 1.3 over a dialed socket.
 *
 * A peer_ctx holds this host's identity (its certificate and key, signed by
 * the project CA) and the pinned project CA as the only trust anchor.  A
 * peer_conn wraps a connected socket from dialer.h or listener.h in TLS 1.3
 * (1.3 only, both ways authenticated, no session resumption) and carries
 * frames (frame.h) over it.
 *
 * Every call that touches the network takes an absolute deadline
 * (deadline.h) and returns COT_ERR_TIMEOUT when it passes; nothing blocks
 * beyond it.  Sending is backpressured: peer_send_frame() returns only when
 * the kernel has accepted the whole frame, waiting (up to the deadline) while
 * the peer reads slowly; nothing is queued in memory beyond the caller's
 * buffer.  A received payload is allocated only after its header passed the
 * connection's limit (peer_set_max_payload).
 *
 * After any failure in the middle of a frame, or of the TLS layer, the
 * connection is broken: later calls return COT_ERR_CONFLICT, and the caller
 * closes it.  A receive that times out before the first byte of a frame leaves
 * the connection usable.
 *
 * SIGPIPE is blocked for the calling thread during each call, so a peer that
 * disappears gives COT_ERR_NETWORK instead of killing the process.
 *
 * A peer_ctx may be shared by threads; a peer_conn is used by one thread at a
 * time (OpenSSL does not allow a concurrent read and write on one TLS
 * connection). */
#ifndef COT_PEER_H
#define COT_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"
#include "shared/peer/frame.h"

typedef struct peer_ctx peer_ctx;
typedef struct peer_conn peer_conn;

/* This host's identity; PEM buffers with their lengths (each at most
 * PKI_PEM_MAX).  Nothing is kept pointing into them after peer_ctx_new. */
typedef struct {
	const char *project; /* the project name the CA names */
	const char *ca_pem;  /* the pinned project CA certificate */
	size_t ca_len;
	const char *cert_pem; /* this host's certificate, from the project server */
	size_t cert_len;
	const char *key_pem; /* this host's private key */
	size_t key_len;
} peer_identity;

typedef enum { PEER_CLIENT, PEER_SERVER } peer_role;

/* A context for id.  Refuses (COT_ERR_INVALID / COT_ERR_AUTH) a CA that is not
 * the project's, a certificate not for a host of this project or not signed by
 * its CA, and a key that does not match the certificate.  The certificate's
 * validity window is not checked here (peers check it at each handshake), so
 * a context may outlive one certificate: make a new one at renewal. */
cot_err peer_ctx_new(const peer_identity *id, peer_ctx **out, cot_errbuf *eb);

/* One more owner of ctx (returned): each owner calls peer_ctx_free once, and
 * the last one frees it.  So a thread that handshakes with a context may
 * keep it while its first owner renews it (client/piece_server.c). */
peer_ctx *peer_ctx_ref(peer_ctx *ctx);
void peer_ctx_free(peer_ctx *ctx);

/* This host's id, from its own certificate. */
int64_t peer_ctx_host_id(const peer_ctx *ctx);
const char *peer_ctx_project(const peer_ctx *ctx);

/* Run the TLS 1.3 handshake on fd (connected, non-blocking), which the
 * connection owns from now on, even on error.  The peer's certificate is
 * checked against the pinned CA (pki_trust_verify); with expect_host_id > 0,
 * it must also name that host.  On COT_OK *out is the caller's, to free with
 * peer_close.  Errors: COT_ERR_AUTH when the peer's certificate is refused
 * or the peer refused ours, COT_ERR_UNSUPPORTED when it does not speak TLS
 * 1.3, COT_ERR_NETWORK when the connection fails, COT_ERR_TIMEOUT.
 *
 * In TLS 1.3 the server checks the client's certificate after the client has
 * finished its handshake, so a client learns that it was refused on its first
 * receive (the HELLO exchange, hello.h). */
cot_err peer_handshake(peer_ctx *ctx, int fd, peer_role role, int64_t expect_host_id, int64_t deadline,
                       peer_conn **out, cot_errbuf *eb);

/* The peer's host id, from its verified certificate. */
int64_t peer_host_id(const peer_conn *c);

/* The largest payload this side accepts (default FRAME_PAYLOAD_DEFAULT_MAX;
 * clamped to FRAME_MIN..HARD_MAX) and the largest it will send (what the peer
 * announced in its HELLO; default FRAME_PAYLOAD_DEFAULT_MAX). */
void peer_set_max_payload(peer_conn *c, size_t max);
size_t peer_max_payload(const peer_conn *c);
void peer_set_send_max(peer_conn *c, size_t max);

/* Send one frame of type with len payload bytes before deadline.  Returns when
 * the whole frame is written; COT_ERR_TOO_LARGE (and nothing sent) above the
 * send limit. */
cot_err peer_send_frame(peer_conn *c, uint8_t type, uint32_t request_id, const void *payload, size_t len,
                        int64_t deadline, cot_errbuf *eb);

/* Receive one frame before deadline: its header in *h, its payload in
 * *payload (malloc'd, the caller frees; NULL when empty).  Refuses bad headers
 * (frame_header_decode) before allocating.  COT_ERR_NETWORK when the peer
 * closes the connection (the detail says whether mid-frame). */
cot_err peer_recv_frame(peer_conn *c, frame_header *h, unsigned char **payload, int64_t deadline,
                        cot_errbuf *eb);

/* Send an ERROR frame (best effort, within deadline) and mark the connection
 * broken: the way to refuse a peer with a reason before closing. */
void peer_send_error(peer_conn *c, uint16_t code, const char *reason, int64_t deadline);

/* Say goodbye (a TLS close_notify, without waiting for the peer's), close the
 * socket and free c (NULL is fine). */
void peer_close(peer_conn *c);

#endif
