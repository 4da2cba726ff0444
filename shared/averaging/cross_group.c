/* cotrain: the stage across groups (see cross_group.h). */
#include "shared/averaging/cross_group.h"

#include <stdlib.h>
#include <string.h>

#include "shared/common/fault.h"
#include "shared/common/log.h"

int64_t cross_group_round(int64_t version, int64_t index) { return version + ((index + 1) << 32); }

/* One slice: the all-reduce among its holders into out[0..hi - lo). */
static cot_err reduce_slice(const cross_group_params *p, const cross_slice *s, const float *x,
                            uint64_t group_samples, float *out, uint64_t *total, cot_errbuf *eb)
{
	allreduce_member mem[ALLREDUCE_MAX_MEMBERS];
	for (size_t k = 0; k < s->n; k++) {
		const cross_holder *h = &s->holders[k];
		/* The others' samples come with their SLICEs (claimed_samples). */
		mem[k] = (allreduce_member){ .host_id = h->host_id,
			                     .addr = h->addr,
			                     .port = h->port,
			                     .start = h->lo - s->lo,
			                     .end = h->hi - s->lo,
			                     .samples = k == s->self ? group_samples : 0 };
	}
	allreduce_params ap = { .members = mem,
		                .n = s->n,
		                .self = s->self,
		                .round = cross_group_round(p->round, s->index),
		                .grad = x,
		                .len = (size_t)(s->hi - s->lo),
		                .send_comp = p->comp,
		                .result_comp = p->comp,
		                .outlier_factor = -1, /* group sums: every group or none */
		                .ctx = p->ctx,
		                .dialer = p->dialer,
		                .lst = p->lst,
		                .collect_deadline = p->collect_deadline,
		                .deadline = p->deadline,
		                .aggregation = ALLREDUCE_MEAN,
		                .no_stream = 1,
		                .claimed_samples = 1,
		                .retry_refused = 1 };
	allreduce_result res;
	cot_err rc = allreduce_run(&ap, out, &res, eb);
	if (rc)
		return rc;
	if (res.n_included != s->n) {
		rc = cot_seterr(eb, COT_ERR_NETWORK, "%zu of the %zu groups were left out of slice %lld: %s",
		                s->n - res.n_included, s->n, (long long)s->index,
		                res.n_dropped ? res.dropped[0].reason : "not included");
	}
	*total = res.total_samples;
	allreduce_result_free(&res);
	return rc;
}

cot_err cross_group_reduce(void *arg, float *sum, uint64_t start, uint64_t end, uint64_t group_samples,
                           cot_errbuf *eb)
{
	cross_group_params *p = arg;
	uint64_t at = start;
	for (size_t i = 0; i < p->n_slices; i++) {
		const cross_slice *s = &p->slices[i];
		if (s->lo != at || s->hi <= s->lo || s->self >= s->n)
			break;
		at = s->hi;
	}
	if (at != end || p->n_slices == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "the slices across groups do not tile [%llu, %llu)",
		                  (unsigned long long)start, (unsigned long long)end);
	fault_point("cross-stage", p->round); /* a test hook: our group waits on us */
	float *out = malloc((size_t)(end - start) * sizeof *out);
	if (!out)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the stage across groups");
	cot_err rc = COT_OK;
	uint64_t total = 0;
	for (size_t i = 0; !rc && i < p->n_slices; i++) {
		const cross_slice *s = &p->slices[i];
		uint64_t t = 0;
		rc = reduce_slice(p, s, sum + (s->lo - start), group_samples, out + (s->lo - start), &t, eb);
		/* Every slice holds every group: the same total in each. */
		if (!rc && i > 0 && t != total)
			rc = cot_seterr(eb, COT_ERR_NETWORK,
			                "slice %lld averaged %llu samples, slice %lld %llu",
			                (long long)s->index, (unsigned long long)t,
			                (long long)p->slices[0].index, (unsigned long long)total);
		total = t;
		if (!rc)
			log_debug("round %lld: slice %lld [%llu, %llu) averaged across %zu groups (%llu "
			          "samples)",
			          (long long)p->round, (long long)s->index, (unsigned long long)s->lo,
			          (unsigned long long)s->hi, s->n, (unsigned long long)t);
	}
	if (!rc) {
		memcpy(sum, out, (size_t)(end - start) * sizeof *out);
		p->total = total;
	}
	free(out);
	return rc;
}
