/* cotrain: the aggregator side of the all-reduce (see allreduce.c for the
 * threads, the pipelining and the fault rule).
 *
 * We aggregate one range of the vector.  An acceptor thread takes the
 * members' connections, one handler thread each.  A slice connection
 * carries a member's SLICE parts (checked and kept as they come, summed
 * speculatively as soon as every member's part k is in), then our ACCEPTED
 * report, then our RESULT (after the result parts when they are needed) or
 * ABORT.  A stream connection carries the speculatively summed result parts
 * while the slices still arrive.  The caller's thread decides (ar_agg_collect,
 * ar_agg_reduce); the handlers only send what it published. */
#include "shared/averaging/allreduce_internal.h"
#include "shared/averaging/centered_clip.h"
#include "shared/averaging/allreduce_msg.h"

#include "shared/peer/frame.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
	run *r;
	int fd;
	pthread_t th;
	int done; /* the thread is about to return (under r->mu) */
} handler;

/* How long an incoming connection may take to finish TLS and HELLO: a
 * connection that says nothing (a port scan, a half-open handshake) gives
 * its slot back after this. */
#define HANDSHAKE_MS 10000

/* ---- Contributions ---- */

/* Decode and check part [off, off + n) (relative to our range) of member
 * idx's slice into its member_state (mu held; parts come in order, the
 * first with off 0).  A refusal is recorded with its reason and stops the
 * speculative stream; nothing else fails.  The data stays allocated until
 * run_free, so a summing thread may still read it. */
static void take_slice(run *r, size_t idx, size_t off, size_t n, const unsigned char *bytes, size_t len)
{
	const allreduce_params *p = r->p;
	member_state *c = &r->m[idx];
	cot_errbuf eb = { 0 };
	if (off == 0)
		c->state = C_OK;
	if (c->state != C_OK)
		return;
	c->reason[0] = 0;
	if (!c->data && !(c->data = malloc((r->a_len ? r->a_len : 1) * sizeof *c->data))) {
		snprintf(c->reason, sizeof c->reason, "out of memory");
	} else if (comp_decode(p->send_comp, bytes, len, c->data + off, n, &eb)) {
		snprintf(c->reason, sizeof c->reason, "malformed slice: %.120s", eb.msg);
	} else {
		const float *x = c->data + off;
		int zero = 1;
		for (size_t i = 0; i < n && !c->reason[0]; i++) {
			if (!isfinite(x[i]))
				snprintf(c->reason, sizeof c->reason, "value %zu of the slice is not finite",
				         i + off + (size_t)p->members[p->self].start);
			if (x[i] != 0.0f)
				zero = 0;
		}
		if (!c->reason[0] && p->members[idx].samples == 0 && !p->claimed_samples && !zero)
			snprintf(c->reason, sizeof c->reason, "a gradient of 0 samples is not zero");
		if (!c->reason[0] && p->sketch_k) /* what we sum, part by part */
			r->sk_time +=
			        ar_sketch_part(p, x, n, p->members[p->self].start + off, p->send_comp, 0,
			                       r->sk_part + idx * (size_t)p->sketch_k, r->sk_err2 + idx);
	}
	if (c->reason[0]) {
		c->state = C_REFUSED;
		r->spec_ok = 0;
	}
}

cot_err ar_agg_take_own(run *r, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	size_t elen = comp_encoded_size(p->send_comp, r->a_len);
	unsigned char *enc = malloc(elen ? elen : 1);
	if (!enc || comp_encode(p->send_comp, p->grad + p->members[p->self].start, r->a_len, enc, elen, eb)) {
		free(enc);
		return cot_seterr(eb, COT_ERR_NOMEM, "could not encode our own slice");
	}
	pthread_mutex_lock(&r->mu);
	take_slice(r, p->self, 0, r->a_len, enc, elen);
	r->m[p->self].parts_in = r->n_parts;
	pthread_mutex_unlock(&r->mu);
	free(enc);
	return COT_OK;
}

/* Sum, encode and stream what can be (mu held; released while summing):
 * while every member's next part has arrived and passed the checks, sum it
 * over all members in ascending host id order (what agg_finish computes for
 * the full set), encode it into spec_bytes, decode our own copy into out,
 * and wake the stream handlers.  One thread sums at a time (spec_busy). */
