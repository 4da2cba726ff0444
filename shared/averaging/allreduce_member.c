/* cotrain: the member side of the all-reduce (see allreduce.c for the
 * threads, the pipelining and the fault rule).
 *
 * Per remote aggregator, one sender thread runs the slice connection in
 * named steps (connect, send our slice, receive its ACCEPTED report,
 * receive its RESULT and result parts), and one streamer thread runs a
 * second connection on which the aggregator streams its result parts while
 * we still upload.  A sender that fails fails the whole run (ar_fail) with
 * the step it was at; a streamer only records what arrived.
 *
 * Pacing.  A member's sender threads advance through their aggregators'
 * ranges at the same fraction (pace_wait), and every connection bounds the
 * kernel's unsent bytes (ar_tune_socket), so that two slow members reach
 * part k of every range at about the same time and each aggregator can
 * stream its results at their upload rate (doc/averaging.md, "Pacing"). */
#include "shared/averaging/allreduce_internal.h"
#include "shared/averaging/allreduce_msg.h"

#include "shared/peer/frame.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- Pacing ---- */

/* Pacing of our slice over the aggregators (mu not held).  An aggregator
 * streams part k of its result once EVERY member's part k has arrived, so a
 * slow member's download waits on its own upload to each aggregator.  Left
 * to TCP, the connections of one uplink share it unevenly, two slow members
 * reach part k of a range at different times, and results come late and in
 * bursts.  So our sender threads advance through their ranges at the same
 * fraction: part k of aggregator a's n parts goes out only when k / n is at
 * most (j + 1) / m for every other aggregator still sending (its next part
 * j of m).  The sender furthest behind may always send, so this never
 * deadlocks.  A sender still connecting counts as at part 0 (allreduce_run
 * sets pacing for every aggregator before the threads start), so that the
 * first connected one does not fill the uplink's queues before the others
 * sent their part 0; a sender that stopped (done or failed) holds no one
 * back. */
static void pace_wait(run *r, size_t a, size_t k)
{
	const allreduce_params *p = r->p;
	double mine = (double)k / (double)ar_parts_of(p, a);
	pthread_mutex_lock(&r->mu);
	r->m[a].pace_next = k;
	r->m[a].pacing = 1;
	for (;;) {
		int ok = 1;
		for (size_t b = 0; ok && b < p->n; b++)
			if (b != a && r->m[b].pacing &&
			    mine > (double)(r->m[b].pace_next + 1) / (double)ar_parts_of(p, b))
				ok = 0;
		if (ok || r->failed || !ar_wait_on(r, &r->pace_cv, p->collect_deadline))
			break;
	}
	pthread_mutex_unlock(&r->mu);
}

void ar_pace_done(run *r, size_t a, size_t next)
{
	pthread_mutex_lock(&r->mu);
	if (next == SIZE_MAX)
		r->m[a].pacing = 0;
	else
		r->m[a].pace_next = next;
	pthread_cond_broadcast(&r->pace_cv);
	pthread_mutex_unlock(&r->mu);
}

/* ---- Helpers of both connections ---- */

/* Prefix the detail in eb with the step that failed ("could not <step>: ")
 * and return rc unchanged; COT_OK passes through. */
static cot_err in_step(cot_err rc, const char *step, cot_errbuf *eb)
{
	if (rc) {
		char msg[sizeof eb->msg];
		memcpy(msg, eb->msg, sizeof msg);
		msg[sizeof msg - 1] = 0;
		int n = snprintf(eb->msg, sizeof eb->msg, "could not %s: ", step);
		if (n > 0 && (size_t)n < sizeof eb->msg)
			snprintf(eb->msg + n, sizeof eb->msg - (size_t)n, "%s", msg);
	}
	return rc;
}

/* Dial aggregator a and open a peer connection to it (TLS, HELLO) by the
 * collect deadline.  COT_OK with *cp open (the caller closes it).  With
 * if_wanted, a connection the sender no longer wants (st_abandon) is closed
 * at once and COT_ERR_NETWORK returned. */
