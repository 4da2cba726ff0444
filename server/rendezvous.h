/* cotrain-server: the NAT broker's decisions: who is asking (host token),
 * whether two hosts may meet (same group of a round that is averaging), and
 * the pairing of the two halves of a meeting (doc/nat.md).
 *
 * A "meeting" is one attempt by a pair of hosts of one round to connect: a
 * MEET (the server tells both how and when to connect) or a RELAY (the
 * server splices their two connections).  The first half to arrive is
 * parked here with its socket until the other half comes or its wait runs
 * out; rdv_park() returns the partner's socket when the pair is complete.
 * A pair may meet several times (one meeting per connection: an all-reduce
 * opens two per sender and aggregator): halves of one role queue, oldest
 * first, up to RDV_QUEUE_MAX, and a pair meets RDV_ATTEMPTS_MAX times of
 * one kind in one round at most; beyond either bound a half is refused
 * (replay).
 * Safe for concurrent use. */
#ifndef COT_SERVER_RENDEZVOUS_H
#define COT_SERVER_RENDEZVOUS_H

#include <stdbool.h>
#include <stdint.h>

#include "shared/common/error.h"

#define RDV_ATTEMPTS_MAX 16  /* meetings of one kind per pair, direction and round */
#define RDV_QUEUE_MAX 4      /* halves of one role waiting per pair and direction */
#define RDV_PENDING_MAX 4096 /* parked halves at once */

typedef enum { RDV_MEET, RDV_RELAY } rdv_kind;

/* One half of a meeting, as it arrived. */
typedef struct {
	int fd;             /* the half's connection (owned by the table while parked) */
	int64_t host;       /* who sent it */
	int dial;           /* 1 for the side that dials, 0 for the one that accepts */
	int64_t expires_ms; /* monotonic time the wait ends */
} rdv_half;

/* Check that token (printable, 16..256 bytes) belongs to host, a host not
 * revoked of an enabled account.  COT_ERR_AUTH (401) when the token is
 * nobody's, COT_ERR_FORBIDDEN (403) when it is another host's, COT_ERR_DB. */
cot_err rdv_auth(int64_t host, const char *token, cot_errbuf *eb);

/* Check that hosts a and b are members of the same group of round (project
 * name, version), or, averaging across groups between the peers, hold a
 * common slice (aggregator ranges that overlap), and that the round is
 * averaging; *project_id is the project's id.  COT_ERR_NOT_FOUND (no such
 * round), COT_ERR_CONFLICT (not averaging), COT_ERR_FORBIDDEN (a not in the
 * round, b neither in a's group nor a holder of a slice with it, a == b). */
cot_err rdv_pair_check(const char *project, int64_t version, int64_t a, int64_t b, int64_t *project_id,
                       cot_errbuf *eb);

/* Park half h of a meeting of kind between h->host and peer in round
 * (project_id, version).  Returns COT_OK and:
 *   - *partner = the oldest half of the other role (taken out of the table:
 *     its fd is now the caller's) when one was waiting: the caller
 *     completes the meeting;
 *   - *partner->fd = -1 when h is parked: the table owns h->fd now.
 * COT_ERR_CONFLICT (409) for a replay: RDV_QUEUE_MAX halves of this role
 * already wait, or the pair has no meetings left this round;
 * COT_ERR_TOO_LARGE when the table is full.  On error h->fd stays the
 * caller's. */
cot_err rdv_park(rdv_kind kind, int64_t project_id, int64_t version, int64_t peer, const rdv_half *h,
                 rdv_half *partner, cot_errbuf *eb);

/* Take out the halves whose wait ran out by now_ms; for each, call
 * expired(fd, host) (which answers and closes it).  Also forgets pairs idle
 * for an hour. */
void rdv_expire(int64_t now_ms, void (*expired)(int fd, int64_t host));

/* Close every parked half (at shutdown) and forget all pairs. */
void rdv_clear(void);

#endif
