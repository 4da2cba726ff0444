/* cotrain: butterfly all-reduce within one averaging group (see allreduce.h
 * and doc/averaging.md).
 *
 * Threads of one call: the caller's thread coordinates; per remote
 * aggregator, one sender thread (dials it, sends our slice in parts, reads its
 * ACCEPTED report and its RESULT) and one streamer thread (a second
 * connection on which the aggregator streams its result parts); when we
 * aggregate, one acceptor thread and one handler thread per incoming
 * connection (slice connections: reads a member's SLICE parts, answers
 * ACCEPTED, then RESULT or ABORT; stream connections: sends result parts as
 * they are ready).  Each connection carries messages one way at a time, so no
 * two threads ever touch one connection.  All shared state sits in struct run
 * under one mutex (allreduce_internal.h); waits are bounded by the call's
 * deadlines.
 *
 * Files: this one is the call, step by step, and the helpers of both sides;
 * allreduce_member.c the sender and streamer threads; allreduce_aggregator.c
 * the acceptor and handler threads and the sums; allreduce_msg.c the
 * messages.
 *
 * Pipelining (speculative results).  Slices travel in parts of PART_VALUES
 * values.  As soon as every member's part k has arrived and passed the checks,
 * the aggregator sums part k over ALL members (ascending host id, double, one
 * rounding: exactly what the final sum over the full set gives), encodes it
 * and streams it to every member while the slices' later parts still arrive.
 * So a member downloads results while it uploads, and the slowest link's
 * upload and download overlap (the bound lb_shares assumes).  The fault rule
 * is unchanged: the final RESULT still comes after the ACCEPTED reports and
 * names the included set; when that set is every member and every part was
 * streamed, its data is empty ("as streamed") and the members use the parts;
 * otherwise the full sum of the included set goes in RESULT_PARTs on the
 * slice connection right before the RESULT (data empty again), and the
 * streamed parts are overwritten: no range is too large for a frame.
 *
 * Pacing.  A member's sender threads advance through their aggregators'
 * ranges at the same fraction (pace_wait), and every connection bounds the
 * kernel's unsent bytes (ar_tune_socket), so that two slow members reach part k
 * of every range at about the same time and each aggregator can stream its
 * results at their upload rate (doc/averaging.md, "Pacing"). */
#include "shared/averaging/allreduce.h"
#include "shared/averaging/allreduce_internal.h"
#include "shared/averaging/centered_clip.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* ---- Helpers of both sides ---- */

int64_t ar_min64(int64_t a, int64_t b) { return a < b ? a : b; }

int ar_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

int ar_wait_on(run *r, pthread_cond_t *cv, int64_t deadline)
{
	int left = deadline_left_ms(deadline);
	if (left <= 0)
		return 0;
	if (left > 100)
		left = 100;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += (long)left * 1000000L;
	ts.tv_sec += ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	pthread_cond_timedwait(cv, &r->mu, &ts);
	return 1;
}

int ar_wait(run *r, int64_t deadline) { return ar_wait_on(r, &r->cv, deadline); }

/* Unsent bytes the kernel may hold per connection (TCP_NOTSENT_LOWAT).
 * Without a bound the socket buffer grows to megabytes per connection, and
 * which connection's bytes go out first is the kernel's choice, not ours:
 * the pacing would only pace copies into buffers.  128 KiB is 5 ms at
 * 200 Mbit/s, plenty for a thread to come back and write more. */
#define NOTSENT_LOWAT (128 * 1024)

void ar_tune_socket(int fd)
{
	int v = NOTSENT_LOWAT;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

uint64_t ar_range_len(const allreduce_member *m) { return m->end - m->start; }

size_t ar_parts_of(const allreduce_params *p, size_t a)
{
	return (size_t)((ar_range_len(&p->members[a]) + PART_VALUES - 1) / PART_VALUES);
}

size_t ar_part_len(size_t len, size_t k)
{
	size_t n = len - k * PART_VALUES;
	return n > PART_VALUES ? PART_VALUES : n;
}

void ar_fail(run *r, const char *fmt, ...)
{
	pthread_mutex_lock(&r->mu);
	if (!r->failed) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->feb.msg, sizeof r->feb.msg, fmt, ap);
		va_end(ap);
		r->failed = 1;
	}
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