static cot_err connect_agg_once(run *r, member_state *a, int if_wanted, peer_conn **cp, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[a->idx];
	dialer_target t = { m->addr, m->port, m->host_id };
	dialer_result dr;
	cot_err rc = dialer_connect(p->dialer, &t, p->collect_deadline, &dr, eb);
	if (rc)
		return rc;
	if (if_wanted) {
		pthread_mutex_lock(&r->mu);
		int abandoned = a->st_abandon;
		pthread_mutex_unlock(&r->mu);
		if (abandoned) { /* too late: the result came on the slice connection */
			close(dr.fd);
			return COT_ERR_NETWORK;
		}
	}
	ar_tune_socket(dr.fd);
	rc = peer_handshake(p->ctx, dr.fd, PEER_CLIENT, m->host_id, p->collect_deadline, cp, eb);
	if (rc)
		return rc;
	hello_msg ours = ar_our_hello(p), theirs;
	uint16_t ver;
	rc = hello_exchange(*cp, &ours, &theirs, &ver, p->collect_deadline, eb);
	if (rc) {
		peer_close(*cp);
		*cp = NULL;
	}
	return rc;
}

/* connect_agg_once, and with p->retry_refused again until the collect
 * deadline, after 50 ms, then twice as long each time up to 1 s: in the
 * stage across groups an aggregator may still be in an earlier stage,
 * whose acceptor on the same listener refuses us (or not be accepting
 * yet).  Each try through the NAT service is a meeting, of which a pair
 * has 16 a round (doc/nat.md): hence the backoff. */
static cot_err connect_agg(run *r, member_state *a, int if_wanted, peer_conn **cp, cot_errbuf *eb)
{
	long wait_ms = 50;
	for (;;) {
		cot_err rc = connect_agg_once(r, a, if_wanted, cp, eb);
		if (!rc || !r->p->retry_refused || deadline_left_ms(r->p->collect_deadline) < wait_ms + 50)
			return rc;
		TRACE(r, "host %lld not ready for us (%s); again in %ld ms",
		      (long long)r->p->members[a->idx].host_id, eb->msg, wait_ms);
		struct timespec ts = { wait_ms / 1000, (wait_ms % 1000) * 1000 * 1000 };
		nanosleep(&ts, NULL);
		wait_ms = wait_ms * 2 > 1000 ? 1000 : wait_ms * 2;
	}
}

/* Check RESULT_PART payload pl (len bytes) as part k of aggregator a's
 * range and decode it into out.  COT_ERR_NETWORK when it is not that part,
 * is malformed, or holds a value that is not finite. */
static cot_err take_result_part(run *r, size_t a, size_t k, const unsigned char *pl, uint32_t len,
                                cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[a];
	uint64_t want = m->start + (uint64_t)k * PART_VALUES;
	if (want >= m->end)
		return cot_seterr(eb, COT_ERR_NETWORK, "more result parts than its range has");
	uint64_t want_end = m->end - want > PART_VALUES ? want + PART_VALUES : m->end;
	ar_part_msg msg;
	if (ar_part_decode(pl, len, &msg, eb) || msg.round != p->round || msg.agg != m->host_id ||
	    msg.start != want || msg.end != want_end)
		return cot_seterr(eb, COT_ERR_NETWORK, "malformed RESULT_PART");
	if (comp_decode(p->result_comp, msg.data, msg.dlen, r->out + msg.start, (size_t)(msg.end - msg.start),
	                eb))
		return COT_ERR_NETWORK;
	for (uint64_t i = msg.start; i < msg.end; i++)
		if (!isfinite(r->out[i]))
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "a result part holds a value that is not finite");
	return COT_OK;
}

/* ---- The slice connection (sender thread) ---- */

/* Receive the next message from an aggregator, of type want or want2 (its
 * type in *type); an ABORT or ERROR becomes the failure it reports.  *pl is
 * the caller's to free, whatever the outcome. */
static cot_err recv_from_agg(run *r, peer_conn *c, uint8_t want, uint8_t want2, uint8_t *type,
                             unsigned char **pl, uint32_t *len, cot_errbuf *eb)
{
	frame_header h;
	cot_err rc = peer_recv_frame(c, &h, pl, r->p->deadline, eb);
	if (rc)
		return rc;
	*len = h.length;
	*type = h.type;
	if (h.type == want || h.type == want2)
		return COT_OK;
	if (h.type == ALLREDUCE_FRAME_ABORT || h.type == FRAME_ERROR) {
		uint16_t code;
		char reason[FRAME_REASON_MAX + 1];
		if (frame_error_decode(*pl, h.length, &code, reason, eb) == COT_OK)
			cot_seterr(eb, COT_ERR_NETWORK, "%s: %s",
			           h.type == FRAME_ERROR ? "refused" : "aborted", reason);
		return COT_ERR_NETWORK;
	}
	return cot_seterr(eb, COT_ERR_NETWORK, "sent %s out of order", frame_type_name(h.type));
}