static void spec_advance(run *r)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	while (r->spec_ok && !r->spec_busy && r->spec_done < r->n_parts) {
		size_t k = r->spec_done;
		for (size_t i = 0; i < p->n; i++)
			if (r->m[i].state != C_OK || r->m[i].parts_in <= k)
				return;
		r->spec_busy = 1;
		pthread_mutex_unlock(&r->mu);
		size_t off = k * PART_VALUES, n = ar_part_len(r->a_len, k);
		for (size_t j = 0; j < p->n; j++)
			r->spec_x[j] = r->m[r->order[j]].data + off;
		allreduce_sum(r->spec_x, p->n, n, r->spec_tmp);
		ar_test_noise(p, me->start + off, r->spec_tmp, n);
		int ok = 1;
		for (size_t i = 0; i < n && ok; i++)
			ok = isfinite(r->spec_tmp[i]);
		size_t eoff = comp_encoded_size(p->result_comp, off);
		size_t elen = comp_encoded_size(p->result_comp, n);
		ok = ok && !comp_encode(p->result_comp, r->spec_tmp, n, r->spec_bytes + eoff, elen, NULL) &&
		     !comp_decode(p->result_comp, r->spec_bytes + eoff, elen, r->out + me->start + off, n,
		                  NULL);
		if (ok && r->sk_res) /* our result as it streams, part by part, in order */
			r->sk_time_res += ar_sketch_part(p, r->out + me->start + off, n, me->start + off,
			                                 p->result_comp, 0x1p-23, r->sk_res, &r->sk_res_err2);
		pthread_mutex_lock(&r->mu);
		r->spec_busy = 0;
		if (!ok)
			r->spec_ok = 0; /* the final path reports the overflow */
		else if (++r->spec_done == r->n_parts)
			TRACE(r, "all %zu result parts summed", r->n_parts);
		pthread_cond_broadcast(&r->cv);
	}
}

void ar_spec_stop(run *r)
{
	r->spec_ok = 0;
	while (r->spec_busy)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_cond_broadcast(&r->cv);
}

/* ---- The included set ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* A slice still incomplete at the collect deadline fails (mu held). */
static void refuse_incomplete(run *r)
{
	for (size_t i = 0; i < r->p->n; i++) {
		member_state *c = &r->m[i];
		if (c->state == C_OK && c->parts_in < r->n_parts) {
			c->state = C_FAILED;
			snprintf(c->reason, sizeof c->reason,
			         "slice incomplete at the collect deadline (%zu of %zu parts)", c->parts_in,
			         r->n_parts);
		}
	}
}

/* Refuse norm outliers (mu held): the L2 norm per sample of each slice is
 * compared with the lower median over the contributions with samples; with
 * fewer than 3 of them no outlier can be told apart, so none is refused.
 * rate and sorted are scratch of p->n values. */
static void refuse_outliers(run *r, double *rate, double *sorted)
{
	const allreduce_params *p = r->p;
	double factor = p->outlier_factor == 0 ? ALLREDUCE_OUTLIER_DEFAULT : p->outlier_factor;
	size_t k = 0;
	for (size_t i = 0; i < p->n; i++) {
		if (r->m[i].state != C_OK || p->members[i].samples == 0)
			continue;
		double s = 0;
		for (size_t j = 0; j < r->a_len; j++)
			s += (double)r->m[i].data[j] * r->m[i].data[j];
		rate[i] = sqrt(s) / (double)p->members[i].samples;
		sorted[k++] = rate[i];
	}
	if (factor <= 0 || k < 3)
		return;
	qsort(sorted, k, sizeof *sorted, cmp_double);
	double median = sorted[(k - 1) / 2];
	for (size_t i = 0; median > 0 && i < p->n; i++) {
		member_state *c = &r->m[i];
		if (c->state != C_OK || p->members[i].samples == 0 || !(rate[i] > factor * median))
			continue;
		c->state = C_REFUSED;
		snprintf(c->reason, sizeof c->reason,
		         "norm per sample %.3g is %.1f times the median %.3g (limit %.1f)", rate[i],
		         rate[i] / median, median, factor);
	}
}

/* Build our ACCEPTED report from the contributions still C_OK (mu held):
 * ids (p->n, scratch) becomes our own report in r->m[self].rep on COT_OK,
 * *ids is then NULL; the caller frees what is left. */
