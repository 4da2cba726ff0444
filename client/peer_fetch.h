/* cotrain client: fetching a checkpoint from the peers that hold it, piece
 * by piece, with the project server as the fallback (doc/design.md,
 * "Checkpoints from peers").
 *
 * The server names the checkpoint's pieces and the peers that hold it
 * (GET /v1/projects/{name}/checkpoints/{sha256}: the manifest, a few
 * kilobytes); the pieces come from up to PIECES_SOURCES_MAX peers at once
 * over authenticated peer connections, dialed through the dialer the caller
 * gives (the NAT ladder or the direct dialer), each piece checked against
 * the manifest before it is written (shared/peer/pieces.h).  Pieces no peer
 * delivered come from the server's /files/{sha256} by HTTP range, checked
 * the same way.  The whole file's sha256 is checked last, and only then is
 * the file renamed into the cache. */
#ifndef CL_PEER_FETCH_H
#define CL_PEER_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "client/api.h"
#include "client/shard_cache.h"
#include "client/state.h"
#include "shared/common/error.h"
#include "shared/peer/dialer.h"
#include "shared/peer/peer.h"

typedef struct {
	uint32_t pieces;           /* in the checkpoint */
	uint32_t from_peers;       /* pieces peers delivered, verified */
	uint32_t from_server;      /* pieces the server delivered */
	uint32_t refused;          /* pieces peers sent that did not match the manifest */
	size_t sources;            /* peers the server named */
	int64_t server_file_bytes; /* bytes of the file the server sent */
} cl_peer_fetch_info;

/* Put checkpoint sha (size bytes) of project p into the cache as above;
 * its path goes into dest.  Errors: those of the manifest request
 * (COT_ERR_NOT_FOUND for a file that is no checkpoint of the project, or a
 * server without the route; COT_ERR_NETWORK), COT_ERR_NOT_FOUND too when
 * the server names no holder (or ctx or dl is NULL): the caller then
 * downloads the file whole, which resumes; COT_ERR_INVALID for a
 * manifest that does not fit the file, COT_ERR_NETWORK when a piece could
 * be had from nobody, COT_ERR_CORRUPT when the whole file does not hash to
 * sha (nothing is kept), COT_ERR_IO.  info may be NULL. */
cot_err cl_peer_fetch(const cl_fetch_env *env, const cl_api_opts *o, const cl_project *p, peer_ctx *ctx,
                      dialer *dl, const char *sha, int64_t size, char *dest, size_t destlen,
                      cl_peer_fetch_info *info, cot_errbuf *eb);

#endif