/* Whether every one of n ids is a member of the group. */
static int all_members(const allreduce_params *p, const int64_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ar_member_index(p, ids[i]) < 0)
			return 0;
	return 1;
}

/* From now on the streamer for aggregator a decodes nothing more into out
 * (it may still be dialing or reading); returns once it is not in the
 * middle of a part, or COT_ERR_TIMEOUT at the deadline. */
static cot_err streamer_stop(run *r, member_state *a, cot_errbuf *eb)
{
	pthread_mutex_lock(&r->mu);
	a->st_abandon = 1;
	while (a->st_busy && ar_wait(r, r->p->deadline))
		;
	int busy = a->st_busy;
	pthread_mutex_unlock(&r->mu);
	return busy ? cot_seterr(eb, COT_ERR_TIMEOUT, "its result stream did not stop") : COT_OK;
}

/* Send our slice of aggregator a's range in parts, paced (pace_wait). */
static cot_err send_slice(run *r, member_state *a, peer_conn *c, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[a->idx];
	const allreduce_member *me = &p->members[p->self];
	size_t n = (size_t)ar_range_len(m);
	unsigned char *enc = malloc(comp_encoded_size(p->send_comp, n < PART_VALUES ? n : PART_VALUES));
	if (!enc)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	cot_err rc = COT_OK;
	size_t k = 0;
	for (uint64_t ps = m->start; !rc && ps < m->end; ps += PART_VALUES, k++) {
		uint64_t pe = m->end - ps > PART_VALUES ? ps + PART_VALUES : m->end;
		pace_wait(r, a->idx, k);
		size_t elen = comp_encoded_size(p->send_comp, (size_t)(pe - ps));
		rc = comp_encode(p->send_comp, p->grad + ps, (size_t)(pe - ps), enc, elen, eb);
		if (rc)
			break;
		ar_slice_msg msg = { .round = p->round,
			             .from = me->host_id,
			             .samples = me->samples,
			             .comp = (uint8_t)p->send_comp,
			             .start = ps,
			             .end = pe,
			             .data = enc,
			             .dlen = elen };
		w.len = 0;
		rc = ar_slice_encode(&w, &msg);
		if (!rc)
			rc = peer_send_frame(c, ALLREDUCE_FRAME_SLICE, 0, w.buf, w.len, p->collect_deadline,
			                     eb);
		if (!rc && pe < m->end)
			fault_point("mid-slice", p->round); /* a test hook: part of a slice is out */
		ar_pace_done(r, a->idx, k + 1);
	}
	ar_pace_done(r, a->idx, SIZE_MAX);
	frame_writer_free(&w);
	free(enc);
	return rc;
}

/* Receive aggregator a's ACCEPTED report into a->rep (ownership moves
 * there) and count it in. */
static cot_err recv_accepted(run *r, member_state *a, peer_conn *c, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	unsigned char *pl = NULL;
	uint32_t len = 0;
	uint8_t type;
	ar_accepted_msg msg = { 0 };
	cot_err rc =
	        recv_from_agg(r, c, ALLREDUCE_FRAME_ACCEPTED, ALLREDUCE_FRAME_ACCEPTED, &type, &pl, &len, eb);
	if (!rc && (ar_accepted_decode(pl, len, p->n, &msg, eb) || msg.round != p->round ||
	            msg.agg != p->members[a->idx].host_id || !all_members(p, msg.ids, msg.n_ids))) {
		free(msg.ids);
		rc = cot_seterr(eb, COT_ERR_NETWORK, "malformed ACCEPTED");
	}
	free(pl);
	if (rc)
		return rc;
	pthread_mutex_lock(&r->mu);
	a->rep = msg.ids;
	a->rep_n = msg.n_ids;
	r->rep_pending--;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return COT_OK;
}

/* Receive aggregator a's RESULT, taking the result parts that come before
 * it on this connection (*got of them; the streamer is stopped at the
 * first).  COT_OK with *pl the RESULT's payload (the caller's) and *res
 * decoded from it (res->ids the caller's); on error nothing to free but
 * *pl. */
