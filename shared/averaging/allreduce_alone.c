/* cotrain: the all-reduce of a group of one (allreduce.h, allreduce_alone).
 *
 * Nothing crosses a wire, so nothing is encoded: the group's sum is the
 * member's own vector, bit for bit, as the round's default path has always
 * sent it.  Its sketches are those an all-reduce would give a member that
 * aggregates all of [0, len) and received its own result, with error
 * bounds 0, so that the checks of what was averaged (doc/credit.md, "Tied
 * to the bytes", and the check under the second seed) treat it as any
 * member and any aggregator. */
#include "shared/averaging/allreduce.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/common/sketch.h"

cot_err allreduce_alone(const allreduce_params *p, float *out, allreduce_result *res, cot_errbuf *eb)
{
	memset(res, 0, sizeof *res);
	if (!p->members || p->n != 1 || p->self != 0 || !p->grad || !out || p->len == 0 ||
	    p->members[0].host_id <= 0 || p->members[0].start != 0 || p->members[0].end != p->len ||
	    p->sketch_k < 0 || p->sketch_k > SKETCH_K_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid parameters for a group of one");
	size_t n = p->len, k = (size_t)p->sketch_k;
	memcpy(out, p->grad, n * sizeof *out);
	res->total_samples = p->members[0].samples;
	if (!(res->included = malloc(sizeof *res->included)))
		goto nomem;
	res->included[0] = p->members[0].host_id;
	res->n_included = 1;
	if (!k)
		return COT_OK;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	res->sketch_k = p->sketch_k;
	res->agg_partials = calloc(k, sizeof *res->agg_partials);
	res->agg_errs = calloc(1, sizeof *res->agg_errs);
	res->agg_result = calloc(k, sizeof *res->agg_result);
	res->recv_from = malloc(sizeof *res->recv_from);
	res->recv_sketches = calloc(k, sizeof *res->recv_sketches);
	if (!res->agg_partials || !res->agg_errs || !res->agg_result || !res->recv_from ||
	    !res->recv_sketches)
		goto nomem;
	/* Our slice as "decoded", our result and the result we received: the
	 * same fp32 values. */
	sketch_add(out, n, 0, p->sketch_seed, p->sketch_k, res->agg_partials);
	memcpy(res->agg_result, res->agg_partials, k * sizeof *res->agg_result);
	memcpy(res->recv_sketches, res->agg_partials, k * sizeof *res->recv_sketches);
	res->recv_from[0] = p->members[0].host_id;
	res->n_recv = 1;
	if (p->keep_slices) {
		if (!(res->agg_slices = calloc(1, sizeof *res->agg_slices)) ||
		    !(res->agg_slices[0] = malloc(n * sizeof *res->agg_slices[0])))
			goto nomem;
		memcpy(res->agg_slices[0], out, n * sizeof *res->agg_slices[0]);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	res->sketch_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	return COT_OK;
nomem:
	allreduce_result_free(res);
	return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
}
