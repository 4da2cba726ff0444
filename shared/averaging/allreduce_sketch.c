/* cotrain: the sketches of what an all-reduce averaged (allreduce.h,
 * sketch_k; doc/credit.md, "Tied to the bytes").
 *
 * Computed once the exchange succeeded, on exactly the values the
 * aggregator summed (each member's slice as decoded from the wire) and on
 * the bytes every member decoded (r->out): the server checks that a
 * member's partials over the aggregators add up to the sketch it committed
 * with its report, that an aggregator's result is the sum of its partials,
 * and that every member received what the aggregator says it returned. */
#include "shared/averaging/allreduce_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/common/sketch.h"

cot_err ar_sketch_result(run *r, allreduce_result *res, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	size_t k = (size_t)p->sketch_k, n_inc = res->n_included;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	res->sketch_k = p->sketch_k;
	res->recv_from = calloc(p->n, sizeof *res->recv_from);
	res->recv_sketches = calloc(p->n * k, sizeof *res->recv_sketches);
	if (!res->recv_from || !res->recv_sketches)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
	for (size_t a = 0; a < p->n; a++) {
		const allreduce_member *m = &p->members[a];
		if (m->end == m->start)
			continue;
		res->recv_from[res->n_recv] = m->host_id;
		sketch_add(r->out + m->start, (size_t)(m->end - m->start), m->start, p->sketch_seed,
		           p->sketch_k, res->recv_sketches + res->n_recv * k);
		res->n_recv++;
	}
	if (!r->agg)
		goto done;
	res->agg_partials = calloc(n_inc * k + 1, sizeof *res->agg_partials);
	res->agg_errs = calloc(n_inc + 1, sizeof *res->agg_errs);
	res->agg_result = calloc(k, sizeof *res->agg_result);
	if (!res->agg_partials || !res->agg_errs || !res->agg_result)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the sketches");
	for (size_t i = 0; i < n_inc; i++) {
		const member_state *c = &r->m[ar_member_index(p, res->included[i])];
		sketch_add(c->data, r->a_len, me->start, p->sketch_seed, p->sketch_k,
		           res->agg_partials + i * k);
		res->agg_errs[i] = comp_error_bound(p->send_comp, c->data, r->a_len, 0);
	}
	const float *y = r->out + me->start;
	sketch_add(y, r->a_len, me->start, p->sketch_seed, p->sketch_k, res->agg_result);
	/* The sum rounded to fp32 once (half an ulp, below |y| 2^-23 with the
	 * decoder's own rounding), then the result encoding. */
	res->agg_result_err = comp_error_bound(p->result_comp, y, r->a_len, 0x1p-23);
done:
	clock_gettime(CLOCK_MONOTONIC, &t1);
	res->sketch_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
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