int ar_member_index(const allreduce_params *p, int64_t host_id)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->members[i].host_id == host_id)
			return (int)i;
	return -1;
}

hello_msg ar_our_hello(const allreduce_params *p)
{
	hello_msg m = { .proto_min = HELLO_PROTO_MIN,
		        .proto_max = HELLO_PROTO_MAX,
		        .host_id = peer_ctx_host_id(p->ctx),
		        .round = p->round,
		        .max_payload = FRAME_PAYLOAD_HARD_MAX };
	snprintf(m.project, sizeof m.project, "%s", peer_ctx_project(p->ctx));
	return m;
}

void allreduce_sum(const float *const *x, size_t k, size_t len, float *out)
{
	for (size_t i = 0; i < len; i++) {
		double acc = 0.0;
		for (size_t j = 0; j < k; j++)
			acc += (double)x[j][i];
		out[i] = (float)acc;
	}
}

/* ---- Setup and teardown ---- */

static cot_err check_params(const allreduce_params *p, cot_errbuf *eb)
{
	if (!p->members || p->n < 1 || p->n > ALLREDUCE_MAX_MEMBERS || p->self >= p->n || !p->ctx ||
	    (p->n > 1 && !p->dialer) || !p->grad || p->len == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid all-reduce parameters");
	if (!comp_kind_valid(p->send_comp) || !comp_kind_valid(p->result_comp))
		return cot_seterr(eb, COT_ERR_INVALID, "unknown compression");
	if (p->aggregation == ALLREDUCE_CENTERED_CLIP &&
	    (!(p->clip_tau > 0) || !isfinite(p->clip_tau) || p->clip_iters < 1 ||
	     p->clip_iters > CCLIP_ITERS_MAX))
		return cot_seterr(eb, COT_ERR_INVALID, "CenteredClip needs tau > 0 and 1 to %d iterations",
		                  CCLIP_ITERS_MAX);
	if (p->sketch_k < 0 || p->sketch_k > SKETCH_K_MAX || !(p->test_result_noise >= 0))
		return cot_seterr(eb, COT_ERR_INVALID, "a sketch has 0 to %d values", SKETCH_K_MAX);
	if (p->aggregation != ALLREDUCE_SUM && p->aggregation != ALLREDUCE_CENTERED_CLIP &&
	    p->aggregation != ALLREDUCE_MEAN)
		return cot_seterr(eb, COT_ERR_INVALID, "unknown aggregation");
	if (p->members[p->self].host_id != peer_ctx_host_id(p->ctx))
		return cot_seterr(eb, COT_ERR_INVALID, "member %zu is host %lld, not us (host %lld)", p->self,
		                  (long long)p->members[p->self].host_id,
		                  (long long)peer_ctx_host_id(p->ctx));
	uint64_t covered = 0;
	for (size_t i = 0; i < p->n; i++) {
		const allreduce_member *a = &p->members[i];
		if (a->host_id <= 0 || a->start > a->end || a->end > p->len)
			return cot_seterr(eb, COT_ERR_INVALID, "member %zu has a bad host id or range", i);
		if (a->end > a->start && i != p->self && !a->addr)
			return cot_seterr(eb, COT_ERR_INVALID, "aggregator %zu has no address", i);
		for (size_t j = 0; j < i; j++) {
			const allreduce_member *b = &p->members[j];
			if (a->host_id == b->host_id)
				return cot_seterr(eb, COT_ERR_INVALID, "host %lld is listed twice",
				                  (long long)a->host_id);
			if (a->start < b->end && b->start < a->end)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "ranges of members %zu and %zu overlap", j, i);
		}
		covered += ar_range_len(a);
	}
	if (covered != p->len)
		return cot_seterr(eb, COT_ERR_INVALID, "the ranges cover %llu of %zu values",
		                  (unsigned long long)covered, p->len);
	if (ar_range_len(&p->members[p->self]) && p->n > 1 && !p->lst)
		return cot_seterr(eb, COT_ERR_INVALID, "an aggregator needs a listener");
	return COT_OK;
}

/* Set up r for one call with checked parameters p, writing into out: every
 * allocation of the call that does not depend on the exchange happens here.
 * On any outcome r is ready for run_free (and the TRACE macro); on error
 * COT_ERR_NOMEM.  The speculative stream's buffers are optional: without
 * them the aggregator only sends the final sum. */
