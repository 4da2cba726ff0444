/* cotrain: DeDLOC's load balancing of an all-reduce within one group.
 *
 * Peer i aggregates the fraction w_i of the gradient vector (V values).  As
 * a sender it uploads V(1 - w_i); as an aggregator it receives V(n-1)w_i, so
 * its transfer time is V(1 + (n-2)w_i)/b_i with b_i its bandwidth.  We
 * minimise the slowest peer's time subject to sum w = 1, w >= 0, and w_i = 0
 * for peers that cannot accept connections.
 *
 * Closed form (no LP solver): sort the peers that can aggregate by bandwidth,
 * descending; for the k fastest, xi = (n - 2 + k) / sum of their b, and
 * w_i = (xi b_i - 1)/(n - 2); take the largest k for which every w_i > 0.
 * Equal bandwidths give 1/n each (butterfly all-reduce); one dominant peer
 * takes everything (a parameter server); otherwise a hybrid.  The optimum is
 * max(xi, 1/b_j for the peers outside the active set): every peer still
 * sends its own vector.  With n = 2 the times do not depend on w (each
 * peer's traffic is V either way) and we split in proportion to bandwidth.
 */
#ifndef COT_LOAD_BALANCE_H
#define COT_LOAD_BALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

typedef struct {
	double bandwidth;   /* bytes per second, > 0 */
	bool can_aggregate; /* accepts incoming connections */
} lb_peer;

/* Shares w[0..n) of the n peers (in input order, summing to 1).  Fails with
 * COT_ERR_INVALID when n < 1, a bandwidth is not a positive finite number,
 * or no peer can aggregate.  *time_per_value (when not NULL) receives the
 * slowest peer's transfer time per vector element, max_i (1+(n-2)w_i)/b_i. */
cot_err lb_shares(const lb_peer *peers, int n, double *w, double *time_per_value, cot_errbuf *eb);

/* Turn shares into contiguous element ranges of a vector of `len` values:
 * peer i aggregates [start[i], start[i+1]); start has n+1 entries, start[0]
 * = 0, start[n] = len.  Rounding by largest remainder, ties to the lower
 * index, so every peer computes the same split from the same shares. */
void lb_split(const double *w, int n, uint64_t len, uint64_t *start);

#endif
