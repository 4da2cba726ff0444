/* cotrain: the sketches of what an all-reduce averaged (allreduce.h,
 * sketch_k; doc/credit.md, "Tied to the bytes").
 *
 * Taken on exactly the values the aggregator sums (each member's slice as
 * decoded from the wire, part by part as it arrives, in take_slice) and on
 * the bytes every member decoded (r->out: each aggregator's range once its
 * RESULT settled it, in its sender thread; our own range as its parts are
 * summed and decoded, or at once when the final sum is not the streamed
 * one), so that little more than the last part lies on the round's
 * critical path.  The result's error bound: the sum rounded to fp32 once
 * (half an ulp, below |y| 2^-23 with the decoder's own rounding), then the
 * result encoding.  The server checks that a
 * member's partials over the aggregators add up to the sketch it committed
 * with its report, that an aggregator's result is the sum of its partials,
 * and that every member received what the aggregator says it returned. */
#include "shared/averaging/allreduce_internal.h"

#include <math.h>
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

double ar_sketch_part(const allreduce_params *p, const float *x, size_t n, uint64_t first, int kind,
                      double rel, double *row, double *err2)
{
	if (!p->sketch_k || !row)
		return 0;
	double t0 = now_s();
	sketch_add(x, n, first, p->sketch_seed, p->sketch_k, row);
	if (err2) {
		double e = comp_error_bound(kind, x, n, rel);
		*err2 += e * e;
	}
	return now_s() - t0;
}

cot_err ar_sketch_result(run *r, allreduce_result *res, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	size_t k = (size_t)p->sketch_k, n_inc = res->n_included;
	res->sketch_k = p->sketch_k;
	res->sketch_s = r->sk_time + r->sk_time_res;
	for (size_t a = 0; a < p->n; a++)
		res->sketch_s += r->m[a].sk_time;
	res->recv_from = calloc(p->n, sizeof *res->recv_from);
	res->recv_sketches = calloc(p->n * k, sizeof *res->recv_sketches);
	if (!res->recv_from || !res->recv_sketches)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
	if (r->agg) {
		res->agg_partials = calloc(n_inc * k + 1, sizeof *res->agg_partials);
		res->agg_errs = calloc(n_inc + 1, sizeof *res->agg_errs);
		res->agg_result = calloc(k, sizeof *res->agg_result);
		if (!res->agg_partials || !res->agg_errs || !res->agg_result)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
		if (p->keep_slices && !(res->agg_slices = calloc(n_inc + 1, sizeof *res->agg_slices)))
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
		for (size_t i = 0; i < n_inc; i++) {
			size_t idx = (size_t)ar_member_index(p, res->included[i]);
			if (res->agg_slices) { /* the threads are joined: the slice is ours */
				res->agg_slices[i] = r->m[idx].data;
				r->m[idx].data = NULL;
			}
			memcpy(res->agg_partials + i * k, r->sk_part + idx * k,
			       k * sizeof *res->agg_partials);
			res->agg_errs[i] = sqrt(r->sk_err2[idx]);
		}
		/* Our range of the result, as every member decodes it (taken
		 * as it was decoded: the streamed parts or the final sum). */
		memcpy(res->agg_result, r->sk_res, k * sizeof *res->agg_result);
		res->agg_result_err = sqrt(r->sk_res_err2);
		if (r->sk_gsum) {
			if (!(res->agg_group_sum = calloc(k, sizeof *res->agg_group_sum)))
				return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
			memcpy(res->agg_group_sum, r->sk_gsum, k * sizeof *res->agg_group_sum);
			res->agg_group_sum_err = sqrt(r->sk_gsum_err2);
			res->agg_group_sum_values = r->gsum_kept; /* ours now */
			r->gsum_kept = NULL;
		}
	}
	for (size_t a = 0; a < p->n; a++) {
		if (p->members[a].end == p->members[a].start)
			continue;
		res->recv_from[res->n_recv] = p->members[a].host_id;
		/* Ours is our result: the same bytes. */
		memcpy(res->recv_sketches + res->n_recv * k,
		       a == p->self ? res->agg_result : r->sk_recv + a * k, k * sizeof *res->recv_sketches);
		res->n_recv++;
	}
	return COT_OK;
}

void ar_test_noise(const allreduce_params *p, uint64_t first, float *x, size_t n)
{
	if (!(p->test_result_noise > 0))
		return;
	for (size_t i = 0; i < n; i++) {
		double s = (sketch_mix64(first + i) & 1) ? -1.0 : 1.0;
		x[i] = (float)(x[i] + s * p->test_result_noise * fabs((double)x[i]));
	}
}
