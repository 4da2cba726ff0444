/* cotrain: pieces of held files between peers (doc/peer-protocol.md,
 * "Pieces of files"; doc/design.md, "Checkpoints from peers").
 *
 * A host that holds a checkpoint serves its pieces on its peer port; a host
 * that needs it (a joiner, a forked peer) asks several holders at once for
 * pieces and checks each against the manifest (shared/common/ckpt_pieces.h)
 * before it writes it.
 *
 * The connection is an ordinary peer connection (TLS 1.3 with project
 * certificates, HELLO) whose HELLO names no round but HELLO_ROUND_FILES, at
 * protocol version 3 or later.  Then the asking side sends PIECE_GET
 * (str sha256, u32 index) and reads PIECE (u32 index, blob bytes), one at a
 * time; the serving side answers ERROR and closes on anything else: a file
 * it does not hold (code 8, not_found), an index past the file's last piece
 * or a malformed request (code 1, protocol), more connections or requests
 * than it allows (code 6, limit).  Nothing a request says changes anything
 * on the serving side. */
#ifndef COT_PIECES_H
#define COT_PIECES_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/ckpt_pieces.h"
#include "shared/common/error.h"
#include "shared/peer/dialer.h"
#include "shared/peer/peer.h"

#define PIECES_PROTO_MIN 3       /* the first protocol version with pieces */
#define PIECES_SOURCES_MAX 16    /* holders asked at once */
#define PIECES_HANDSHAKE_MS 5000 /* TLS and HELLO, either side */
/* Reaching a holder (the ladder's meeting and a TCP connect): short, since a
 * fetch ends only when every holder's thread has; a holder that cannot be
 * reached in this long is left to the others. */
#define PIECES_CONNECT_MS 3000

/* ---- Serving ---- */

typedef struct {
	const char *project; /* ours, for HELLO */
	int64_t host_id;     /* ours, for HELLO */
	/* Open the held file named sha256 (64 hex digits, checked): *fd for
	 * reading (the caller closes it) and its size.  COT_ERR_NOT_FOUND when
	 * it is not held.  Called once per request, from the serving thread. */
	cot_err (*open_file)(void *arg, const char *sha256, int *fd, uint64_t *size, cot_errbuf *eb);
	/* Called with each piece before it is sent (may be NULL): where a rate
	 * limit waits, and where a test's lying peer changes the bytes. */
	void (*before_send)(void *arg, unsigned char *data, size_t len);
	void *arg;
	int64_t idle_ms;       /* the most to wait for the next request */
	uint32_t max_requests; /* per connection */
} pieces_serve_opts;

/* After the handshake: the HELLO exchange on c, then requests until the
 * peer closes, idles past o->idle_ms, breaks the protocol, asks too often,
 * or deadline passes; each refusal is sent to the peer as an ERROR with its
 * reason.  Returns COT_OK when the peer closed after good requests, else the
 * error (eb says why); *served counts the pieces sent (may be NULL).  c
 * stays the caller's. */
cot_err pieces_serve(peer_conn *c, const pieces_serve_opts *o, int64_t deadline, uint32_t *served,
                     cot_errbuf *eb);

/* ---- Fetching ---- */

typedef struct {
	int64_t host_id;
	char addr[DIALER_ADDR_MAX];
	uint16_t port;
} pieces_source;

typedef struct {
	int64_t host_id;
	uint32_t pieces;  /* fetched from it and verified */
	uint32_t refused; /* pieces it sent that did not match the manifest */
	char error[512];  /* why it was left, "" when it was not */
} pieces_source_stats;

typedef struct {
	const ckpt_manifest *m;
	int fd;         /* the output file: each verified piece is pwritten at its offset */
	peer_ctx *ctx;  /* our identity */
	dialer *dialer; /* the ladder or the direct dialer */
	const pieces_source *src;
	size_t n_src; /* at most PIECES_SOURCES_MAX are used */
	int64_t deadline;
	int64_t piece_timeout_ms; /* per request */
	volatile int *cancel;     /* when set, stop (may be NULL) */
	unsigned char *have;      /* m->n flags, in and out: 1 when the piece is in fd */
} pieces_fetch_params;

/* Fetch the pieces not yet in p->have from the sources, one connection and
 * one thread per source, at once.  Piece i goes first to source i mod n, so
 * every source is asked; a source that fails or sends a piece that does not
 * hash to the manifest's entry is left (the piece goes back for another
 * source, the liar is never asked again), and a source that runs out of its
 * own pieces takes the others' that are left.  Nothing unverified is
 * written.  Returns COT_OK whatever the sources did (p->have says which
 * pieces arrived; st[k], when st is not NULL, what source k gave), or
 * COT_ERR_NOMEM / COT_ERR_IO (a write failed). */
cot_err pieces_fetch(const pieces_fetch_params *p, pieces_source_stats *st, cot_errbuf *eb);

#endif