static cot_err recv_result_msg(run *r, member_state *a, peer_conn *c, unsigned char **pl, size_t *got,
                               ar_result_msg *res, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[a->idx];
	uint32_t len = 0;
	for (;;) {
		uint8_t type = 0;
		free(*pl);
		*pl = NULL;
		cot_err rc =
		        recv_from_agg(r, c, ALLREDUCE_FRAME_RESULT, FRAME_RESULT_PART, &type, pl, &len, eb);
		if (rc)
			return rc;
		if (type == ALLREDUCE_FRAME_RESULT)
			break;
		if (*got == 0 && (rc = streamer_stop(r, a, eb)))
			return rc;
		if (*got == 0)
			TRACE(r, "result parts from host %lld on the slice connection",
			      (long long)m->host_id);
		rc = take_result_part(r, a->idx, *got, *pl, len, eb);
		if (rc)
			return rc;
		(*got)++;
	}
	if (ar_result_decode(*pl, len, p->n, res, eb) || !all_members(p, res->ids, res->n_ids) ||
	    res->round != p->round || res->agg != m->host_id || res->start != m->start ||
	    res->end != m->end || res->comp != p->result_comp) {
		free(res->ids);
		res->ids = NULL;
		return cot_seterr(eb, COT_ERR_NETWORK, "malformed RESULT");
	}
	return COT_OK;
}

/* The RESULT's data is empty: check that the result parts it refers to
 * all arrived, on the stream (got == 0: "as streamed"; the aggregator ends
 * the stream once it decided) or on this connection ("as sent in parts").
 * Data in the RESULT: stop the streamer, the RESULT carries the sum. */
static cot_err settle_parts(run *r, member_state *a, const ar_result_msg *res, size_t got, cot_errbuf *eb)
{
	int complete;
	if (res->dlen > 0)
		return streamer_stop(r, a, eb);
	if (got == 0) { /* n > 0, so a real encoding is never empty */
		pthread_mutex_lock(&r->mu);
		while (!a->st_done && ar_wait(r, r->p->deadline))
			;
		complete = a->st_done && a->st_complete;
		pthread_mutex_unlock(&r->mu);
	} else {
		complete = got == ar_parts_of(r->p, a->idx);
	}
	return complete ? COT_OK
	                : cot_seterr(eb, COT_ERR_NETWORK,
	                             "its RESULT refers to result parts that did not all arrive");
}

/* Decode the sum the RESULT carries into out. */
static cot_err take_result_data(run *r, member_state *a, const ar_result_msg *res, cot_errbuf *eb)
{
	const allreduce_member *m = &r->p->members[a->idx];
	size_t n = (size_t)ar_range_len(m);
	cot_err rc = comp_decode(r->p->result_comp, res->data, res->dlen, r->out + m->start, n, eb);
	for (size_t i = 0; !rc && i < n; i++)
		if (!isfinite(r->out[m->start + i]))
			rc = cot_seterr(eb, COT_ERR_NETWORK, "RESULT holds a value that is not finite");
	return rc;
}

/* Receive aggregator a's RESULT (and its result parts) and record the set
 * it names in a->rids (ownership moves there). */
static cot_err recv_result(run *r, member_state *a, peer_conn *c, cot_errbuf *eb)
{
	unsigned char *pl = NULL;
	size_t got = 0;
	ar_result_msg res = { 0 };
	cot_err rc = in_step(recv_result_msg(r, a, c, &pl, &got, &res, eb), "receive its RESULT", eb);
	if (!rc)
		rc = in_step(settle_parts(r, a, &res, got, eb), "receive its result parts", eb);
	if (!rc && res.dlen > 0)
		rc = in_step(take_result_data(r, a, &res, eb), "receive its RESULT", eb);
	free(pl);
	if (rc) {
		free(res.ids);
		return rc;
	}
	TRACE(r, "RESULT from host %lld", (long long)r->p->members[a->idx].host_id);
	/* Its range of out is final: sketch it here, beside the other
	 * senders, not after the exchange (allreduce_sketch.c). */
	const allreduce_member *m = &r->p->members[a->idx];
	a->sk_time = ar_sketch_part(r->p, r->out + m->start, (size_t)ar_range_len(m), m->start, COMP_NONE, 0,
	                            r->sk_recv ? r->sk_recv + a->idx * (size_t)r->p->sketch_k : NULL, NULL);
	pthread_mutex_lock(&r->mu);
	a->rids = res.ids;
	a->rids_n = res.n_ids;
	a->rtotal = res.total;
	pthread_mutex_unlock(&r->mu);
	return COT_OK;
}

