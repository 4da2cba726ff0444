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
 * under one mutex; waits are bounded by the call's deadlines.
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
 * kernel's unsent bytes (tune_socket), so that two slow members reach part k
 * of every range at about the same time and each aggregator can stream its
 * results at their upload rate (doc/averaging.md, "Pacing"). */
#include "shared/averaging/allreduce.h"

#include "shared/common/deadline.h"
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"
#include "shared/common/log.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { C_NONE, C_OK, C_REFUSED, C_FAILED };

/* Values per slice part and result part: a multiple of COMP_BLOCK, so that
 * the encodings of the parts, laid end to end, are the encoding of the whole
 * range (BLOCK8 blocks never straddle two parts).  Small (64 KiB of fp32),
 * because a result part waits for the part of the slowest sender, who
 * shares its uplink among all aggregators: at 8 Mbit/s a 1 MiB part took a
 * second, and the first results came that late. */
#define PART_VALUES ((size_t)COMP_BLOCK * 4)

/* Stream connections (frame.h's averaging range): member -> aggregator
 * STREAM (i64 round, i64 member) asks for the result parts; aggregator ->
 * member RESULT_PART (i64 round, i64 aggregator, u64 start, u64 end, blob),
 * in order, then STREAM_END (u8 1 when every part was sent, 0 when the
 * aggregator stopped speculating). */
#define FRAME_STREAM 0x14
#define FRAME_RESULT_PART 0x15
#define FRAME_STREAM_END 0x16
enum { AGG_PENDING, AGG_RESULT, AGG_ABORT };

typedef struct {
	int state;
	float *data;                  /* a_len values while C_OK */
	char reason[160];
} contrib;

typedef struct run run;

typedef struct {
	run *r;
	size_t agg;                   /* member index of the aggregator */
	pthread_t th;
	pthread_t st;                 /* its streamer thread */
	int have_st;
} sender;

typedef struct {
	run *r;
	int fd;
	pthread_t th;
} handler;

struct run {
	const allreduce_params *p;
	float *out;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_cond_t pace_cv;       /* a sender advanced (pacing only) */

	/* aggregator side */
	int agg;
	size_t a_len;
	contrib *c;                   /* per member */
	unsigned char *claimed;       /* a connection identified as this member */
	size_t arrived;               /* remote members done sending (any outcome) */
	int frozen;
	unsigned char *acc_payload;   /* our ACCEPTED message, once frozen */
	size_t acc_len;
	int agg_state;
	unsigned char *res_payload;   /* our RESULT message, once AGG_RESULT */
	unsigned char *fin_bytes;     /* the result encoding of our range, when it is not
	                               * the streamed one: sent in parts before RESULT */
	size_t res_len;
	char abort_reason[256];
	int stop_accept;
	unsigned char *claimed_stream;  /* a stream connection from this member */
	unsigned char *stream_end;    /* per member, once its stream connection was
	                               * served: 1 every part and STREAM_END 1 went
	                               * out, 2 not */
	size_t n_parts;               /* of our range */
	size_t *parts_in;             /* per member: parts taken */
	size_t *order;                /* member indices by ascending host id */
	int spec_ok;                  /* still streaming the sum over all members */
	int spec_busy;                /* a thread is summing part spec_done */
	size_t spec_done;             /* parts summed and encoded into spec_bytes */
	unsigned char *spec_bytes;    /* result encoding of our whole range */
	float *spec_tmp;              /* PART_VALUES, for the one busy thread */
	const float **spec_x;

	/* member side, per member index (aggregators only) */
	int64_t **rep;                /* ACCEPTED reports, ascending ids */
	size_t *rep_n;
	size_t rep_pending;
	int64_t **rids;               /* included ids each RESULT named */
	size_t *rids_n;
	uint64_t *rtotal;
	unsigned char *st_done;       /* the streamer for this aggregator ended */
	size_t *st_parts;             /* result parts it decoded */
	unsigned char *st_complete;   /* it got every part and STREAM_END 1 */
	unsigned char *st_abandon;    /* the sender takes the result parts from the
	                               * slice connection: the streamer must not
	                               * decode any more */
	unsigned char *st_busy;       /* the streamer is decoding a part into out */
	size_t *pace_next;            /* per aggregator: the next part our sender sends */
	unsigned char *pacing;        /* per aggregator: its sender is sending parts */
	int failed;
	int64_t t0;                   /* when the call started (deadline clock), for traces */
	cot_errbuf feb;
};

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Wait on cv (with r->mu held) for at most 100 ms and never past deadline;
 * 0 once the deadline has passed. */
static int wait_a_bit_on(run *r, pthread_cond_t *cv, int64_t deadline)
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

/* The same on r->cv, which every change of the shared state signals. */
static int wait_a_bit(run *r, int64_t deadline)
{
	return wait_a_bit_on(r, &r->cv, deadline);
}

/* A debug line of the exchange's timeline: milliseconds since the call
 * started, so that the lines of all members (started together) line up. */
#define TRACE(r, fmt, ...)                                                              \
	log_debug("allreduce host %lld +%lld ms: " fmt,                                     \
	          (long long)(r)->p->members[(r)->p->self].host_id,                         \
	          (long long)(deadline_now_ms() - (r)->t0), __VA_ARGS__)

/* Unsent bytes the kernel may hold per connection (TCP_NOTSENT_LOWAT).
 * Without a bound the socket buffer grows to megabytes per connection, and
 * which connection's bytes go out first is the kernel's choice, not ours:
 * the pacing below would only pace copies into buffers.  128 KiB is 5 ms at
 * 200 Mbit/s, plenty for a thread to come back and write more. */
#define NOTSENT_LOWAT (128 * 1024)

/* Bound the unsent bytes of a connection we are about to use (best effort:
 * a kernel without the option still works, only less evenly). */
static void tune_socket(int fd)
{
	int v = NOTSENT_LOWAT;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

/* Parts of aggregator a's range. */
static size_t parts_of(const allreduce_params *p, size_t a)
{
	return (size_t)((p->members[a].end - p->members[a].start + PART_VALUES - 1) / PART_VALUES);
}

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
	double mine = (double)k / (double)parts_of(p, a);
	pthread_mutex_lock(&r->mu);
	r->pace_next[a] = k;
	r->pacing[a] = 1;
	for (;;) {
		int ok = 1;
		for (size_t b = 0; ok && b < p->n; b++)
			if (b != a && r->pacing[b] &&
			    mine > (double)(r->pace_next[b] + 1) / (double)parts_of(p, b))
				ok = 0;
		if (ok || r->failed || !wait_a_bit_on(r, &r->pace_cv, p->collect_deadline))
			break;
	}
	pthread_mutex_unlock(&r->mu);
}

/* Our sender to aggregator a sent a part (next is its next one), or stopped
 * (next = SIZE_MAX): wake the senders that wait on it. */
static void pace_done(run *r, size_t a, size_t next)
{
	pthread_mutex_lock(&r->mu);
	if (next == SIZE_MAX)
		r->pacing[a] = 0;
	else
		r->pace_next[a] = next;
	pthread_cond_broadcast(&r->pace_cv);
	pthread_mutex_unlock(&r->mu);
}

/* Record the first member-side failure (mu not held). */
static void fail(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(run *r, const char *fmt, ...)
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

static int member_index(const allreduce_params *p, int64_t host_id)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->members[i].host_id == host_id)
			return (int)i;
	return -1;
}

