/* cotrain client: serving pieces of the checkpoints this host holds to its
 * peers, on its peer port (doc/design.md, "Checkpoints from peers";
 * shared/peer/pieces.h has the protocol).
 *
 * One server per project.  It accepts on the project's peer listener only
 * while the daemon lends it the listener (cl_piece_server_attach) and stops
 * before a round takes it back for the all-reduce (cl_piece_server_detach):
 * the two never accept on one socket at once, and a joiner that dials during
 * a round is refused by the aggregator's HELLO and asks another holder.
 *
 * Bounds: at most PIECE_SERVER_CONNS connections served at once (more are
 * closed at once), each one authenticated like the averaging traffic (TLS
 * 1.3 with project certificates, HELLO) within PIECES_HANDSHAKE_MS, idle at
 * most 10 s, open at most 120 s and for at most 4,096 requests; pieces
 * leave at most at the upload_limit preference's rate, all connections
 * together.  Only files registered with cl_piece_server_hold are served,
 * from the cache, after a check that the file still has its size: nothing
 * a request says can name another file or change one. */
#ifndef CL_PIECE_SERVER_H
#define CL_PIECE_SERVER_H

#include <stdint.h>

#include "shared/common/error.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"

#define PIECE_SERVER_CONNS 4
#define PIECE_SERVER_HELD 4 /* files held at once: the newest registered */

typedef struct cl_piece_server cl_piece_server;

/* A server for project (copied), stopped until attached.  NULL when memory
 * or a thread cannot be had (the host then serves nothing). */
cl_piece_server *cl_piece_server_start(const char *project, cot_errbuf *eb);

/* Accept on lst with identity ctx from now on (in place of any earlier
 * ones); lst must stay open until cl_piece_server_detach returns, ctx is
 * kept by reference (peer_ctx_ref).  rate: bytes/s, 0 = unlimited. */
void cl_piece_server_attach(cl_piece_server *s, listener *lst, peer_ctx *ctx, int64_t rate);

/* Stop accepting (waits at most the 100 ms of one accept call) and let go
 * of the listener and the context; connections being served go on. */
void cl_piece_server_detach(cl_piece_server *s);

/* Serve the file sha256 of size bytes at path (copied) from now on, in
 * place of the oldest one held when PIECE_SERVER_HELD are. */
void cl_piece_server_hold(cl_piece_server *s, const char *sha256, const char *path, uint64_t size);

/* Detach, stop the thread and let go of s (NULL is fine): connections still
 * being served end on their own and the last frees it. */
void cl_piece_server_stop(cl_piece_server *s);

#endif