static cot_err publish_report(run *r, int64_t **ids)
{
	const allreduce_params *p = r->p;
	size_t n_ids = 0;
	for (size_t i = 0; i < p->n; i++)
		if (r->m[i].state == C_OK)
			(*ids)[n_ids++] = p->members[i].host_id;
	if (n_ids < p->n)
		r->spec_ok = 0;
	qsort(*ids, n_ids, sizeof **ids, ar_cmp_i64);

	ar_accepted_msg msg = {
		.round = p->round, .agg = p->members[p->self].host_id, .ids = *ids, .n_ids = n_ids
	};
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	cot_err rc = ar_accepted_encode(&w, &msg);
	if (rc) {
		frame_writer_free(&w);
		return rc;
	}
	r->acc_payload = w.buf;
	r->acc_len = w.len;
	r->m[p->self].rep = *ids;
	r->m[p->self].rep_n = n_ids;
	r->rep_pending--;
	*ids = NULL;
	return COT_OK;
}

/* Stop taking slices (mu held): refuse the incomplete and the outliers, and
 * publish our ACCEPTED report.  COT_ERR_NOMEM (nothing frozen) or the
 * report's encoding error (frozen without a report). */
static cot_err freeze(run *r)
{
	const allreduce_params *p = r->p;
	double *rate = calloc(p->n, sizeof *rate), *sorted = calloc(p->n, sizeof *sorted);
	int64_t *ids = calloc(p->n, sizeof *ids);
	if (!rate || !sorted || !ids) {
		free(rate), free(sorted), free(ids);
		return COT_ERR_NOMEM;
	}
	refuse_incomplete(r);
	refuse_outliers(r, rate, sorted);
	cot_err rc = publish_report(r, &ids);
	r->frozen = 1;
	/* The stage across groups accepts on the same listener: every slice
	 * connection is in (members open no stream connection). */
	if (p->cross)
		r->stop_accept = 1;
	free(ids);
	free(rate);
	free(sorted);
	pthread_cond_broadcast(&r->cv);
	return rc;
}

void ar_agg_collect(run *r)
{
	const allreduce_params *p = r->p;
	while (r->arrived < p->n - 1 && ar_wait(r, p->collect_deadline))
		;
	if (freeze(r))
		ar_agg_abort(r, "out of memory");
	TRACE(r, "%s", "slices frozen");
}

void ar_agg_abort(run *r, const char *reason)
{
	if (r->agg_state == AGG_PENDING) {
		r->agg_state = AGG_ABORT;
		snprintf(r->abort_reason, sizeof r->abort_reason, "%.250s", reason);
	}
	pthread_cond_broadcast(&r->cv);
}

/* ---- Our range's result ---- */

/* Build our RESULT for the included set with empty data ("as streamed" or
 * "as sent in parts") and publish it (mu held). */
static cot_err agg_result(run *r, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	ar_result_msg msg = { .round = p->round,
		              .agg = me->host_id,
		              .start = me->start,
		              .end = me->end,
		              .comp = (uint8_t)p->result_comp,
		              .total = r->total,
		              .ids = r->fin,
		              .n_ids = r->n_fin,
		              .data = NULL,
		              .dlen = 0 };
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	cot_err rc = ar_result_encode(&w, &msg);
	if (rc) {
		frame_writer_free(&w);
		return cot_seterr(eb, rc, "could not build the result of our range");
	}
	r->res_payload = w.buf;
	r->res_len = w.len;
	r->agg_state = AGG_RESULT;
	pthread_cond_broadcast(&r->cv);
	return COT_OK;
}

/* Sum the included contributions (ascending host id), keep its encoding in
 * fin_bytes for the handlers to send in parts, and build our RESULT (empty
 * data: "as sent in parts"); our own copy of the range is decoded from the
 * same bytes (mu held).  Nothing is published on error. */