static uint64_t range_len(const allreduce_member *m)
{
	return m->end - m->start;
}

static hello_msg our_hello(const allreduce_params *p)
{
	hello_msg m = { .proto_min = HELLO_PROTO_MIN, .proto_max = HELLO_PROTO_MAX,
	                .host_id = peer_ctx_host_id(p->ctx), .round = p->round,
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

/* ---- Contributions (aggregator side) ---- */

/* Decode and check part [off, off + n) (relative to our range) of member
 * idx's slice into r->c[idx] (mu held; parts come in order, the first with
 * off 0).  A refusal is recorded with its reason and stops the speculative
 * stream; nothing else fails.  The data stays allocated until run_free, so
 * a summing thread may still read it. */
static void take_slice(run *r, size_t idx, size_t off, size_t n, const unsigned char *bytes,
                       size_t len)
{
	const allreduce_params *p = r->p;
	contrib *c = &r->c[idx];
	cot_errbuf eb = {0};
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
		if (!c->reason[0] && p->members[idx].samples == 0 && !zero)
			snprintf(c->reason, sizeof c->reason, "a gradient of 0 samples is not zero");
	}
	if (c->reason[0]) {
		c->state = C_REFUSED;
		r->spec_ok = 0;
	}
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
			if (r->c[i].state != C_OK || r->parts_in[i] <= k)
				return;
		r->spec_busy = 1;
		pthread_mutex_unlock(&r->mu);
		size_t off = k * PART_VALUES, n = r->a_len - off;
		if (n > PART_VALUES)
			n = PART_VALUES;
		for (size_t j = 0; j < p->n; j++)
			r->spec_x[j] = r->c[r->order[j]].data + off;
		allreduce_sum(r->spec_x, p->n, n, r->spec_tmp);
		int ok = 1;
		for (size_t i = 0; i < n && ok; i++)
			ok = isfinite(r->spec_tmp[i]);
		size_t eoff = comp_encoded_size(p->result_comp, off);
		size_t elen = comp_encoded_size(p->result_comp, n);
		ok = ok && !comp_encode(p->result_comp, r->spec_tmp, n, r->spec_bytes + eoff, elen, NULL) &&
		     !comp_decode(p->result_comp, r->spec_bytes + eoff, elen, r->out + me->start + off, n,
		                  NULL);
		pthread_mutex_lock(&r->mu);
		r->spec_busy = 0;
		if (!ok)
			r->spec_ok = 0;   /* the final path reports the overflow */
		else if (++r->spec_done == r->n_parts)
			TRACE(r, "all %zu result parts summed", r->n_parts);
		pthread_cond_broadcast(&r->cv);
	}
}

/* Stop streaming and wait until no thread is summing (mu held), before
 * anything else writes our range of out. */
static void spec_stop(run *r)
{
	r->spec_ok = 0;
	while (r->spec_busy)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_cond_broadcast(&r->cv);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Stop taking slices (mu held): refuse norm outliers, and build our ACCEPTED
 * report.  The L2 norm per sample of each slice is compared with the lower
 * median over the contributions with samples; with fewer than 3 of them no
 * outlier can be told apart, so none is refused. */
static cot_err freeze(run *r)
{
	const allreduce_params *p = r->p;
	double factor = p->outlier_factor == 0 ? ALLREDUCE_OUTLIER_DEFAULT : p->outlier_factor;
	double *rate = calloc(p->n, sizeof *rate), *sorted = calloc(p->n, sizeof *sorted);
	int64_t *ids = calloc(p->n, sizeof *ids);
	if (!rate || !sorted || !ids) {
		free(rate), free(sorted), free(ids);
		return COT_ERR_NOMEM;
	}
	size_t k = 0;
	for (size_t i = 0; i < p->n; i++)
		if (r->c[i].state == C_OK && r->parts_in[i] < r->n_parts) {
			r->c[i].state = C_FAILED;
			snprintf(r->c[i].reason, sizeof r->c[i].reason,
			         "slice incomplete at the collect deadline (%zu of %zu parts)",
			         r->parts_in[i], r->n_parts);
		}
	for (size_t i = 0; i < p->n; i++) {
		if (r->c[i].state != C_OK || p->members[i].samples == 0)
			continue;
		double s = 0;
		for (size_t j = 0; j < r->a_len; j++)
			s += (double)r->c[i].data[j] * r->c[i].data[j];
		rate[i] = sqrt(s) / (double)p->members[i].samples;
		sorted[k++] = rate[i];
	}
	if (factor > 0 && k >= 3) {
		qsort(sorted, k, sizeof *sorted, cmp_double);
		double median = sorted[(k - 1) / 2];
		for (size_t i = 0; median > 0 && i < p->n; i++) {
			if (r->c[i].state != C_OK || p->members[i].samples == 0 ||
			    !(rate[i] > factor * median))
				continue;
			r->c[i].state = C_REFUSED;
			snprintf(r->c[i].reason, sizeof r->c[i].reason,
			         "norm per sample %.3g is %.1f times the median %.3g (limit %.1f)",
			         rate[i], rate[i] / median, median, factor);
		}
	}
	size_t n_ids = 0;
	for (size_t i = 0; i < p->n; i++)
		if (r->c[i].state == C_OK)
			ids[n_ids++] = p->members[i].host_id;
	if (n_ids < p->n)
		r->spec_ok = 0;
	qsort(ids, n_ids, sizeof *ids, cmp_i64);

	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	frame_put_i64(&w, p->round);
	frame_put_i64(&w, p->members[p->self].host_id);
	frame_put_u32(&w, (uint32_t)n_ids);
	for (size_t i = 0; i < n_ids; i++)
		frame_put_i64(&w, ids[i]);
	cot_err rc = frame_writer_error(&w);
	if (rc == COT_OK) {
		r->acc_payload = w.buf;
		r->acc_len = w.len;
		r->rep[p->self] = ids;
		r->rep_n[p->self] = n_ids;
		r->rep_pending--;
		ids = NULL;
	} else {
		frame_writer_free(&w);
	}
	r->frozen = 1;
	free(ids);
	free(rate);
	free(sorted);
	pthread_cond_broadcast(&r->cv);
	return rc;
}

/* Give up our range (mu held): handlers send ABORT with reason. */
static void agg_abort(run *r, const char *reason)
{
	if (r->agg_state == AGG_PENDING) {
		r->agg_state = AGG_ABORT;
		snprintf(r->abort_reason, sizeof r->abort_reason, "%.250s", reason);
	}
	pthread_cond_broadcast(&r->cv);
}

/* Build our RESULT for the included set fin with data (elen bytes; empty
 * means "as streamed") and publish it (mu held). */
static cot_err agg_result(run *r, const int64_t *fin, size_t n_fin, uint64_t total,
                          const unsigned char *data, size_t elen, cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	frame_put_i64(&w, p->round);
	frame_put_i64(&w, me->host_id);
	frame_put_u64(&w, me->start);
	frame_put_u64(&w, me->end);
	frame_put_u8(&w, (uint8_t)p->result_comp);
	frame_put_u64(&w, total);
	frame_put_u32(&w, (uint32_t)n_fin);
	for (size_t k = 0; k < n_fin; k++)
		frame_put_i64(&w, fin[k]);
	frame_put_blob(&w, data, elen);
	cot_err rc = frame_writer_error(&w);
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
 * same bytes (mu held). */
static cot_err agg_finish(run *r, const int64_t *fin, size_t n_fin, uint64_t total,
                          cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	const float **x = calloc(n_fin ? n_fin : 1, sizeof *x);
	float *sum = malloc(r->a_len * sizeof *sum);
	size_t enc = comp_encoded_size(p->result_comp, r->a_len);
	unsigned char *bytes = malloc(enc ? enc : 1);
	cot_err rc = COT_OK;
	if (!x || !sum || !bytes) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t k = 0; k < n_fin; k++) {
		const contrib *c = &r->c[member_index(p, fin[k])];
		if (c->state != C_OK) {   /* cannot happen: fin is inside our report */
			rc = cot_seterr(eb, COT_ERR_INTERNAL, "included host %lld has no slice",
			                (long long)fin[k]);
			goto out;
		}
		x[k] = c->data;
	}
	allreduce_sum(x, n_fin, r->a_len, sum);
	for (size_t i = 0; i < r->a_len; i++)
		if (!isfinite(sum[i])) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "the sum overflowed at value %llu",
			                (unsigned long long)(me->start + i));
			goto out;
		}
	rc = comp_encode(p->result_comp, sum, r->a_len, bytes, enc, eb);
	if (!rc)
		rc = comp_decode(p->result_comp, bytes, enc, r->out + me->start, r->a_len, eb);
	if (rc)
		goto out;
	r->fin_bytes = bytes;   /* the handlers send it in parts, then RESULT */
	bytes = NULL;
	rc = agg_result(r, fin, n_fin, total, NULL, 0, eb);