/* The slice connection to aggregator a, step by step; *cp is the caller's
 * to close.  The detail names the step that failed. */
static cot_err sender_run(run *r, member_state *a, peer_conn **cp, cot_errbuf *eb)
{
	int64_t host = r->p->members[a->idx].host_id;
	cot_err rc = in_step(connect_agg(r, a, 0, cp, eb), "connect", eb);
	if (rc)
		return rc;
	TRACE(r, "slice connection to host %lld ready", (long long)host);
	rc = in_step(send_slice(r, a, *cp, eb), "send our slice", eb);
	if (rc)
		return rc;
	TRACE(r, "slice to host %lld sent", (long long)host);
	rc = in_step(recv_accepted(r, a, *cp, eb), "receive its ACCEPTED report", eb);
	if (rc)
		return rc;
	return recv_result(r, a, *cp, eb);
}

void *ar_sender_main(void *arg)
{
	member_state *a = arg;
	run *r = a->r;
	peer_conn *c = NULL;
	cot_errbuf eb = { 0 };
	cot_err rc = sender_run(r, a, &c, &eb);
	ar_pace_done(r, a->idx, SIZE_MAX); /* hold no one back any more */
	if (rc)
		ar_fail(r, "could not average with aggregator host %lld: %s",
		        (long long)r->p->members[a->idx].host_id, eb.msg);
	peer_close(c);
	return NULL;
}

/* ---- The stream connection (streamer thread) ---- */

/* Ask aggregator a for its result parts on c. */
static cot_err stream_ask(run *r, member_state *a, peer_conn *c, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	ar_stream_msg msg = { .round = p->round, .member = p->members[p->self].host_id };
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_MIN_MAX);
	cot_err rc = ar_stream_encode(&w, &msg);
	if (!rc)
		rc = peer_send_frame(c, FRAME_STREAM, 0, w.buf, w.len, p->collect_deadline, eb);
	frame_writer_free(&w);
	if (!rc)
		TRACE(r, "stream connection to host %lld ready", (long long)p->members[a->idx].host_id);
	return rc;
}

/* Decode result parts from c into out until STREAM_END, an error, or the
 * sender abandons the stream.  *got: parts decoded; *complete: every part
 * and STREAM_END 1 arrived. */
static void stream_read(run *r, member_state *a, peer_conn *c, size_t *got, int *complete)
{
	const allreduce_params *p = r->p;
	size_t n_parts = ar_parts_of(p, a->idx);
	unsigned char *pl = NULL;
	cot_errbuf eb = { 0 };
	for (;;) {
		frame_header h;
		free(pl);
		pl = NULL;
		if (peer_recv_frame(c, &h, &pl, p->deadline, &eb))
			break;
		if (h.type == FRAME_STREAM_END) {
			*complete = h.length == 1 && pl[0] == 1 && *got == n_parts;
			break;
		}
		if (h.type != FRAME_RESULT_PART || *got == n_parts)
			break;
		pthread_mutex_lock(&r->mu);
		int abandoned = a->st_abandon;
		a->st_busy = !abandoned;
		pthread_mutex_unlock(&r->mu);
		if (abandoned)
			break;
		cot_err rc = take_result_part(r, a->idx, *got, pl, h.length, &eb);
		pthread_mutex_lock(&r->mu);
		a->st_busy = 0;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		if (rc)
			break;
		if (*got == 0 || *got + 1 == n_parts)
			TRACE(r, "result part %zu of %zu from host %lld", *got + 1, n_parts,
			      (long long)p->members[a->idx].host_id);
		(*got)++;
	}
	free(pl);
}

void *ar_streamer_main(void *arg)
{
	member_state *a = arg;
	run *r = a->r;
	peer_conn *c = NULL;
	cot_errbuf eb = { 0 };
	size_t got = 0;
	int complete = 0;
	cot_err rc = connect_agg(r, a, 1, &c, &eb);
	if (!rc)
		rc = stream_ask(r, a, c, &eb);
	if (!rc)
		stream_read(r, a, c, &got, &complete);
	peer_close(c);
	pthread_mutex_lock(&r->mu);
	a->st_parts = got;
	a->st_complete = complete;
	a->st_done = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}