static cot_err agg_finish(run *r, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	const float **x = calloc(r->n_fin ? r->n_fin : 1, sizeof *x);
	float *sum = malloc(r->a_len * sizeof *sum);
	size_t enc = comp_encoded_size(p->result_comp, r->a_len);
	unsigned char *bytes = malloc(enc ? enc : 1);
	cot_err rc = COT_OK;
	if (!x || !sum || !bytes)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (size_t k = 0; !rc && k < r->n_fin; k++) {
		const member_state *c = &r->m[ar_member_index(p, r->fin[k])];
		if (c->state != C_OK) /* cannot happen: fin is inside our report */
			rc = cot_seterr(eb, COT_ERR_INTERNAL, "included host %lld has no slice",
			                (long long)r->fin[k]);
		x[k] = c->data;
	}
	if (!rc && p->aggregation == ALLREDUCE_CENTERED_CLIP) {
		uint64_t samples[ALLREDUCE_MAX_MEMBERS];
		for (size_t k = 0; k < r->n_fin; k++)
			samples[k] = p->members[ar_member_index(p, r->fin[k])].samples;
		rc = cclip_combine(x, samples, r->n_fin, r->a_len, p->clip_tau, p->clip_iters, sum, eb);
	} else if (!rc && p->aggregation == ALLREDUCE_MEAN) {
		if (r->total == 0)
			rc = cot_seterr(eb, COT_ERR_INVALID, "no samples to average");
		double t = (double)r->total;
		for (size_t i = 0; !rc && i < r->a_len; i++) {
			double acc = 0.0;
			for (size_t k = 0; k < r->n_fin; k++)
				acc += (double)x[k][i];
			sum[i] = (float)(acc / t);
		}
	} else if (!rc) {
		allreduce_sum(x, r->n_fin, r->a_len, sum);
	}
	if (!rc)
		ar_test_noise(p, me->start, sum, r->a_len);
	for (size_t i = 0; !rc && i < r->a_len; i++)
		if (!isfinite(sum[i]))
			rc = cot_seterr(eb, COT_ERR_INVALID, "the sum overflowed at value %llu",
			                (unsigned long long)(me->start + i));
	if (!rc && p->cross) {
		/* The group's sum of our range is what the members' partials add
		 * up to (the server's check); the stage across groups then makes
		 * it the round's mean, which is what we return.  Others wait on
		 * agg_state meanwhile: the lock is not held across the network. */
		if (r->sk_gsum)
			r->sk_time_res += ar_sketch_part(p, sum, r->a_len, me->start, COMP_NONE, 0x1p-23,
			                                 r->sk_gsum, &r->sk_gsum_err2);
		/* Kept for the second seed (out of memory: not kept, and that
		 * check of our range is skipped). */
		if (r->sk_gsum && p->keep_slices && !r->gsum_kept &&
		    (r->gsum_kept = malloc(r->a_len * sizeof *r->gsum_kept)))
			memcpy(r->gsum_kept, sum, r->a_len * sizeof *r->gsum_kept);
		TRACE(r, "%s", "stage across groups");
		pthread_mutex_unlock(&r->mu);
		rc = p->cross(p->cross_arg, sum, me->start, me->end, r->total, eb);
		pthread_mutex_lock(&r->mu);
		TRACE(r, "stage across groups: %s", rc ? eb->msg : "ok");
	}
	if (!rc)
		rc = comp_encode(p->result_comp, sum, r->a_len, bytes, enc, eb);
	if (!rc)
		rc = comp_decode(p->result_comp, bytes, enc, r->out + me->start, r->a_len, eb);
	if (!rc && r->sk_res) { /* not the streamed sum: sketch this one */
		memset(r->sk_res, 0, (size_t)p->sketch_k * sizeof *r->sk_res);
		r->sk_res_err2 = 0;
		r->sk_time_res += ar_sketch_part(p, r->out + me->start, r->a_len, me->start, p->result_comp,
		                                 0x1p-23, r->sk_res, &r->sk_res_err2);
	}
	if (!rc) {
		r->fin_bytes = bytes; /* the handlers send it in parts, then RESULT */
		bytes = NULL;
		rc = agg_result(r, eb);
	}
	free(x);
	free(sum);
	free(bytes);
	return rc;
}

void ar_agg_reduce(run *r)
{
	const allreduce_params *p = r->p;
	cot_errbuf aeb = { 0 };
	/* Every member included: the streamed parts are the result (the last
	 * ones may still be summing), and our own copy is already in out. */
	if (r->n_fin == p->n)
		while (r->spec_ok && r->spec_done < r->n_parts && ar_wait(r, p->deadline))
			;
	int streamed = r->n_fin == p->n && r->spec_ok && r->spec_done == r->n_parts;
	if (!streamed)
		ar_spec_stop(r);
	if (streamed ? agg_result(r, &aeb) : agg_finish(r, &aeb)) {
		ar_agg_abort(r, aeb.msg);
		snprintf(r->feb.msg, sizeof r->feb.msg, "could not reduce our range: %.400s", aeb.msg);
		r->failed = 1;
	}
}

/* ---- Slice connections ---- */

/* Check SLICE payload pl as part k of member idx's slice of our range.
 * 0 with the message in *m (its data points into pl), or -1 with why the
 * connection is unusable in why (why_len bytes). */