static cot_err run_init(run *r, const allreduce_params *p, float *out, cot_errbuf *eb)
{
	memset(r, 0, sizeof *r);
	r->p = p;
	r->out = out;
	r->t0 = deadline_now_ms();
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cv, &ca);
	pthread_cond_init(&r->pace_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&r->mu, NULL);
	const allreduce_member *me = &p->members[p->self];
	r->a_len = (size_t)ar_range_len(me);
	r->agg = r->a_len > 0;
	r->n_parts = (r->a_len + PART_VALUES - 1) / PART_VALUES;
	r->m = calloc(p->n, sizeof *r->m);
	r->order = calloc(p->n, sizeof *r->order);
	r->spec_x = calloc(p->n, sizeof *r->spec_x);
	r->fin = calloc(p->n, sizeof *r->fin);
	if (!r->m || !r->order || !r->spec_x || !r->fin)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (p->sketch_k) { /* filled as slices and results arrive (allreduce_sketch.c) */
		r->sk_part = calloc(p->n * (size_t)p->sketch_k, sizeof *r->sk_part);
		r->sk_err2 = calloc(p->n, sizeof *r->sk_err2);
		r->sk_recv = calloc(p->n * (size_t)p->sketch_k, sizeof *r->sk_recv);
		r->sk_res = calloc((size_t)p->sketch_k, sizeof *r->sk_res);
		r->sk_gsum = p->cross ? calloc((size_t)p->sketch_k, sizeof *r->sk_gsum) : NULL;
		if (!r->sk_part || !r->sk_err2 || !r->sk_recv || !r->sk_res || (p->cross && !r->sk_gsum))
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	if (r->agg) {
		r->spec_bytes = malloc(comp_encoded_size(p->result_comp, r->a_len));
		r->spec_tmp = malloc((r->a_len < PART_VALUES ? r->a_len : PART_VALUES) * sizeof *r->spec_tmp);
		/* CenteredClip needs every slice whole, and the mean or the stage
		 * across groups the total: nothing is streamed. */
		r->spec_ok = r->spec_bytes && r->spec_tmp && p->aggregation == ALLREDUCE_SUM && !p->cross;
	}
	for (size_t i = 0; i < p->n; i++) {
		r->m[i].r = r;
		r->m[i].idx = i;
		r->order[i] = i;
		r->rep_pending += ar_range_len(&p->members[i]) > 0;
	}
	for (size_t i = 1; i < p->n; i++) /* insertion sort by host id: n is small */
		for (size_t j = i;
		     j > 0 && p->members[r->order[j]].host_id < p->members[r->order[j - 1]].host_id; j--) {
			size_t t = r->order[j];
			r->order[j] = r->order[j - 1];
			r->order[j - 1] = t;
		}
	return COT_OK;
}

/* Free everything run_init and the exchange allocated in r (the threads
 * have ended). */
static void run_free(run *r)
{
	for (size_t i = 0; r->m && i < r->p->n; i++) {
		free(r->m[i].data);
		free(r->m[i].rep);
		free(r->m[i].rids);
	}
	free(r->m);
	free(r->order);
	free(r->spec_bytes);
	free(r->spec_tmp);
	free(r->spec_x);
	free(r->fin);
	free(r->acc_payload);
	free(r->res_payload);
	free(r->fin_bytes);
	free(r->sk_part);
	free(r->sk_err2);
	free(r->sk_recv);
	free(r->sk_res);
	free(r->sk_gsum);
	free(r->gsum_kept);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	pthread_cond_destroy(&r->pace_cv);
}

/* ---- The steps of the call ---- */

/* When we aggregate: take our own slice, and start the acceptor when there
 * are others to accept.  COT_ERR_NOMEM when either cannot be done. */
static cot_err start_aggregating(run *r, cot_errbuf *eb)
{
	if (!r->agg)
		return COT_OK;
	cot_err rc = ar_agg_take_own(r, eb);
	if (rc)
		return rc;
	if (r->p->n > 1) {
		if (pthread_create(&r->acceptor, NULL, ar_acceptor_main, r))
			return cot_seterr(eb, COT_ERR_NOMEM, "could not start a thread");
		r->have_acceptor = 1;
	}
	return COT_OK;
}

/* Start a sender (and, unless p->no_stream, a streamer) per remote
 * aggregator.  A thread that cannot start fails the run (ar_fail); the
 * threads started are joined by join_threads either way. */
