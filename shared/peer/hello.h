/* cotrain: the HELLO exchange that opens every peer connection.
 *
 * Right after the TLS handshake both sides send HELLO at once:
 *
 *   u16 proto_min, u16 proto_max   message-set versions the sender speaks
 *   str project                    the project name (<= PKI_PROJECT_MAX bytes)
 *   i64 host_id                    the sender's host id
 *   i64 round                      the model version the sender is averaging
 *   u32 max_payload                the largest payload the sender accepts
 *
 * Each side checks the other's (hello_check) and answers READY, or ERROR
 * with a code and a reason before closing; then each reads the other's
 * answer.  The exchange never deadlocks, since each side writes one small
 * frame before it reads.  Both sides reach the same protocol version: the
 * highest one both speak. */
#ifndef COT_HELLO_H
#define COT_HELLO_H

#include <stdint.h>

#include "shared/common/error.h"
#include "shared/peer/frame.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"

#define HELLO_PROTO_MIN \
	2 /* message-set versions this build speaks (2: pipelined parts, 3: pieces of held files; doc/peer-protocol.md) */
#define HELLO_PROTO_MAX 3

/* The round of a connection that is no round's: one that asks for pieces of
 * held files (pieces.h), which needs protocol version 3.  Rounds are model
 * versions, far below. */
#define HELLO_ROUND_FILES INT64_MAX

typedef struct {
	uint16_t proto_min, proto_max;
	char project[PKI_PROJECT_MAX + 1];
	int64_t host_id;
	int64_t round;
	uint32_t max_payload;
} hello_msg;

/* Append the HELLO payload of m to w. */
cot_err hello_encode(const hello_msg *m, frame_writer *w);

/* Parse a HELLO payload (bounded, every field checked for shape). */
cot_err hello_decode(const void *payload, size_t len, hello_msg *m, cot_errbuf *eb);

/* Whether we (ours) accept theirs, whose certificate names cert_host_id.
 * COT_OK with the agreed version in *version, or the refusal with a reason:
 * COT_ERR_UNSUPPORTED (no common version), COT_ERR_FORBIDDEN (another
 * project), COT_ERR_AUTH (host id is not the certificate's),
 * COT_ERR_CONFLICT (another round), COT_ERR_INVALID (bad limits). */
cot_err hello_check(const hello_msg *ours, const hello_msg *theirs, int64_t cert_host_id, uint16_t *version,
                    cot_errbuf *eb);

/* Run the exchange on c before deadline.  ours->host_id and ours->project
 * must be this host's.  On COT_OK, *theirs and *version hold what was agreed
 * and c will send at most theirs->max_payload and receive at most
 * ours->max_payload per frame.  When the peer refuses, its reason is in eb
 * ("peer refused: ...") with the cot_err its code stands for; when we refuse,
 * the peer has been told why.  Either way, close c. */
cot_err hello_exchange(peer_conn *c, const hello_msg *ours, hello_msg *theirs, uint16_t *version,
                       int64_t deadline, cot_errbuf *eb);

#endif
