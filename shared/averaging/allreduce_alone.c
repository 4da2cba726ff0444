/* cotrain: the all-reduce of a group of one (allreduce.h, allreduce_alone).
 *
 * Nothing crosses a wire within the group, so nothing is encoded: the
 * group's sum is the member's own vector, bit for bit, as the round's
 * default path has always sent it (with p->cross it then goes to the stage
 * across groups, which makes it the round's mean).  Its sketches are those
 * an all-reduce would give a member that aggregates all of [0, len) and
 * received its own result, with error bounds 0, so that the checks of what
 * was averaged (doc/credit.md, "Tied to the bytes", and the check under the
 * second seed) treat it as any member and any aggregator. */
#include "shared/averaging/allreduce.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/common/sketch.h"

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A copy of x[0..n), NULL when out of memory. */
static float *copy_of(const float *x, size_t n)
{
	float *c = malloc(n * sizeof *c);
	if (c)
		memcpy(c, x, n * sizeof *c);
	return c;
}

cot_err allreduce_alone(const allreduce_params *p, float *out, allreduce_result *res, cot_errbuf *eb)
{
	memset(res, 0, sizeof *res);
	if (!p->members || p->n != 1 || p->self != 0 || !p->grad || !out || p->len == 0 ||
	    p->members[0].host_id <= 0 || p->members[0].start != 0 || p->members[0].end != p->len ||
	    p->sketch_k < 0 || p->sketch_k > SKETCH_K_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid parameters for a group of one");
	size_t n = p->len, k = (size_t)p->sketch_k;
	cot_err rc = COT_OK;
	double t0 = now_s(), sketched = 0;
	memcpy(out, p->grad, n * sizeof *out);
	res->total_samples = p->members[0].samples;
	if (!(res->included = malloc(sizeof *res->included)))
		goto nomem;
	res->included[0] = p->members[0].host_id;
	res->n_included = 1;
	if (k) {
		res->sketch_k = p->sketch_k;
		res->agg_partials = calloc(k, sizeof *res->agg_partials);
		res->agg_errs = calloc(1, sizeof *res->agg_errs);
		res->agg_result = calloc(k, sizeof *res->agg_result);
		res->recv_from = malloc(sizeof *res->recv_from);
		res->recv_sketches = calloc(k, sizeof *res->recv_sketches);
		if (!res->agg_partials || !res->agg_errs || !res->agg_result || !res->recv_from ||
		    !res->recv_sketches)
			goto nomem;
		/* Our slice as "decoded": the group's sum. */
		sketch_add(out, n, 0, p->sketch_seed, p->sketch_k, res->agg_partials);
		res->recv_from[0] = p->members[0].host_id;
		res->n_recv = 1;
		if (p->keep_slices) {
			if (!(res->agg_slices = calloc(1, sizeof *res->agg_slices)) ||
			    !(res->agg_slices[0] = copy_of(out, n)))
				goto nomem;
		}
		if (p->cross) { /* the group's sum, before the stage makes it the mean */
			if (!(res->agg_group_sum = malloc(k * sizeof *res->agg_group_sum)) ||
			    (p->keep_slices && !(res->agg_group_sum_values = copy_of(out, n))))
				goto nomem;
			memcpy(res->agg_group_sum, res->agg_partials, k * sizeof *res->agg_group_sum);
		}
	}
	sketched = now_s() - t0;
	if (p->cross && (rc = p->cross(p->cross_arg, out, 0, n, res->total_samples, eb)))
		goto fail;
	if (k) {
		/* Our result, and the result we received: the same values (after
		 * the stage across groups, the round's mean as it came). */
		t0 = now_s();
		if (p->cross)
			sketch_add(out, n, 0, p->sketch_seed, p->sketch_k, res->agg_result);
		else
			memcpy(res->agg_result, res->agg_partials, k * sizeof *res->agg_result);
		memcpy(res->recv_sketches, res->agg_result, k * sizeof *res->recv_sketches);
		res->sketch_s = sketched + now_s() - t0;
	}
	return COT_OK;
nomem:
	rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
fail:
	allreduce_result_free(res);
	return rc;
}