static void start_sending(run *r)
{
	const allreduce_params *p = r->p;
	/* Every sender is paced from the start, connected or not: one that
	 * connects early must not run ahead on its aggregator while the others
	 * still connect, or part 0 to the others queues behind its bytes and
	 * the first results come late (pace_wait). */
	for (size_t i = 0; i < p->n; i++)
		r->m[i].pacing = i != p->self && ar_range_len(&p->members[i]) > 0;
	for (size_t i = 0; i < p->n; i++) {
		member_state *a = &r->m[i];
		if (i == p->self || !ar_range_len(&p->members[i]))
			continue;
		if (pthread_create(&a->sender_th, NULL, ar_sender_main, a)) {
			ar_fail(r, "could not start a thread");
			for (size_t j = i; j < p->n; j++)
				ar_pace_done(r, j, SIZE_MAX);
			break;
		}
		a->have_sender = 1;
		a->have_streamer =
		        !p->no_stream && !pthread_create(&a->streamer_th, NULL, ar_streamer_main, a);
		if (!a->have_streamer) { /* results come on the slice connection */
			pthread_mutex_lock(&r->mu);
			a->st_done = 1;
			pthread_mutex_unlock(&r->mu);
		}
	}
}

/* The intersection of every aggregator's report, ascending, into r->fin
 * (mu held); returns its size. */
static size_t intersect(run *r)
{
	const allreduce_params *p = r->p;
	size_t k = 0;
	for (size_t i = 0; i < p->n; i++) {
		int64_t id = p->members[i].host_id;
		int all = 1;
		for (size_t a = 0; all && a < p->n; a++) {
			if (!ar_range_len(&p->members[a]))
				continue;
			int found = 0;
			for (size_t j = 0; j < r->m[a].rep_n; j++)
				found |= r->m[a].rep[j] == id;
			all = found;
		}
		if (all)
			r->fin[k++] = id;
	}
	qsort(r->fin, k, sizeof *r->fin, ar_cmp_i64);
	return k;
}

/* Agree on the included set: freeze our range (when we aggregate), wait
 * for every aggregator's ACCEPTED report, intersect them, and reduce our
 * range over the result.  Failures are recorded in r (failed, feb) and
 * abort our range; this step itself does not fail. */
static void agree(run *r)
{
	const allreduce_params *p = r->p;
	pthread_mutex_lock(&r->mu);
	if (r->agg)
		ar_agg_collect(r);
	while (r->rep_pending > 0 && !r->failed && ar_wait(r, p->deadline))
		;
	if (r->rep_pending > 0 || r->failed) {
		if (!r->failed) {
			snprintf(r->feb.msg, sizeof r->feb.msg,
			         "timed out waiting for the aggregators' ACCEPTED reports");
			r->failed = 1;
		}
		char why[300];
		snprintf(why, sizeof why, "host %lld could not learn the included set: %.200s",
		         (long long)p->members[p->self].host_id, r->feb.msg);
		if (r->agg)
			ar_agg_abort(r, why);
	} else {
		r->n_fin = intersect(r);
		for (size_t k = 0; k < r->n_fin; k++) {
			size_t i = (size_t)ar_member_index(p, r->fin[k]);
			/* claimed: what each SLICE named (known where we aggregate;
			 * check_agreement takes the RESULTs' total otherwise) */
			r->total += p->claimed_samples && i != p->self ? r->m[i].claimed_samples
			                                               : p->members[i].samples;
		}
		if (r->agg)
			ar_agg_reduce(r);
	}
	pthread_mutex_unlock(&r->mu);
}

/* Wait for every thread of the call: the senders and streamers end by the
 * deadline; the acceptor is told to stop once no member needs it, and
 * aborts our range if it was never decided. */
static void join_threads(run *r)
{
	for (size_t i = 0; r->m && i < r->p->n; i++) {
		if (r->m[i].have_sender)
			pthread_join(r->m[i].sender_th, NULL);
		if (r->m[i].have_streamer)
			pthread_join(r->m[i].streamer_th, NULL);
	}
	if (!r->have_acceptor)
		return;
	pthread_mutex_lock(&r->mu);
	ar_spec_stop(r);
	if (r->agg_state == AGG_PENDING)
		ar_agg_abort(r, "the aggregator failed");
	r->stop_accept = 1;
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->acceptor, NULL);
}