static int slice_part_check(run *r, size_t idx, size_t k, const frame_header *h, const unsigned char *pl,
                            ar_slice_msg *m, char *why, size_t why_len)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	cot_errbuf eb = { 0 };
	if (h->type != ALLREDUCE_FRAME_SLICE) {
		snprintf(why, why_len, "sent %s instead of SLICE", frame_type_name(h->type));
		return -1;
	}
	uint64_t want_start = me->start + k * PART_VALUES;
	uint64_t want_end = me->end - want_start > PART_VALUES ? want_start + PART_VALUES : me->end;
	if (ar_slice_decode(pl, h->length, m, &eb)) {
		snprintf(why, why_len, "%.150s", eb.msg);
		return -1;
	}
	if (m->round != p->round || m->from != p->members[idx].host_id || m->start != want_start ||
	    m->end != want_end || m->comp != p->send_comp) {
		snprintf(why, why_len,
		         "SLICE for round %lld, host %lld, range [%llu,%llu), %s does not "
		         "match the group's",
		         (long long)m->round, (long long)m->from, (unsigned long long)m->start,
		         (unsigned long long)m->end, comp_name(m->comp));
		return -1;
	}
	return 0;
}

/* Take checked part k of member idx's slice (mu not held) and sum what can
 * be.  Returns 1 when it came after we froze (it is dropped), else 0. */
static int slice_part_take(run *r, size_t idx, size_t k, const ar_slice_msg *m)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	member_state *c = &r->m[idx];
	pthread_mutex_lock(&r->mu);
	int late = r->frozen;
	if (late) {
		pthread_mutex_unlock(&r->mu);
		return 1;
	}
	if (p->claimed_samples && idx != p->self &&
	    (m->samples == 0 || (c->claimed_samples && m->samples != c->claimed_samples))) {
		c->state = C_REFUSED;
		r->spec_ok = 0;
		snprintf(c->reason, sizeof c->reason, "SLICE claims %llu samples",
		         (unsigned long long)m->samples);
	} else if (p->claimed_samples) {
		c->claimed_samples = m->samples;
		take_slice(r, idx, (size_t)(m->start - me->start), (size_t)(m->end - m->start), m->data,
		           m->dlen);
	} else if (m->samples != p->members[idx].samples) {
		c->state = C_REFUSED;
		r->spec_ok = 0;
		snprintf(c->reason, sizeof c->reason, "SLICE claims %llu samples, the group says %llu",
		         (unsigned long long)m->samples, (unsigned long long)p->members[idx].samples);
	} else {
		take_slice(r, idx, (size_t)(m->start - me->start), (size_t)(m->end - m->start), m->data,
		           m->dlen);
	}
	if (k == 0 || k + 1 == r->n_parts)
		TRACE(r, "slice part %zu of %zu from host %lld", k + 1, r->n_parts,
		      (long long)p->members[idx].host_id);
	c->parts_in = k + 1;
	if (c->state == C_OK)
		spec_advance(r);
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* Member idx is done sending (mu not held): a late or unusable slice
 * fails with its reason; either way it has arrived. */
static void slice_done(run *r, size_t idx, int late, int usable, const char *why)
{
	member_state *c = &r->m[idx];
	pthread_mutex_lock(&r->mu);
	if (late) {
		/* The rest of its parts are unread: the connection cannot carry
		 * ACCEPTED and RESULT any more. */
		c->state = C_FAILED;
		snprintf(c->reason, sizeof c->reason, "slice arrived after the collect deadline");
	} else if (!usable) {
		c->state = C_FAILED;
		r->spec_ok = 0;
		snprintf(c->reason, sizeof c->reason, "%s", why);
	}
	r->arrived++;
	int some = r->arrived < r->p->n - 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (some) /* a test hook: some members' slices are in, not all */
		fault_point("aggregator-mid-sum", r->p->round);
}

/* Read and check member idx's SLICE parts, the first already received (h,
 * pl, or rc with eb when receiving it failed; pl is ours and freed here).
 * Returns 0 when the connection is still usable afterwards, -1 when not (a
 * malformed slice was answered with an ERROR first). */
static int handle_slice(run *r, peer_conn *c, size_t idx, cot_err rc, cot_errbuf *eb, frame_header h,
                        unsigned char *pl)
{
	const allreduce_params *p = r->p;
	char why[160] = "";
	int late = 0;
	for (size_t k = 0; k < r->n_parts; k++) {
		if (k > 0) {
			free(pl);
			pl = NULL;
			rc = peer_recv_frame(c, &h, &pl, p->collect_deadline, eb);
		}
		ar_slice_msg m = { 0 };
		if (rc)
			snprintf(why, sizeof why, "no slice: %.120s", eb->msg);
		else
			slice_part_check(r, idx, k, &h, pl, &m, why, sizeof why);
		if (why[0] || (late = slice_part_take(r, idx, k, &m)))
			break;
	}
	free(pl);
	int usable = !why[0];
	if (!usable && rc == COT_OK)
		peer_send_error(c, FRAME_ERR_PROTOCOL, why, deadline_after_ms(1000));
	slice_done(r, idx, late, usable, why);
	return usable && !late ? 0 : -1;
}

