/* cotrain: the stage of a round's averaging across groups, peer to peer
 * (doc/averaging.md, "Across groups").
 *
 * The server plans one global partition of the vector into slices: every
 * boundary of every group's aggregator ranges, so that each slice lies
 * inside exactly one aggregator's range in every group (its holders, one
 * per group).  Within each group the reduce-scatter runs as before
 * (allreduce.h); then each aggregator, once it holds its group's sum of its
 * range, takes part, slice by slice in ascending order, in an all-reduce of
 * the slice among its holders (allreduce_run with ALLREDUCE_MEAN: the same
 * connections, dialer ladder, checks and compression), which gives every
 * holder the round's mean of the slice:
 *
 *     mean[i] = (float)((sum over groups, ascending holder host id, of
 *                        (double)group_sum_g[i]) / (double)total)
 *
 * with total the included samples of every group, each holder's SLICE
 * naming its group's.  One aggregator computes each value and every holder
 * decodes the same bytes, so the mean is identical at every peer of every
 * group; each aggregator then returns it to its group as its result.  Every
 * group must be in every slice: a holder that fails or is refused fails
 * the stage for its slice, its aggregator aborts its range, and the round
 * fails and reruns as when any aggregator fails.  Slices are reduced in
 * ascending order by everyone, so the holders of the lowest slice not done
 * are always all at it: no wait cycle. */
#ifndef COT_CROSS_GROUP_H
#define COT_CROSS_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "shared/averaging/allreduce.h"

#define CROSS_MAX_SLICES 4096

typedef struct {
	int64_t host_id;
	char addr[DIALER_ADDR_MAX]; /* numeric address of its listener */
	uint16_t port;
	uint64_t lo, hi; /* the part of the slice it aggregates (absolute; may be empty) */
} cross_holder;

typedef struct {
	int64_t index;               /* the slice's index in the round's partition */
	uint64_t lo, hi;             /* the slice of the vector */
	size_t n;                    /* its holders, one per group (1..ALLREDUCE_MAX_MEMBERS) */
	const cross_holder *holders; /* n, the caller's */
	size_t self;                 /* our index in holders */
} cross_slice;

typedef struct {
	const cross_slice *slices; /* the slices of our range, ascending, tiling it */
	size_t n_slices;
	int64_t round; /* the model version */
	int comp;      /* comp_kind of slices and results, as within the group */
	peer_ctx *ctx;
	dialer *dialer;
	listener *lst;
	int64_t collect_deadline; /* every slice's contributions by then */
	int64_t deadline;         /* the whole stage by then */
	uint64_t total;           /* out: the samples of every group, once done */
} cross_group_params;

/* The HELLO round of slice index of round version: distinct from the
 * group's (version itself) and from every other slice's. */
int64_t cross_group_round(int64_t version, int64_t index);

/* allreduce_cross_fn over arg, a cross_group_params *: run the stage for
 * sum[0..end - start), our group's sum of [start, end), which the slices
 * must tile exactly, over group_samples samples; on COT_OK sum holds the
 * round's mean and p->total the round's samples.  COT_ERR_INVALID when the
 * slices do not tile the range; COT_ERR_NETWORK when a slice could not be
 * reduced over every group (eb names the slice and why); COT_ERR_NOMEM. */
cot_err cross_group_reduce(void *arg, float *sum, uint64_t start, uint64_t end, uint64_t group_samples,
                           cot_errbuf *eb);

/* How many of a group's included hosts post the hash of the round's mean
 * they hold (POST .../mean_hash, doc/api.md): the lowest host ids of the
 * group's included set.  The server keeps the first per group and needs
 * one; two, so that one of them dying after the stage does not fail the
 * round.  Not every member: at the end of the stage every group holds the
 * mean at about the same moment, and a thousand members' posts at once
 * were what was left of the server's p99 (doc/scale.md, "Runs M").  The
 * others' v+1 still reaches the server with their outcome. */
#define CROSS_MEAN_HASH_POSTERS 2

/* Does host post its group's mean hash: is it among the first
 * CROSS_MEAN_HASH_POSTERS of included (n ascending host ids)?  (Inline:
 * tests/bench/simhosts follows the same rule without the averaging code.) */
static inline int cross_posts_mean_hash(const int64_t *included, size_t n, int64_t host)
{
	for (size_t k = 0; k < n && k < CROSS_MEAN_HASH_POSTERS; k++)
		if (included[k] == host)
			return 1;
	return 0;
}

#endif