/* Whether the exchange succeeded: no failure recorded, and every RESULT
 * named the set we computed (else the aggregators disagreed and the vector
 * is not one consistent sum).  COT_ERR_NETWORK with the reason otherwise. */
static cot_err check_agreement(run *r, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	if (r->failed)
		return cot_seterr(eb, COT_ERR_NETWORK, "%s", r->feb.msg);
	/* Claimed samples: a member that aggregates nothing learns the total
	 * from the RESULTs, which must all name the same. */
	for (size_t a = 0; p->claimed_samples && !r->agg && a < p->n; a++)
		if (a != p->self && ar_range_len(&p->members[a])) {
			r->total = r->m[a].rtotal;
			break;
		}
	for (size_t a = 0; a < p->n; a++) {
		const member_state *ms = &r->m[a];
		if (a == p->self || !ar_range_len(&p->members[a]))
			continue;
		if (ms->rids_n != r->n_fin || ms->rtotal != r->total ||
		    (r->n_fin && memcmp(ms->rids, r->fin, r->n_fin * sizeof *r->fin)))
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "aggregator host %lld summed another set of contributions",
			                  (long long)p->members[a].host_id);
	}
	return COT_OK;
}

static void set_drop(allreduce_drop *d, const allreduce_member *m, const char *reason)
{
	d->host_id = m->host_id;
	d->samples = m->samples;
	snprintf(d->reason, sizeof d->reason, "%s", reason);
}

/* Fill *res from the agreed set: included (r->fin moves there), dropped
 * (with our own reason when we aggregate), refused.  COT_ERR_NOMEM leaves
 * in *res what the caller frees with allreduce_result_free. */
static cot_err build_result(run *r, allreduce_result *res, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	res->total_samples = r->total;
	res->included = r->fin;
	res->n_included = r->n_fin;
	r->fin = NULL;
	res->dropped = calloc(p->n, sizeof *res->dropped);
	res->refused = calloc(p->n, sizeof *res->refused);
	if (!res->dropped || !res->refused)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < p->n; i++) {
		const allreduce_member *m = &p->members[i];
		const member_state *c = &r->m[i];
		if (!bsearch(&m->host_id, res->included, res->n_included, sizeof(int64_t), ar_cmp_i64)) {
			set_drop(&res->dropped[res->n_dropped++], m,
			         r->agg && c->reason[0] ? c->reason : "not included");
			res->dropped_samples += m->samples;
		}
		if (r->agg && c->state == C_REFUSED)
			set_drop(&res->refused[res->n_refused++], m, c->reason);
	}
	return COT_OK;
}

cot_err allreduce_run(const allreduce_params *p, float *out, allreduce_result *res, cot_errbuf *eb)
{
	memset(res, 0, sizeof *res);
	cot_err rc = check_params(p, eb);
	if (rc)
		return rc;
	run r;
	rc = run_init(&r, p, out, eb);
	if (!rc)
		rc = start_aggregating(&r, eb);
	if (!rc) {
		start_sending(&r);
		agree(&r);
		pthread_mutex_lock(&r.mu);
		int agreed = !r.failed;
		pthread_mutex_unlock(&r.mu);
		if (agreed) /* a test hook: every aggregator accepted our slice */
			fault_point("after-slices", p->round);
	}
	join_threads(&r);
	if (!rc)
		rc = check_agreement(&r, eb);
	if (!rc)
		rc = build_result(&r, res, eb);
	if (!rc && p->sketch_k)
		rc = ar_sketch_result(&r, res, eb);
	if (rc)
		allreduce_result_free(res);
	TRACE(&r, "done: %s", rc ? eb->msg : "ok");
	run_free(&r);
	return rc;
}

void allreduce_result_free(allreduce_result *res)
{
	free(res->included);
	free(res->dropped);
	free(res->refused);
	free(res->agg_partials);
	free(res->agg_errs);
	free(res->agg_result);
	free(res->agg_group_sum);
	free(res->agg_group_sum_values);
	free(res->recv_from);
	free(res->recv_sketches);
	for (size_t i = 0; res->agg_slices && i < res->n_included; i++)
		free(res->agg_slices[i]);
	free(res->agg_slices);
	memset(res, 0, sizeof *res);
}