out:
	free(x);
	free(sum);
	free(bytes);
	return rc;
}

/* Every member is included and every part was streamed: our RESULT says so
 * with empty data, and our own copy of the range is already in out (mu
 * held). */
static cot_err agg_streamed(run *r, const int64_t *fin, size_t n_fin, uint64_t total,
                            cot_errbuf *eb)
{
	return agg_result(r, fin, n_fin, total, NULL, 0, eb);
}

/* ---- Incoming connections (aggregator side) ---- */

/* Read and check member idx's SLICE parts, the first already received (h,
 * *pl, or rc0 with eb0 when receiving it failed; *pl is ours).  Returns 0
 * when the connection is still usable afterwards. */
static int handle_slice(run *r, peer_conn *c, size_t idx, cot_err rc0, const cot_errbuf *eb0,
                        frame_header h, unsigned char *pl)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	cot_errbuf eb = *eb0;
	char why[160] = "";
	int usable = 1, late = 0;
	cot_err rc = rc0;
	size_t k = 0;
	for (; k < r->n_parts; k++) {
		if (k > 0) {
			free(pl);
			pl = NULL;
			rc = peer_recv_frame(c, &h, &pl, p->collect_deadline, &eb);
		}
		if (rc) {
			snprintf(why, sizeof why, "no slice: %.120s", eb.msg);
			usable = 0;
			break;
		}
		if (h.type != ALLREDUCE_FRAME_SLICE) {
			snprintf(why, sizeof why, "sent %s instead of SLICE", frame_type_name(h.type));
			usable = 0;
			break;
		}
		int64_t round = 0, from = 0;
		uint64_t samples = 0, start = 0, end = 0;
		uint8_t comp = 0;
		const unsigned char *data = NULL;
		size_t dlen = 0;
		uint64_t want_start = me->start + k * PART_VALUES;
		uint64_t want_end = me->end - want_start > PART_VALUES ? want_start + PART_VALUES : me->end;
		frame_reader rd;
		frame_reader_init(&rd, pl, h.length);
		frame_get_i64(&rd, &round);
		frame_get_i64(&rd, &from);
		frame_get_u64(&rd, &samples);
		frame_get_u8(&rd, &comp);
		frame_get_u64(&rd, &start);
		frame_get_u64(&rd, &end);
		frame_get_blob(&rd, &data, &dlen, FRAME_PAYLOAD_HARD_MAX);
		if (frame_reader_end(&rd, "SLICE", &eb)) {
			snprintf(why, sizeof why, "%.150s", eb.msg);
			usable = 0;
			break;
		}
		if (round != p->round || from != p->members[idx].host_id || start != want_start ||
		    end != want_end || comp != p->send_comp) {
			snprintf(why, sizeof why,
			         "SLICE for round %lld, host %lld, range [%llu,%llu), %s does not "
			         "match the group's",
			         (long long)round, (long long)from, (unsigned long long)start,
			         (unsigned long long)end, comp_name(comp));
			usable = 0;
			break;
		}
		pthread_mutex_lock(&r->mu);
		if (r->frozen) {
			late = 1;
		} else if (samples != p->members[idx].samples) {
			r->c[idx].state = C_REFUSED;
			r->spec_ok = 0;
			snprintf(r->c[idx].reason, sizeof r->c[idx].reason,
			         "SLICE claims %llu samples, the group says %llu",
			         (unsigned long long)samples,
			         (unsigned long long)p->members[idx].samples);
		} else {
			take_slice(r, idx, (size_t)(start - me->start), (size_t)(end - start), data, dlen);
		}
		if (!late) {
			if (k == 0 || k + 1 == r->n_parts)
				TRACE(r, "slice part %zu of %zu from host %lld", k + 1, r->n_parts,
				      (long long)p->members[idx].host_id);
			r->parts_in[idx] = k + 1;
			if (r->c[idx].state == C_OK)
				spec_advance(r);
		}
		pthread_mutex_unlock(&r->mu);
		if (late)
			break;
	}
	free(pl);
	if (!usable && rc == COT_OK)
		peer_send_error(c, FRAME_ERR_PROTOCOL, why, deadline_after_ms(1000));

	pthread_mutex_lock(&r->mu);
	contrib *ct = &r->c[idx];
	if (late) {
		/* The rest of its parts are unread: the connection cannot carry
		 * ACCEPTED and RESULT any more. */
		ct->state = C_FAILED;
		snprintf(ct->reason, sizeof ct->reason, "slice arrived after the collect deadline");
		usable = 0;
	} else if (!usable) {
		ct->state = C_FAILED;
		r->spec_ok = 0;
		snprintf(ct->reason, sizeof ct->reason, "%s", why);
	}
	r->arrived++;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return usable ? 0 : -1;
}

/* Send part k of our range's result, taken from bytes (the result encoding
 * of the whole range), as a RESULT_PART frame on c. */
static cot_err send_part(run *r, peer_conn *c, const unsigned char *bytes, size_t k,
                         cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *me = &p->members[p->self];
	size_t off = k * PART_VALUES, n = r->a_len - off;
	if (n > PART_VALUES)
		n = PART_VALUES;
	size_t eoff = comp_encoded_size(p->result_comp, off);
	size_t elen = comp_encoded_size(p->result_comp, n);
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	frame_put_i64(&w, p->round);
	frame_put_i64(&w, me->host_id);
	frame_put_u64(&w, me->start + off);
	frame_put_u64(&w, me->start + off + n);
	frame_put_blob(&w, bytes + eoff, elen);
	cot_err rc = frame_writer_error(&w);
	if (!rc)
		rc = peer_send_frame(c, FRAME_RESULT_PART, 0, w.buf, w.len, p->deadline, eb);
	frame_writer_free(&w);
	return rc;
}