/* Send part k of our range's result, taken from bytes (the result encoding
 * of the whole range), as a RESULT_PART frame on c. */
static cot_err send_part(run *r, peer_conn *c, const unsigned char *bytes, size_t k, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	size_t off = k * PART_VALUES, n = ar_part_len(r->a_len, k);
	ar_part_msg msg = { .round = p->round,
		            .agg = me->host_id,
		            .start = me->start + off,
		            .end = me->start + off + n,
		            .data = bytes + comp_encoded_size(p->result_comp, off),
		            .dlen = comp_encoded_size(p->result_comp, n) };
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	cot_err rc = ar_part_encode(&w, &msg);
	if (!rc)
		rc = peer_send_frame(c, FRAME_RESULT_PART, 0, w.buf, w.len, p->deadline, eb);
	frame_writer_free(&w);
	return rc;
}

/* Send ABORT with our abort reason (best effort). */
static void send_abort(run *r, peer_conn *c, cot_errbuf *eb)
{
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_MIN_MAX);
	frame_error_encode(&w, FRAME_ERR_INTERNAL, r->abort_reason);
	if (!frame_writer_error(&w))
		peer_send_frame(c, ALLREDUCE_FRAME_ABORT, 0, w.buf, w.len, r->p->deadline, eb);
	frame_writer_free(&w);
}

/* Send member idx our RESULT (best effort).  The sum of the included set,
 * when it is not what was streamed, goes in parts before the RESULT (whose
 * data is then empty), so that no range is too large for a frame.  So does
 * the streamed sum to a member whose stream connection did not carry all
 * of it: one that never came (it was still being dialed, or failed, or the
 * member streams nothing), or broke.  A stream still being served is waited
 * for: it has every part to send. */
static void send_result(run *r, peer_conn *c, size_t idx, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	member_state *ms = &r->m[idx];
	const unsigned char *parts = r->fin_bytes;
	if (!parts) {
		pthread_mutex_lock(&r->mu);
		while (ms->claimed_stream && !ms->stream_end && ar_wait(r, p->deadline))
			;
		if (ms->stream_end != 1) {
			parts = r->spec_bytes;
			TRACE(r, "result to host %lld on the slice connection: its stream %s",
			      (long long)p->members[idx].host_id,
			      ms->claimed_stream ? "broke" : "never came");
		}
		pthread_mutex_unlock(&r->mu);
	}
	cot_err rc = COT_OK;
	for (size_t k = 0; parts && !rc && k < r->n_parts; k++)
		rc = send_part(r, c, parts, k, eb);
	if (!rc)
		peer_send_frame(c, ALLREDUCE_FRAME_RESULT, 0, r->res_payload, r->res_len, p->deadline, eb);
}

/* After member idx's slice: ACCEPTED once we froze, then RESULT or ABORT
 * once the included set is known (best effort; c stays the caller's). */
static void answer_slice(run *r, peer_conn *c, size_t idx)
{
	const allreduce_params *p = r->p;
	cot_errbuf eb = { 0 };
	pthread_mutex_lock(&r->mu);
	while (!r->frozen && r->agg_state == AGG_PENDING && ar_wait(r, p->deadline))
		;
	int frozen = r->frozen && r->acc_payload;
	pthread_mutex_unlock(&r->mu);
	if (!frozen) {
		send_abort(r, c, &eb);
		return;
	}
	if (peer_send_frame(c, ALLREDUCE_FRAME_ACCEPTED, 0, r->acc_payload, r->acc_len, p->deadline, &eb))
		return;
	pthread_mutex_lock(&r->mu);
	while (r->agg_state == AGG_PENDING && ar_wait(r, p->deadline))
		;
	if (r->agg_state == AGG_PENDING)
		ar_agg_abort(r, "the aggregator timed out waiting for the included set");
	int state = r->agg_state;
	pthread_mutex_unlock(&r->mu);
	if (state == AGG_RESULT)
		send_result(r, c, idx, &eb);
	else
		send_abort(r, c, &eb);
}

/* ---- Stream connections ---- */

