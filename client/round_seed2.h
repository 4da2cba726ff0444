/* cotrain client: what a round's peer keeps for the check under a second
 * seed, and its sketches once the seed comes (doc/credit.md, "A second
 * seed, drawn after the bytes are pinned").
 *
 * The seed of the sketches committed with the reports and checked before
 * the commit is known before any byte is sent; the second is drawn by the
 * server when the round commits and comes with the outcome.  Until then a
 * peer keeps, from the round: its gradient blocks (client/compute.h,
 * cl_block), the group's sum as it received it (every aggregator's result,
 * its own too), and, as an aggregator, each included member's slice of its
 * range as it decoded it.  Then it sends their sketches under the second
 * seed (POST .../rounds/{v}/seed2) and drops them. */
#ifndef CL_ROUND_SEED2_H
#define CL_ROUND_SEED2_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "client/compute.h"
#include "client/round.h"

typedef struct {
	int k;           /* values per sketch (the round's) */
	size_t n;        /* parameters */
	float *received; /* n: the group's sum as received; NULL: nothing kept */
	size_t n_aggs;   /* aggregators of the group (non-empty ranges) */
	int64_t agg_id[CL_PLAN_MAX_MEMBERS];
	uint64_t agg_lo[CL_PLAN_MAX_MEMBERS], agg_hi[CL_PLAN_MAX_MEMBERS];
	/* as an aggregator of [lo, hi): each included member's slice */
	uint64_t lo, hi;
	size_t n_slices;
	int64_t *slice_host;
	float **slices;    /* hi - lo values each, as decoded */
	double *slice_err; /* the bound on each one's encoding error */
	double result_err; /* the bound on our result's */
	/* across groups between the peers (our result is the round's mean):
	 * our range of the group's sum before that stage, and its bound;
	 * NULL otherwise */
	float *group_sum;
	double group_sum_err;
	/* as a member: the gradient blocks, sent only when they hold every
	 * microbatch reported (blocks_ok) */
	cl_block *blocks;
	size_t n_blocks;
	int blocks_ok;
	/* what the outcome is asked again with, until it names the seed */
	int64_t *included;
	size_t n_included;
	char params_sha[65];
} cl_seed2_kept;

/* The sketches under seed2 of what kp keeps, as the body's "sketches":
 * {"k", "blocks": [{"first", "count", "sketch"}] (when blocks_ok),
 * "received": [{"aggregator", "sketch"}], "aggregated": {"members":
 * [{"host_id", "sketch", "err"}], "result", "result_err", and across
 * groups between the peers "group_sum", "group_sum_err"} (as an
 * aggregator)}.  A new reference, or NULL when memory ran out. */
json_t *cl_seed2_sketches_json(const cl_seed2_kept *kp, uint64_t seed2);

/* Free what kp holds and clear it. */
void cl_seed2_kept_free(cl_seed2_kept *kp);

#endif