/* Serve member idx's stream connection: send each result part once it is
 * summed, then STREAM_END (1 once every part went out, 0 when the
 * speculation stopped or the deadline came), and record in stream_end[idx]
 * whether all of it went out: that decides whether member idx's RESULT may
 * say "as streamed".  The parts are immutable once spec_done has passed
 * them, so they are sent without the lock. */
static void stream_serve(run *r, peer_conn *c, size_t idx)
{
	const allreduce_params *p = r->p;
	size_t sent = 0;
	cot_errbuf eb = {0};
	cot_err rc = COT_OK;
	for (;;) {
		pthread_mutex_lock(&r->mu);
		while (sent == r->spec_done && sent < r->n_parts && r->spec_ok &&
		       r->agg_state == AGG_PENDING && wait_a_bit(r, p->deadline))
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
	r->stream_end[idx] = !rc && complete ? 1 : 2;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void *handler_main(void *arg)
{
	handler *hd = arg;
	run *r = hd->r;
	const allreduce_params *p = r->p;
	peer_conn *c = NULL;
	cot_errbuf eb = {0};
	tune_socket(hd->fd);
	if (peer_handshake(p->ctx, hd->fd, PEER_SERVER, 0, p->collect_deadline, &c, &eb))
		return NULL;
	int64_t id = peer_host_id(c);
	int idx = member_index(p, id);
	if (idx < 0 || (size_t)idx == p->self) {
		char reason[128];
		snprintf(reason, sizeof reason, "host %lld is not a member of this averaging group",
		         (long long)id);
		peer_send_error(c, FRAME_ERR_IDENTITY, reason, min64(p->deadline, deadline_after_ms(1000)));
		peer_close(c);
		return NULL;
	}

	hello_msg ours = our_hello(p), theirs;
	uint16_t ver;
	if (hello_exchange(c, &ours, &theirs, &ver, p->collect_deadline, &eb)) {
		/* Which connection it was is unknown; a member that fails HELLO
		 * is dropped now, unless its slice connection is already here. */
		pthread_mutex_lock(&r->mu);
		if (!r->claimed[idx]) {
			r->claimed[idx] = 1;
			r->c[idx].state = C_FAILED;
			r->spec_ok = 0;
			snprintf(r->c[idx].reason, sizeof r->c[idx].reason, "HELLO failed: %.120s",
			         eb.msg);
			r->arrived++;
			pthread_cond_broadcast(&r->cv);
		}
		pthread_mutex_unlock(&r->mu);
		peer_close(c);
		return NULL;
	}
	frame_header h = {0};
	unsigned char *pl = NULL;
	cot_err rc = peer_recv_frame(c, &h, &pl, p->collect_deadline, &eb);
	/* Which connection this is: a stream, or (anything else) the slice one.
	 * Each kind once per member. */
	int stream = !rc && h.type == FRAME_STREAM;
	pthread_mutex_lock(&r->mu);
	unsigned char *claim = stream ? &r->claimed_stream[idx] : &r->claimed[idx];
	int dup = *claim;
	*claim = 1;
	pthread_mutex_unlock(&r->mu);
	if (dup) {
		free(pl);
		peer_send_error(c, FRAME_ERR_IDENTITY, "already connected as a member of this group",
		                min64(p->deadline, deadline_after_ms(1000)));
		peer_close(c);
		return NULL;
	}
	if (stream) {
		frame_reader rd;
		int64_t round = 0, from = 0;
		frame_reader_init(&rd, pl, h.length);
		frame_get_i64(&rd, &round);
		frame_get_i64(&rd, &from);
		if (frame_reader_end(&rd, "STREAM", &eb) || round != p->round || from != id) {
			peer_send_error(c, FRAME_ERR_PROTOCOL, "malformed STREAM",
			                min64(p->deadline, deadline_after_ms(1000)));
			pthread_mutex_lock(&r->mu);
			r->stream_end[idx] = 2;
			pthread_cond_broadcast(&r->cv);
			pthread_mutex_unlock(&r->mu);
		} else {
			stream_serve(r, c, (size_t)idx);
		}
		free(pl);
		peer_close(c);
		return NULL;
	}
	if (handle_slice(r, c, (size_t)idx, rc, &eb, h, pl)) {
		peer_close(c);
		return NULL;
	}

	/* ACCEPTED once we froze, then RESULT or ABORT once the set is known. */
	pthread_mutex_lock(&r->mu);
	while (!r->frozen && r->agg_state == AGG_PENDING && wait_a_bit(r, p->deadline))
		;
	int frozen = r->frozen && r->acc_payload;
	pthread_mutex_unlock(&r->mu);
	if (frozen && peer_send_frame(c, ALLREDUCE_FRAME_ACCEPTED, 0, r->acc_payload, r->acc_len,
	                              p->deadline, &eb) == COT_OK) {
		pthread_mutex_lock(&r->mu);
		while (r->agg_state == AGG_PENDING && wait_a_bit(r, p->deadline))
			;
		if (r->agg_state == AGG_PENDING)
			agg_abort(r, "the aggregator timed out waiting for the included set");
		int state = r->agg_state;
		pthread_mutex_unlock(&r->mu);
		if (state == AGG_RESULT) {
			/* The sum of the included set, when it is not what was
			 * streamed, goes in parts before the RESULT (whose data is
			 * then empty), so that no range is too large for a frame.
			 * So does the streamed sum to a member whose stream
			 * connection did not carry all of it: one that never came
			 * (it was still being dialed, or failed, or the member
			 * streams nothing), or broke.  A stream still being served
			 * is waited for: it has every part to send. */
			const unsigned char *parts = r->fin_bytes;
			if (!parts) {
				pthread_mutex_lock(&r->mu);
				while (r->claimed_stream[idx] && !r->stream_end[idx] &&
				       wait_a_bit(r, p->deadline))
					;
				if (r->stream_end[idx] != 1) {
					parts = r->spec_bytes;
					TRACE(r, "result to host %lld on the slice connection: its stream %s",
					      (long long)id, r->claimed_stream[idx] ? "broke" : "never came");
				}
				pthread_mutex_unlock(&r->mu);
			}
			cot_err rc2 = COT_OK;
			for (size_t k = 0; parts && !rc2 && k < r->n_parts; k++)
				rc2 = send_part(r, c, parts, k, &eb);
			if (!rc2)
				peer_send_frame(c, ALLREDUCE_FRAME_RESULT, 0, r->res_payload, r->res_len,
				                p->deadline, &eb);
		} else {
			frame_writer w;
			frame_writer_init(&w, FRAME_PAYLOAD_MIN_MAX);
			frame_error_encode(&w, FRAME_ERR_INTERNAL, r->abort_reason);
			if (!frame_writer_error(&w))
				peer_send_frame(c, ALLREDUCE_FRAME_ABORT, 0, w.buf, w.len, p->deadline, &eb);
			frame_writer_free(&w);
		}
	} else if (!frozen) {
		frame_writer w;
		frame_writer_init(&w, FRAME_PAYLOAD_MIN_MAX);
		frame_error_encode(&w, FRAME_ERR_INTERNAL, r->abort_reason);
		if (!frame_writer_error(&w))
			peer_send_frame(c, ALLREDUCE_FRAME_ABORT, 0, w.buf, w.len, p->deadline, &eb);
		frame_writer_free(&w);
	}
	peer_close(c);
	return NULL;
}

static void *acceptor_main(void *arg)
{
	run *r = arg;
	const allreduce_params *p = r->p;
	size_t cap = 2 * p->n + 16, nh = 0;
	handler *hs = calloc(cap, sizeof *hs);
	for (;;) {
		pthread_mutex_lock(&r->mu);
		int stop = r->stop_accept;
		pthread_mutex_unlock(&r->mu);
		if (stop || deadline_left_ms(p->deadline) == 0)
			break;
		int fd = -1;
		cot_errbuf eb = {0};
		/* 10 ms: the call's end waits for this loop to see stop_accept */
		if (listener_accept(p->lst, min64(p->deadline, deadline_after_ms(10)), &fd, NULL, &eb))
			continue;
		if (!hs || nh == cap) {   /* more connections than a group can make */
			close(fd);
			continue;
		}
		hs[nh].r = r;
		hs[nh].fd = fd;
		if (pthread_create(&hs[nh].th, NULL, handler_main, &hs[nh])) {
			close(fd);
			continue;
		}
		nh++;
	}
	for (size_t i = 0; i < nh; i++)
		pthread_join(hs[i].th, NULL);
	free(hs);
	return NULL;
}

/* ---- Outgoing connections (member side) ---- */

/* Read a list of n ids (n <= group size, each a member, ascending); malloc'd. */
static cot_err get_ids(const allreduce_params *p, frame_reader *rd, int64_t **ids, size_t *n)
{
	uint32_t k = 0;
	*ids = NULL;
	*n = 0;
	if (frame_get_u32(rd, &k) || k > p->n)
		return COT_ERR_INVALID;
	int64_t *v = malloc((k ? k : 1) * sizeof *v);
	if (!v)
		return COT_ERR_NOMEM;
	for (uint32_t i = 0; i < k; i++)
		if (frame_get_i64(rd, &v[i]) || member_index(p, v[i]) < 0 || (i && v[i] <= v[i - 1])) {
			free(v);
			return COT_ERR_INVALID;
		}
	*ids = v;
	*n = k;
	return COT_OK;
}

/* Check RESULT_PART payload pl (len bytes) as part k of aggregator a's
 * range and decode it into out.  COT_ERR_NETWORK when it is not that part,
 * is malformed, or holds a value that is not finite. */
static cot_err take_result_part(run *r, size_t a, size_t k, const unsigned char *pl, uint32_t len,
                                cot_errbuf *eb)
{
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[a];
	frame_reader rd;
	int64_t round = 0, agg = 0;
	uint64_t start = 0, end = 0;
	const unsigned char *data = NULL;
	size_t dlen = 0;
	uint64_t want = m->start + (uint64_t)k * PART_VALUES;
	if (want >= m->end)
		return cot_seterr(eb, COT_ERR_NETWORK, "more result parts than its range has");
	uint64_t want_end = m->end - want > PART_VALUES ? want + PART_VALUES : m->end;
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &round);
	frame_get_i64(&rd, &agg);
	frame_get_u64(&rd, &start);
	frame_get_u64(&rd, &end);
	frame_get_blob(&rd, &data, &dlen, FRAME_PAYLOAD_HARD_MAX);
	if (frame_reader_end(&rd, "RESULT_PART", eb) || round != p->round || agg != m->host_id ||
	    start != want || end != want_end)
		return cot_seterr(eb, COT_ERR_NETWORK, "malformed RESULT_PART");
	if (comp_decode(p->result_comp, data, dlen, r->out + start, (size_t)(end - start), eb))
		return COT_ERR_NETWORK;
	for (uint64_t i = start; i < end; i++)
		if (!isfinite(r->out[i]))
			return cot_seterr(eb, COT_ERR_NETWORK, "a result part holds a value that is not finite");
	return COT_OK;
}

/* Receive the next message from aggregator m, of type want or want2 (its
 * type in *type); an ABORT or ERROR becomes the failure it reports.  *pl is
 * the caller's. */
static cot_err recv_from_agg2(run *r, peer_conn *c, uint8_t want, uint8_t want2, uint8_t *type,
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

/* Receive the next message from aggregator m: ACCEPTED or RESULT as want. */
static cot_err recv_from_agg(run *r, peer_conn *c, uint8_t want, unsigned char **pl,
                             uint32_t *len, cot_errbuf *eb)
{
	uint8_t type;
	return recv_from_agg2(r, c, want, want, &type, pl, len, eb);
}

/* From now on the streamer for aggregator a decodes nothing more into out
 * (it may still be dialing or reading); returns once it is not in the
 * middle of a part, or COT_ERR_TIMEOUT at the deadline. */
static cot_err streamer_stop(run *r, size_t a, cot_errbuf *eb)
{
	pthread_mutex_lock(&r->mu);
	r->st_abandon[a] = 1;
	while (r->st_busy[a] && wait_a_bit(r, r->p->deadline))
		;
	int busy = r->st_busy[a];
	pthread_mutex_unlock(&r->mu);
	return busy ? cot_seterr(eb, COT_ERR_TIMEOUT, "its result stream did not stop") : COT_OK;
}

static void *sender_main(void *arg)
{
	sender *s = arg;
	run *r = s->r;
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[s->agg];
	const allreduce_member *me = &p->members[p->self];
	cot_errbuf eb = {0};
	peer_conn *c = NULL;
	unsigned char *pl = NULL, *enc = NULL;
	uint32_t len = 0;
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	dialer_target t = { m->addr, m->port, m->host_id };
	dialer_result dr;
	const char *step = "connect";
	cot_err rc = dialer_connect(p->dialer, &t, p->collect_deadline, &dr, &eb);
	if (!rc) {
		tune_socket(dr.fd);
		rc = peer_handshake(p->ctx, dr.fd, PEER_CLIENT, m->host_id, p->collect_deadline, &c, &eb);
	}
	hello_msg ours = our_hello(p), theirs;
	uint16_t ver;
	if (!rc)
		rc = hello_exchange(c, &ours, &theirs, &ver, p->collect_deadline, &eb);
	if (rc)
		goto out;
	TRACE(r, "slice connection to host %lld ready", (long long)m->host_id);

	step = "send our slice";
	size_t n = (size_t)range_len(m);
	enc = malloc(comp_encoded_size(p->send_comp, n < PART_VALUES ? n : PART_VALUES));
	if (!enc) {
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	size_t k = 0;
	for (uint64_t ps = m->start; !rc && ps < m->end; ps += PART_VALUES, k++) {
		uint64_t pe = m->end - ps > PART_VALUES ? ps + PART_VALUES : m->end;
		pace_wait(r, s->agg, k);
		size_t elen = comp_encoded_size(p->send_comp, (size_t)(pe - ps));
		rc = comp_encode(p->send_comp, p->grad + ps, (size_t)(pe - ps), enc, elen, &eb);
		if (rc)
			break;
		w.len = 0;
		frame_put_i64(&w, p->round);
		frame_put_i64(&w, me->host_id);
		frame_put_u64(&w, me->samples);
		frame_put_u8(&w, (uint8_t)p->send_comp);
		frame_put_u64(&w, ps);
		frame_put_u64(&w, pe);
		frame_put_blob(&w, enc, elen);
		rc = frame_writer_error(&w);
		if (!rc)
			rc = peer_send_frame(c, ALLREDUCE_FRAME_SLICE, 0, w.buf, w.len, p->collect_deadline,
			                     &eb);
		pace_done(r, s->agg, k + 1);
	}
	pace_done(r, s->agg, SIZE_MAX);
	if (rc)
		goto out;
	TRACE(r, "slice to host %lld sent", (long long)m->host_id);

	step = "receive its ACCEPTED report";
	rc = recv_from_agg(r, c, ALLREDUCE_FRAME_ACCEPTED, &pl, &len, &eb);
	if (rc)
		goto out;
	frame_reader rd;
	frame_reader_init(&rd, pl, len);
	int64_t round = 0, agg = 0, *ids = NULL;
	size_t nids = 0;
	frame_get_i64(&rd, &round);
	frame_get_i64(&rd, &agg);
	rc = get_ids(p, &rd, &ids, &nids);
	if (!rc && (frame_reader_end(&rd, "ACCEPTED", &eb) || round != p->round || agg != m->host_id))
		rc = cot_seterr(&eb, COT_ERR_NETWORK, "malformed ACCEPTED");
	if (rc) {
		free(ids);
		goto out;
	}
	pthread_mutex_lock(&r->mu);
	r->rep[s->agg] = ids;
	r->rep_n[s->agg] = nids;
	r->rep_pending--;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	free(pl);
	pl = NULL;

	/* When the sum is not the streamed one, or the stream did not carry
	 * all of it to us, it comes in parts before the RESULT; the streamer
	 * writes the same range of out, so it must decode nothing more from
	 * the first of them on (it may still be dialing, or reading). */
	step = "receive its RESULT";
	size_t got = 0;
	for (;;) {
		uint8_t type = 0;
		free(pl);
		pl = NULL;
		rc = recv_from_agg2(r, c, ALLREDUCE_FRAME_RESULT, FRAME_RESULT_PART, &type, &pl, &len,
		                    &eb);
		if (rc)
			goto out;
		if (type == ALLREDUCE_FRAME_RESULT)
			break;
		if (got == 0 && (rc = streamer_stop(r, s->agg, &eb)))
			goto out;
		if (got == 0)
			TRACE(r, "result parts from host %lld on the slice connection",
			      (long long)m->host_id);
		rc = take_result_part(r, s->agg, got, pl, len, &eb);
		if (rc)
			goto out;
		got++;
	}
	uint64_t start = 0, end = 0, total = 0;
	uint8_t comp = 0;
	const unsigned char *data = NULL;
	size_t dlen = 0;
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &round);
	frame_get_i64(&rd, &agg);
	frame_get_u64(&rd, &start);
	frame_get_u64(&rd, &end);
	frame_get_u8(&rd, &comp);
	frame_get_u64(&rd, &total);
	rc = get_ids(p, &rd, &ids, &nids);
	if (rc)
		goto out;
	frame_get_blob(&rd, &data, &dlen, FRAME_PAYLOAD_HARD_MAX);
	if (frame_reader_end(&rd, "RESULT", &eb) || round != p->round || agg != m->host_id ||
	    start != m->start || end != m->end || comp != p->result_comp) {
		free(ids);
		rc = cot_seterr(&eb, COT_ERR_NETWORK, "malformed RESULT");
		goto out;
	}
	step = "receive its result parts";
	if (dlen == 0 && got == 0) {   /* n > 0, so a real encoding is never empty */
		/* "as streamed": the stream must have carried every part (the
		 * aggregator ends it once it decided) */
		pthread_mutex_lock(&r->mu);
		while (!r->st_done[s->agg] && wait_a_bit(r, p->deadline))
			;
		int complete = r->st_done[s->agg] && r->st_complete[s->agg];
		pthread_mutex_unlock(&r->mu);
		if (!complete)
			rc = cot_seterr(&eb, COT_ERR_NETWORK,
			                "its RESULT refers to result parts that did not all arrive");
	} else if (dlen == 0) {
		/* "as sent in parts" */
		if (got != parts_of(p, s->agg))
			rc = cot_seterr(&eb, COT_ERR_NETWORK,
			                "its RESULT refers to result parts that did not all arrive");
	} else {
		rc = streamer_stop(r, s->agg, &eb);   /* the whole sum in the RESULT */
	}
	if (!rc && dlen > 0) {
		step = "receive its RESULT";
		rc = comp_decode(p->result_comp, data, dlen, r->out + m->start, n, &eb);
		for (size_t i = 0; !rc && i < n; i++)
			if (!isfinite(r->out[m->start + i]))
				rc = cot_seterr(&eb, COT_ERR_NETWORK,
				                "RESULT holds a value that is not finite");
	}
	if (rc) {
		free(ids);
		goto out;
	}
	TRACE(r, "RESULT from host %lld", (long long)m->host_id);
	pthread_mutex_lock(&r->mu);
	r->rids[s->agg] = ids;
	r->rids_n[s->agg] = nids;
	r->rtotal[s->agg] = total;
	pthread_mutex_unlock(&r->mu);
out:
	pace_done(r, s->agg, SIZE_MAX);   /* hold no one back any more */
	if (rc)
		fail(r, "could not average with aggregator host %lld: could not %s: %s",
		     (long long)m->host_id, step, eb.msg);
	free(pl);
	free(enc);
	frame_writer_free(&w);
	peer_close(c);
	return NULL;
}

/* Our second connection to aggregator s->agg: ask for its result parts and
 * decode them into out as they come, until the sender takes them from the
 * slice connection instead (st_abandon).  Never fails the run by itself: it
 * records what arrived (st_parts, st_complete) and ends (st_done); the
 * sender thread decides, from the aggregator's RESULT, whether the parts
 * count. */
static void *streamer_main(void *arg)
{
	sender *s = arg;
	run *r = s->r;
	const allreduce_params *p = r->p;
	const allreduce_member *m = &p->members[s->agg];
	const allreduce_member *me = &p->members[p->self];
	cot_errbuf eb = {0};
	peer_conn *c = NULL;
	unsigned char *pl = NULL;
	size_t got = 0, n_parts = (size_t)((range_len(m) + PART_VALUES - 1) / PART_VALUES);
	int complete = 0;
	dialer_target t = { m->addr, m->port, m->host_id };
	dialer_result dr;
	cot_err rc = dialer_connect(p->dialer, &t, p->collect_deadline, &dr, &eb);
	if (!rc) {
		pthread_mutex_lock(&r->mu);
		int abandoned = r->st_abandon[s->agg];
		pthread_mutex_unlock(&r->mu);
		if (abandoned) {   /* too late: the result came on the slice connection */
			close(dr.fd);
			rc = COT_ERR_NETWORK;
		}
	}
	if (!rc) {
		tune_socket(dr.fd);
		rc = peer_handshake(p->ctx, dr.fd, PEER_CLIENT, m->host_id, p->collect_deadline, &c, &eb);
	}
	hello_msg ours = our_hello(p), theirs;
	uint16_t ver;
	if (!rc)
		rc = hello_exchange(c, &ours, &theirs, &ver, p->collect_deadline, &eb);
	if (!rc) {
		frame_writer w;
		frame_writer_init(&w, FRAME_PAYLOAD_MIN_MAX);
		frame_put_i64(&w, p->round);
		frame_put_i64(&w, me->host_id);
		rc = frame_writer_error(&w);
		if (!rc)
			rc = peer_send_frame(c, FRAME_STREAM, 0, w.buf, w.len, p->collect_deadline, &eb);
		frame_writer_free(&w);
		if (!rc)
			TRACE(r, "stream connection to host %lld ready", (long long)m->host_id);
	}
	while (!rc) {
		frame_header h;
		free(pl);
		pl = NULL;
		rc = peer_recv_frame(c, &h, &pl, p->deadline, &eb);
		if (rc)
			break;
		if (h.type == FRAME_STREAM_END) {
			complete = h.length == 1 && pl[0] == 1 && got == n_parts;
			break;
		}
		if (h.type != FRAME_RESULT_PART || got == n_parts)
			break;
		pthread_mutex_lock(&r->mu);
		int abandoned = r->st_abandon[s->agg];
		r->st_busy[s->agg] = !abandoned;
		pthread_mutex_unlock(&r->mu);
		if (abandoned)
			break;
		rc = take_result_part(r, s->agg, got, pl, h.length, &eb);
		pthread_mutex_lock(&r->mu);
		r->st_busy[s->agg] = 0;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		if (rc)
			break;
		if (got == 0 || got + 1 == n_parts)
			TRACE(r, "result part %zu of %zu from host %lld", got + 1, n_parts,
			      (long long)m->host_id);
		got++;
	}
	free(pl);
	peer_close(c);
	pthread_mutex_lock(&r->mu);
	r->st_parts[s->agg] = got;
	r->st_complete[s->agg] = complete;
	r->st_done[s->agg] = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* ---- The call ---- */

static cot_err check_params(const allreduce_params *p, cot_errbuf *eb)
{
	if (!p->members || p->n < 1 || p->n > ALLREDUCE_MAX_MEMBERS || p->self >= p->n ||
	    !p->ctx || (p->n > 1 && !p->dialer) || !p->grad || p->len == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid all-reduce parameters");
	if (!comp_kind_valid(p->send_comp) || !comp_kind_valid(p->result_comp))
		return cot_seterr(eb, COT_ERR_INVALID, "unknown compression");
	if (p->members[p->self].host_id != peer_ctx_host_id(p->ctx))
		return cot_seterr(eb, COT_ERR_INVALID, "member %zu is host %lld, not us (host %lld)",
		                  p->self, (long long)p->members[p->self].host_id,
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
				return cot_seterr(eb, COT_ERR_INVALID, "ranges of members %zu and %zu overlap",
				                  j, i);
		}
		covered += range_len(a);
	}
	if (covered != p->len)
		return cot_seterr(eb, COT_ERR_INVALID, "the ranges cover %llu of %zu values",
		                  (unsigned long long)covered, p->len);
	if (range_len(&p->members[p->self]) && p->n > 1 && !p->lst)
		return cot_seterr(eb, COT_ERR_INVALID, "an aggregator needs a listener");
	return COT_OK;
}

static void run_free(run *r)
{
	if (r->c)
		for (size_t i = 0; i < r->p->n; i++)
			free(r->c[i].data);
	for (size_t i = 0; r->rep && i < r->p->n; i++) {
		free(r->rep[i]);
		free(r->rids[i]);
	}
	free(r->c);
	free(r->claimed);
	free(r->claimed_stream);
	free(r->parts_in);
	free(r->order);
	free(r->spec_bytes);
	free(r->spec_tmp);
	free(r->spec_x);
	free(r->st_done);
	free(r->st_parts);
	free(r->st_complete);
	free(r->st_abandon);
	free(r->st_busy);
	free(r->stream_end);
	free(r->pace_next);
	free(r->pacing);
	free(r->rep);
	free(r->rep_n);
	free(r->rids);
	free(r->rids_n);
	free(r->rtotal);
	free(r->acc_payload);
	free(r->res_payload);
	free(r->fin_bytes);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	pthread_cond_destroy(&r->pace_cv);
}

/* The intersection of every aggregator's report, ascending (mu held). */
static size_t intersect(run *r, int64_t *fin)
{
	const allreduce_params *p = r->p;
	size_t k = 0;
	for (size_t i = 0; i < p->n; i++) {
		int64_t id = p->members[i].host_id;
		int all = 1;
		for (size_t a = 0; all && a < p->n; a++) {
			if (!range_len(&p->members[a]))
				continue;
			int found = 0;
			for (size_t j = 0; j < r->rep_n[a]; j++)
				found |= r->rep[a][j] == id;
			all = found;
		}
		if (all)
			fin[k++] = id;
	}
	qsort(fin, k, sizeof *fin, cmp_i64);
	return k;
}

cot_err allreduce_run(const allreduce_params *p, float *out, allreduce_result *res,
                      cot_errbuf *eb)
{
	memset(res, 0, sizeof *res);
	cot_err rc = check_params(p, eb);
	if (rc)
		return rc;
	const allreduce_member *me = &p->members[p->self];
	run r = { .p = p, .out = out };
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r.cv, &ca);
	pthread_cond_init(&r.pace_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&r.mu, NULL);
	r.agg = range_len(me) > 0;
	r.a_len = (size_t)range_len(me);
	r.c = calloc(p->n, sizeof *r.c);
	r.claimed = calloc(p->n, 1);
	r.rep = calloc(p->n, sizeof *r.rep);
	r.rep_n = calloc(p->n, sizeof *r.rep_n);
	r.rids = calloc(p->n, sizeof *r.rids);
	r.rids_n = calloc(p->n, sizeof *r.rids_n);
	r.rtotal = calloc(p->n, sizeof *r.rtotal);
	r.claimed_stream = calloc(p->n, 1);
	r.parts_in = calloc(p->n, sizeof *r.parts_in);
	r.order = calloc(p->n, sizeof *r.order);
	r.spec_x = calloc(p->n, sizeof *r.spec_x);
	r.st_done = calloc(p->n, 1);
	r.st_parts = calloc(p->n, sizeof *r.st_parts);
	r.st_complete = calloc(p->n, 1);
	r.st_abandon = calloc(p->n, 1);
	r.st_busy = calloc(p->n, 1);
	r.stream_end = calloc(p->n, 1);
	r.pace_next = calloc(p->n, sizeof *r.pace_next);
	r.pacing = calloc(p->n, 1);
	r.t0 = deadline_now_ms();
	r.n_parts = (r.a_len + PART_VALUES - 1) / PART_VALUES;
	if (r.agg) {
		r.spec_bytes = malloc(comp_encoded_size(p->result_comp, r.a_len));
		r.spec_tmp = malloc((r.a_len < PART_VALUES ? r.a_len : PART_VALUES) * sizeof *r.spec_tmp);
		r.spec_ok = r.spec_bytes && r.spec_tmp;
	}
	sender *ss = calloc(p->n, sizeof *ss);
	int64_t *fin = calloc(p->n, sizeof *fin);
	size_t n_fin = 0, n_senders = 0;
	pthread_t acceptor;
	int have_acceptor = 0;
	if (!r.c || !r.claimed || !r.rep || !r.rep_n || !r.rids || !r.rids_n || !r.rtotal || !ss ||
	    !fin || !r.claimed_stream || !r.parts_in || !r.order || !r.spec_x || !r.st_done ||
	    !r.st_parts || !r.st_complete || !r.st_abandon || !r.st_busy || !r.stream_end ||
	    !r.pace_next || !r.pacing) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < p->n; i++)
		r.order[i] = i;
	for (size_t i = 1; i < p->n; i++)   /* insertion sort by host id: n is small */
		for (size_t j = i; j > 0 && p->members[r.order[j]].host_id <
		                            p->members[r.order[j - 1]].host_id; j--) {
			size_t t = r.order[j];
			r.order[j] = r.order[j - 1];
			r.order[j - 1] = t;
		}
	for (size_t i = 0; i < p->n; i++)
		r.rep_pending += range_len(&p->members[i]) > 0;

	if (r.agg) {
		/* Our own slice goes through the same encoding and checks. */
		size_t elen = comp_encoded_size(p->send_comp, r.a_len);
		unsigned char *enc = malloc(elen ? elen : 1);
		if (!enc || comp_encode(p->send_comp, p->grad + me->start, r.a_len, enc, elen, eb)) {
			free(enc);
			rc = cot_seterr(eb, COT_ERR_NOMEM, "could not encode our own slice");
			goto out;
		}
		pthread_mutex_lock(&r.mu);
		take_slice(&r, p->self, 0, r.a_len, enc, elen);
		r.parts_in[p->self] = r.n_parts;
		pthread_mutex_unlock(&r.mu);
		free(enc);
		if (p->n > 1) {
			if (pthread_create(&acceptor, NULL, acceptor_main, &r)) {
				rc = cot_seterr(eb, COT_ERR_NOMEM, "could not start a thread");
				goto out;
			}
			have_acceptor = 1;
		}
	}
	/* Every sender is paced from the start, connected or not: one that
	 * connects early must not run ahead on its aggregator while the others
	 * still connect, or part 0 to the others queues behind its bytes and
	 * the first results come late (pace_wait). */
	for (size_t i = 0; i < p->n; i++)
		r.pacing[i] = i != p->self && range_len(&p->members[i]) > 0;
	for (size_t i = 0; i < p->n; i++) {
		if (i == p->self || !range_len(&p->members[i]))
			continue;
		ss[n_senders].r = &r;
		ss[n_senders].agg = i;
		if (pthread_create(&ss[n_senders].th, NULL, sender_main, &ss[n_senders])) {
			fail(&r, "could not start a thread");
			for (size_t j = i; j < p->n; j++)
				pace_done(&r, j, SIZE_MAX);
			break;
		}
		ss[n_senders].have_st = !p->no_stream &&
			!pthread_create(&ss[n_senders].st, NULL, streamer_main, &ss[n_senders]);
		if (!ss[n_senders].have_st) {   /* results come on the slice connection */
			pthread_mutex_lock(&r.mu);
			r.st_done[i] = 1;
			pthread_mutex_unlock(&r.mu);
		}
		n_senders++;
	}

	pthread_mutex_lock(&r.mu);
	if (r.agg) {
		while (r.arrived < p->n - 1 && wait_a_bit(&r, p->collect_deadline))
			;
		if (freeze(&r))
			agg_abort(&r, "out of memory");
		TRACE(&r, "%s", "slices frozen");
	}
	while (r.rep_pending > 0 && !r.failed && wait_a_bit(&r, p->deadline))
		;
	if (r.rep_pending > 0 || r.failed) {
		if (!r.failed) {
			snprintf(r.feb.msg, sizeof r.feb.msg,
			         "timed out waiting for the aggregators' ACCEPTED reports");
			r.failed = 1;
		}
		char why[300];
		snprintf(why, sizeof why, "host %lld could not learn the included set: %.200s",
		         (long long)me->host_id, r.feb.msg);
		if (r.agg)
			agg_abort(&r, why);
	} else {
		n_fin = intersect(&r, fin);
		uint64_t total = 0;
		for (size_t k = 0; k < n_fin; k++)
			total += p->members[member_index(p, fin[k])].samples;
		res->total_samples = total;
		if (r.agg) {
			cot_errbuf aeb = {0};
			/* Every member included: the streamed parts are the result
			 * (the last ones may still be summing). */
			if (n_fin == p->n)
				while (r.spec_ok && r.spec_done < r.n_parts && wait_a_bit(&r, p->deadline))
					;
			int streamed = n_fin == p->n && r.spec_ok && r.spec_done == r.n_parts;
			if (!streamed)
				spec_stop(&r);
			if (streamed ? agg_streamed(&r, fin, n_fin, total, &aeb)
			             : agg_finish(&r, fin, n_fin, total, &aeb)) {
				agg_abort(&r, aeb.msg);
				snprintf(r.feb.msg, sizeof r.feb.msg, "could not reduce our range: %.400s",
				         aeb.msg);
				r.failed = 1;
			}
		}
	}
	pthread_mutex_unlock(&r.mu);

out:
	for (size_t i = 0; i < n_senders; i++) {
		pthread_join(ss[i].th, NULL);
		if (ss[i].have_st)
			pthread_join(ss[i].st, NULL);
	}
	if (have_acceptor) {
		pthread_mutex_lock(&r.mu);
		spec_stop(&r);
		if (r.agg_state == AGG_PENDING)
			agg_abort(&r, "the aggregator failed");
		r.stop_accept = 1;
		pthread_mutex_unlock(&r.mu);
		pthread_join(acceptor, NULL);
	}
	if (rc == COT_OK && r.failed)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "%s", r.feb.msg);
	/* Every RESULT must name the set we computed: else the aggregators
	 * disagreed and the vector is not one consistent sum. */
	for (size_t a = 0; rc == COT_OK && a < p->n; a++) {
		if (a == p->self || !range_len(&p->members[a]))
			continue;
		if (r.rids_n[a] != n_fin || r.rtotal[a] != res->total_samples ||
		    (n_fin && memcmp(r.rids[a], fin, n_fin * sizeof *fin)))
			rc = cot_seterr(eb, COT_ERR_NETWORK,
			                "aggregator host %lld summed another set of contributions",
			                (long long)p->members[a].host_id);
	}
	if (rc == COT_OK) {
		res->included = fin;
		res->n_included = n_fin;
		fin = NULL;
		res->dropped = calloc(p->n, sizeof *res->dropped);
		res->refused = calloc(p->n, sizeof *res->refused);
		if (!res->dropped || !res->refused)
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		for (size_t i = 0; rc == COT_OK && i < p->n; i++) {
			const allreduce_member *m = &p->members[i];
			int in = bsearch(&m->host_id, res->included, res->n_included,
			                 sizeof(int64_t), cmp_i64) != NULL;
			if (!in) {
				allreduce_drop *d = &res->dropped[res->n_dropped++];
				d->host_id = m->host_id;
				d->samples = m->samples;
				snprintf(d->reason, sizeof d->reason, "%s",
				         r.agg && r.c[i].reason[0] ? r.c[i].reason : "not included");
				res->dropped_samples += m->samples;
			}
			if (r.agg && r.c[i].state == C_REFUSED) {
				allreduce_drop *d = &res->refused[res->n_refused++];
				d->host_id = m->host_id;
				d->samples = m->samples;
				snprintf(d->reason, sizeof d->reason, "%s", r.c[i].reason);
			}
		}
	}
	if (rc)
		allreduce_result_free(res);
	TRACE(&r, "done: %s", rc ? eb->msg : "ok");
	free(fin);
	free(ss);
	run_free(&r);
	return rc;
}

void allreduce_result_free(allreduce_result *res)
{
	free(res->included);
	free(res->dropped);
	free(res->refused);
	memset(res, 0, sizeof *res);
}