/* Serve member idx's stream connection: send each result part once it is
 * summed, then STREAM_END (1 once every part went out, 0 when the
 * speculation stopped or the deadline came), and record in stream_end
 * whether all of it went out: that decides whether member idx's RESULT may
 * say "as streamed".  The parts are immutable once spec_done has passed
 * them, so they are sent without the lock. */
static void stream_serve(run *r, peer_conn *c, size_t idx)
{
	const allreduce_params *p = r->p;
	size_t sent = 0;
	cot_errbuf eb = { 0 };
	cot_err rc = COT_OK;
	for (;;) {
		pthread_mutex_lock(&r->mu);
		while (sent == r->spec_done && sent < r->n_parts && r->spec_ok &&
		       r->agg_state == AGG_PENDING && ar_wait(r, p->deadline))
			;
		size_t upto = r->spec_done;
		pthread_mutex_unlock(&r->mu);
		if (sent == upto)
			break;
		for (; !rc && sent < upto; sent++)
			rc = send_part(r, c, r->spec_bytes, sent, &eb);
		if (rc)
			break;
	}
	uint8_t complete = !rc && sent == r->n_parts;
	if (!rc)
		rc = peer_send_frame(c, FRAME_STREAM_END, 0, &complete, 1, p->deadline, &eb);
	pthread_mutex_lock(&r->mu);
	r->m[idx].stream_end = !rc && complete ? 1 : 2;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

/* Check member idx's STREAM request (payload pl, len bytes) and serve it;
 * a malformed one is refused and its stream recorded as not served. */
static void stream_request(run *r, peer_conn *c, size_t idx, const unsigned char *pl, size_t len)
{
	const allreduce_params *p = r->p;
	cot_errbuf eb = { 0 };
	ar_stream_msg m;
	if (ar_stream_decode(pl, len, &m, &eb) || m.round != p->round ||
	    m.member != p->members[idx].host_id) {
		peer_send_error(c, FRAME_ERR_PROTOCOL, "malformed STREAM",
		                ar_min64(p->deadline, deadline_after_ms(1000)));
		pthread_mutex_lock(&r->mu);
		r->m[idx].stream_end = 2;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		return;
	}
	stream_serve(r, c, idx);
}

/* ---- Handlers ---- */

/* Open an incoming connection on fd (ours): TLS, identity, HELLO.  0 with
 * *cp open (the caller closes it) and *idxp the member; -1 when it is done
 * (refused and closed).  A member that fails HELLO is dropped now, unless
 * its slice connection is already here: which connection it was is
 * unknown. */
static int handler_open(run *r, int fd, peer_conn **cp, size_t *idxp)
{
	const allreduce_params *p = r->p;
	peer_conn *c = NULL;
	cot_errbuf eb = { 0 };
	ar_tune_socket(fd);
	int64_t hs_deadline = ar_min64(p->collect_deadline, deadline_after_ms(HANDSHAKE_MS));
	if (peer_handshake(p->ctx, fd, PEER_SERVER, 0, hs_deadline, &c, &eb))
		return -1;
	int64_t id = peer_host_id(c);
	int idx = ar_member_index(p, id);
	if (idx < 0 || (size_t)idx == p->self) {
		char reason[128];
		snprintf(reason, sizeof reason, "host %lld is not a member of this averaging group",
		         (long long)id);
		peer_send_error(c, FRAME_ERR_IDENTITY, reason,
		                ar_min64(p->deadline, deadline_after_ms(1000)));
		peer_close(c);
		return -1;
	}
	hello_msg ours = ar_our_hello(p), theirs;
	uint16_t ver;
	cot_err hrc = hello_exchange(c, &ours, &theirs, &ver, hs_deadline, &eb);
	if (hrc) {
		member_state *ms = &r->m[idx];
		pthread_mutex_lock(&r->mu);
		/* Across groups a member dials again when we are in another
		 * stage: its HELLO for another round drops nobody. */
		if (!ms->claimed && !(p->retry_refused && hrc == COT_ERR_CONFLICT)) {
			ms->claimed = 1;
			ms->state = C_FAILED;
			r->spec_ok = 0;
			snprintf(ms->reason, sizeof ms->reason, "HELLO failed: %.120s", eb.msg);
			r->arrived++;
			pthread_cond_broadcast(&r->cv);
		}
		pthread_mutex_unlock(&r->mu);
		peer_close(c);
		return -1;
	}
	*cp = c;
	*idxp = (size_t)idx;
	return 0;
}

/* Claim member idx's stream or slice connection (each kind once per
 * member): 0, or -1 when that kind is already here. */
static int claim(run *r, size_t idx, int stream)
{
	pthread_mutex_lock(&r->mu);
	unsigned char *cl = stream ? &r->m[idx].claimed_stream : &r->m[idx].claimed;
	int dup = *cl;
	*cl = 1;
	pthread_mutex_unlock(&r->mu);
	return dup ? -1 : 0;
}

/* Handler thread (arg: handler *): one incoming connection, which its
 * first message names a stream (STREAM) or the slice one (anything else). */
static void handler_serve(handler *hd)
{
	run *r = hd->r;
	const allreduce_params *p = r->p;
	peer_conn *c = NULL;
	size_t idx;
	if (handler_open(r, hd->fd, &c, &idx))
		return;
	frame_header h = { 0 };
	unsigned char *pl = NULL;
	cot_errbuf eb = { 0 };
	cot_err rc = peer_recv_frame(c, &h, &pl, p->collect_deadline, &eb);
	int stream = !rc && h.type == FRAME_STREAM;
	if (claim(r, idx, stream)) {
		free(pl);
		peer_send_error(c, FRAME_ERR_IDENTITY, "already connected as a member of this group",
		                ar_min64(p->deadline, deadline_after_ms(1000)));
	} else if (stream) {
		stream_request(r, c, idx, pl, h.length);
		free(pl);
	} else if (handle_slice(r, c, idx, rc, &eb, h, pl) == 0) {
		answer_slice(r, c, idx);
	}
	peer_close(c);
}

static void *handler_main(void *arg)
{
	handler *hd = arg;
	handler_serve(hd);
	pthread_mutex_lock(&hd->r->mu);
	hd->done = 1;
	pthread_cond_broadcast(&hd->r->cv);
	pthread_mutex_unlock(&hd->r->mu);
	return NULL;
}

/* Join the handlers that finished and drop them from hs[0..*nh) (mu
 * held; they no longer touch it once done). */
static void reap_handlers(handler **hs, size_t *nh)
{
	size_t k = 0;
	for (size_t i = 0; i < *nh; i++) {
		if (hs[i]->done) {
			pthread_join(hs[i]->th, NULL);
			free(hs[i]);
		} else {
			hs[k++] = hs[i];
		}
	}
	*nh = k;
}

/* At most 2n + 16 connections are handled at once, each with its own
 * thread; a slot comes back as soon as its connection ends, and one that
 * never finishes TLS and HELLO ends within HANDSHAKE_MS.  So connections
 * opened and closed by anyone (a port scan, a flood) cost nothing lasting,
 * and half-open ones hold a slot only that long: members still get in. */
void *ar_acceptor_main(void *arg)
{
	run *r = arg;
	const allreduce_params *p = r->p;
	size_t cap = 2 * p->n + 16, nh = 0;
	handler **hs = calloc(cap, sizeof *hs);
	for (;;) {
		pthread_mutex_lock(&r->mu);
		int stop = r->stop_accept;
		pthread_mutex_unlock(&r->mu);
		if (stop || deadline_left_ms(p->deadline) == 0)
			break;
		int fd = -1;
		cot_errbuf eb = { 0 };
		/* 10 ms: the call's end waits for this loop to see stop_accept */
		if (listener_accept(p->lst, ar_min64(p->deadline, deadline_after_ms(10)), &fd, NULL, &eb))
			continue;
		pthread_mutex_lock(&r->mu);
		reap_handlers(hs, &nh);
		/* Every slot busy: wait a little for one to come back. */
		int64_t until = ar_min64(p->deadline, deadline_after_ms(200));
		while (hs && nh == cap && deadline_left_ms(until) > 0) {
			struct timespec ts; /* r->cv runs on CLOCK_MONOTONIC */
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_nsec += 20 * 1000 * 1000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&r->cv, &r->mu, &ts);
			reap_handlers(hs, &nh);
		}
		pthread_mutex_unlock(&r->mu);
		handler *hd = hs && nh < cap ? calloc(1, sizeof *hd) : NULL;
		if (!hd) { /* more connections at once than a group makes */
			close(fd);
			continue;
		}
		hd->r = r;
		hd->fd = fd;
		if (pthread_create(&hd->th, NULL, handler_main, hd)) {
			free(hd);
			close(fd);
			continue;
		}
		hs[nh++] = hd;
	}
	for (size_t i = 0; i < nh; i++) {
		pthread_join(hs[i]->th, NULL);
		free(hs[i]);
	}
	free(hs);
	return NULL;
}
