/* cotrain tests: the butterfly all-reduce (shared/averaging/allreduce.h) between member
 * threads over loopback TLS, with certificates from a test CA.
 *
 * Each case starts one thread per member (its own identity, listener and
 * dialer) and checks what every member ends with: the same bytes, equal to
 * the sum computed here independently (decode each included slice as the
 * wire does, add in ascending host id order in double, round once, apply the
 * result compression), and the dropped contributions.  alarm() bounds the
 * whole test. */
#include "shared/averaging/allreduce.h"
#include "shared/averaging/centered_clip.h"
#include "shared/averaging/compress.h"
#include "shared/common/deadline.h"
#include "shared/common/sketch.h"
#include "shared/peer/dialer.h"
#include "shared/peer/hello.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXN 5
#define PROJECT "avgtest"
#define OUTSIDER 99

/* Member i is host hid[i]: not in member order, so that the summation order
 * (by host id) differs from the member order. */
static const int64_t hid[MAXN] = { 12, 11, 14, 13, 15 };
static char *ca_pem;
static peer_ctx *ctx[MAXN], *outsider_ctx;
static uint64_t rng = 88172645463325252ull;

static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static peer_ctx *make_ctx(pki_ca *ca, int64_t id)
{
	cot_errbuf eb = { 0 };
	char *key = NULL, *pub = NULL, *cert = NULL;
	peer_ctx *c = NULL;
	if (pki_host_key_generate(&key, &pub, &eb) ||
	    pki_ca_sign_host(ca, pub, strlen(pub), id, 0, 0, &cert, &eb))
		bail_out("could not make host %lld: %s", (long long)id, eb.msg);
	peer_identity pi = { PROJECT, ca_pem, strlen(ca_pem), cert, strlen(cert), key, strlen(key) };
	if (peer_ctx_new(&pi, &c, &eb))
		bail_out("could not make a peer context: %s", eb.msg);
	free(key);
	free(pub);
	free(cert);
	return c;
}

enum { PRESENT, ABSENT_CLOSED, ABSENT_SILENT };

typedef struct {
	size_t n, len;
	uint64_t start[MAXN], end[MAXN], samples[MAXN];
	int absent[MAXN];
	int no_stream[MAXN]; /* the member opens no stream connections */
	int send_comp, result_comp;
	int collect_ms, deadline_ms;
	float *grad[MAXN];
	listener *lst[MAXN];
	allreduce_member m[MAXN];
	/* per member */
	float *out[MAXN];
	allreduce_result res[MAXN];
	cot_err rc[MAXN];
	cot_errbuf eb[MAXN];
	int64_t elapsed[MAXN];
	int64_t t0;
	int cclip; /* aggregators combine with CenteredClip, tau 0.02 */
} group;

typedef struct {
	group *g;
	size_t self;
	pthread_t th;
} member_job;

/* A group of n members over len values with ranges split as given by ends
 * (member i aggregates [ends[i-1], ends[i])), random gradient sums. */
static group *group_new(size_t n, size_t len, const uint64_t *ends, const uint64_t *samples)
{
	group *g = calloc(1, sizeof *g);
	g->n = n;
	g->len = len;
	g->collect_ms = 3000;
	g->deadline_ms = 6000;
	for (size_t i = 0; i < n; i++) {
		g->start[i] = i ? ends[i - 1] : 0;
		g->end[i] = ends[i];
		g->samples[i] = samples[i];
		g->grad[i] = malloc(len * sizeof(float));
		g->out[i] = calloc(len, sizeof(float));
		for (size_t j = 0; j < len; j++)
			g->grad[i][j] = (float)(urand() * 0.01 * (double)samples[i]);
	}
	return g;
}

static void group_free(group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		free(g->grad[i]);
		free(g->out[i]);
		allreduce_result_free(&g->res[i]);
	}
	free(g);
}

static void *member_main(void *arg)
{
	member_job *j = arg;
	group *g = j->g;
	dialer *d = NULL;
	if (dialer_direct_new(&d, &g->eb[j->self])) {
		g->rc[j->self] = COT_ERR_NOMEM;
		return NULL;
	}
	allreduce_params p = {
		.members = g->m,
		.n = g->n,
		.self = j->self,
		.round = 7,
		.grad = g->grad[j->self],
		.len = g->len,
		.send_comp = g->send_comp,
		.result_comp = g->result_comp,
		.ctx = ctx[j->self],
		.dialer = d,
		.lst = g->lst[j->self],
		.collect_deadline = g->t0 + g->collect_ms,
		.deadline = g->t0 + g->deadline_ms,
		.no_stream = g->no_stream[j->self],
		.aggregation = g->cclip ? ALLREDUCE_CENTERED_CLIP : ALLREDUCE_SUM,
		.clip_tau = 0.02,
		.clip_iters = 20,
	};
	g->rc[j->self] = allreduce_run(&p, g->out[j->self], &g->res[j->self], &g->eb[j->self]);
	g->elapsed[j->self] = deadline_now_ms() - g->t0;
	dialer_free(d);
	return NULL;
}

/* Open listeners (closed again for ABSENT_CLOSED members), then run every
 * present member in its own thread and wait for all.  before(), when given,
 * runs after the listeners exist and before the members start. */
static void group_run(group *g, void (*before)(group *))
{
	cot_errbuf eb = { 0 };
	for (size_t i = 0; i < g->n; i++) {
		if (listener_open("127.0.0.1", 0, 0, &g->lst[i], &eb))
			bail_out("could not listen: %s", eb.msg);
		g->m[i] = (allreduce_member){ hid[i],      "127.0.0.1", listener_port(g->lst[i]),
			                      g->start[i], g->end[i],   g->samples[i] };
		if (g->absent[i] == ABSENT_CLOSED) {
			listener_close(g->lst[i]);
			g->lst[i] = NULL;
		}
	}
	if (before)
		before(g);
	g->t0 = deadline_now_ms();
	member_job jobs[MAXN];
	for (size_t i = 0; i < g->n; i++) {
		jobs[i] = (member_job){ g, i, 0 };
		if (g->absent[i] == PRESENT && pthread_create(&jobs[i].th, NULL, member_main, &jobs[i]))
			bail_out("could not start a member thread");
	}
	for (size_t i = 0; i < g->n; i++)
		if (g->absent[i] == PRESENT)
			pthread_join(jobs[i].th, NULL);
	for (size_t i = 0; i < g->n; i++)
		listener_close(g->lst[i]);
}

static int cmp_member_by_host(const void *a, const void *b)
{
	int64_t x = hid[*(const size_t *)a], y = hid[*(const size_t *)b];
	return x < y ? -1 : x > y;
}

/* What every member must hold, computed here from the inputs: for each
 * aggregator's range, each included member's slice through send_comp, summed
 * in ascending host id order in double, rounded once, through result_comp. */
static float *expected(group *g, const int *included)
{
	float *e = calloc(g->len, sizeof *e);
	size_t order[MAXN], k = 0;
	for (size_t i = 0; i < g->n; i++)
		if (included[i])
			order[k++] = i;
	qsort(order, k, sizeof *order, cmp_member_by_host);
	for (size_t a = 0; a < g->n; a++) {
		size_t n = g->end[a] - g->start[a];
		if (!n)
			continue;
		double *acc = calloc(n, sizeof *acc);
		float *dec = malloc(n * sizeof *dec), *sum = malloc(n * sizeof *sum);
		unsigned char *buf = malloc(comp_encoded_size(COMP_NONE, n));
		for (size_t j = 0; j < k; j++) {
			size_t bl = comp_encoded_size(g->send_comp, n);
			comp_encode(g->send_comp, g->grad[order[j]] + g->start[a], n, buf, bl, NULL);
			comp_decode(g->send_comp, buf, bl, dec, n, NULL);
			for (size_t i = 0; i < n; i++)
				acc[i] += (double)dec[i];
		}
		for (size_t i = 0; i < n; i++)
			sum[i] = (float)acc[i];
		size_t rl = comp_encoded_size(g->result_comp, n);
		comp_encode(g->result_comp, sum, n, buf, rl, NULL);
		comp_decode(g->result_comp, buf, rl, e + g->start[a], n, NULL);
		free(acc);
		free(dec);
		free(sum);
		free(buf);
	}
	return e;
}

/* Every present member succeeded with identical bytes equal to expected(),
 * the included set and total samples as given, the others reported dropped. */
static void check_group(group *g, const int *included, const char *what)
{
	int all_ok = 1;
	for (size_t i = 0; i < g->n; i++)
		if (g->absent[i] == PRESENT && g->rc[i] != COT_OK) {
			diag("%s: member %zu (host %lld): %s", what, i, (long long)hid[i], g->eb[i].msg);
			all_ok = 0;
		}
	ok(all_ok, "%s: every member finished", what);
	if (!all_ok)
		return;
	size_t first = 0;
	while (g->absent[first] != PRESENT)
		first++;
	int same = 1;
	for (size_t i = 0; i < g->n; i++)
		if (g->absent[i] == PRESENT && memcmp(g->out[i], g->out[first], g->len * sizeof(float)))
			same = 0;
	ok(same, "%s: every member holds the same bytes", what);

	float *e = expected(g, included);
	ok(memcmp(e, g->out[first], g->len * sizeof(float)) == 0,
	   "%s: the sum is bit-exact: in host id order, in double, rounded once", what);

	uint64_t total = 0, dropped = 0;
	size_t n_inc = 0;
	for (size_t i = 0; i < g->n; i++) {
		if (included[i])
			total += g->samples[i], n_inc++;
		else
			dropped += g->samples[i];
	}
	int sets = 1;
	for (size_t i = 0; i < g->n; i++) {
		if (g->absent[i] != PRESENT)
			continue;
		allreduce_result *r = &g->res[i];
		if (r->total_samples != total || r->n_included != n_inc || r->dropped_samples != dropped ||
		    r->n_dropped != g->n - n_inc)
			sets = 0;
		for (size_t k = 0; k < r->n_included; k++)
			if (k && r->included[k] <= r->included[k - 1])
				sets = 0;
		for (size_t k = 0; k < r->n_dropped; k++)
			for (size_t m = 0; m < g->n; m++)
				if (hid[m] == r->dropped[k].host_id &&
				    (included[m] || r->dropped[k].samples != g->samples[m]))
					sets = 0;
	}
	ok(sets, "%s: %zu included with %llu samples, %llu samples reported dropped", what, n_inc,
	   (unsigned long long)total, (unsigned long long)dropped);

	/* Without compression, the mean each member derives (its sum over the
	 * total_samples the all-reduce told it) is the weighted mean of the
	 * members' per-sample means, weights their sample counts, computed
	 * here from the test's own numbers: grad[i] is member i's sum over
	 * samples[i] samples, so its mean is grad[i] / samples[i]. */
	if (g->send_comp == COMP_NONE && g->result_comp == COMP_NONE && total) {
		int close = 1;
		for (size_t m = 0; m < g->n; m++) {
			if (g->absent[m] != PRESENT)
				continue;
			double told = (double)g->res[m].total_samples;
			for (size_t j = 0; j < g->len; j++) {
				double mean = 0, err = 0;
				for (size_t i = 0; i < g->n; i++)
					if (included[i] && g->samples[i]) {
						double w = (double)g->samples[i] / (double)total;
						double mi = (double)g->grad[i][j] / (double)g->samples[i];
						mean += w * mi;
						err += fabs(w * mi);
					}
				double got = told > 0 ? (double)g->out[m][j] / told : NAN;
				if (!(fabs(got - mean) <= 1.2e-7 * err + 1e-30))
					close = 0;
			}
		}
		ok(close,
		   "%s: each member's sum over its total_samples is the samples-weighted mean of "
		   "the members' own means",
		   what);
	}
	free(e);
}

static const int ALL[MAXN] = { 1, 1, 1, 1, 1 };

static void test_sizes(void)
{
	uint64_t s1[] = { 5 }, e1[] = { 1000 };
	group *g = group_new(1, 1000, e1, s1);
	group_run(g, NULL);
	check_group(g, ALL, "group of 1");
	group_free(g);

	uint64_t s2[] = { 3, 9 }, e2[] = { 500, 1000 };
	g = group_new(2, 1000, e2, s2);
	group_run(g, NULL);
	check_group(g, ALL, "group of 2, equal shares");
	group_free(g);

	uint64_t s4[] = { 4, 8, 1, 16 }, e4[] = { 750, 1500, 2250, 3000 };
	g = group_new(4, 3000, e4, s4);
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, equal shares");
	group_free(g);

	/* Unequal shares; member 2 cannot accept connections (empty range). */
	uint64_t u4[] = { 100, 1500, 1500, 3000 };
	g = group_new(4, 3000, u4, s4);
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, unequal shares, one empty range");
	group_free(g);

	/* Compressed on the wire: 8-bit slices over several blocks, fp16 results. */
	uint64_t c4[] = { 9000, 9000, 15000, 20000 };
	g = group_new(4, 20000, c4, s4);
	g->send_comp = COMP_BLOCK8;
	g->result_comp = COMP_FP16;
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, 8-bit slices, fp16 results");
	group_free(g);

	g = group_new(4, 3000, e4, s4);
	g->send_comp = COMP_FP16;
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, fp16 slices, raw results");
	group_free(g);

	/* Ranges of many parts and of one, one empty: the senders pace their
	 * parts over ranges of 8, 5 and 1 parts (doc/averaging.md, "Pacing"),
	 * and the results stream part by part. */
	uint64_t m4[] = { 120000, 120000, 190000, 200000 };
	g = group_new(4, 200000, m4, s4);
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, ranges of 8, 0, 5 and 1 parts");
	group_free(g);

	/* Members whose stream connections never come (a second punched
	 * connection through a NAT can fail where the first worked): every
	 * aggregator, though it streamed its whole sum, sends them that sum on
	 * the slice connection, and the RESULT says "as sent in parts". */
	g = group_new(4, 200000, m4, s4);
	g->no_stream[0] = g->no_stream[2] = 1;
	group_run(g, NULL);
	check_group(g, ALL, "group of 4, two members without stream connections");
	group_free(g);
}

/* The reason member agg's aggregator gave for refusing member who, or NULL. */
static const char *refused_by(group *g, size_t agg, size_t who)
{
	for (size_t k = 0; k < g->res[agg].n_refused; k++)
		if (g->res[agg].refused[k].host_id == hid[who])
			return g->res[agg].refused[k].reason;
	return NULL;
}

static void test_bad_gradients(void)
{
	uint64_t s4[] = { 4, 8, 2, 16 }, e4[] = { 750, 1500, 2250, 3000 };
	group *g = group_new(4, 3000, e4, s4);
	g->grad[2][10] = NAN;       /* in member 0's range only */
	g->grad[3][800] = INFINITY; /* in member 1's range only */
	group_run(g, NULL);
	const int inc[MAXN] = { 1, 1, 0, 0 };
	check_group(g, inc, "NaN and Inf");
	const char *why2 = refused_by(g, 0, 2), *why3 = refused_by(g, 1, 3);
	ok(why2 && strstr(why2, "not finite") && why3 && strstr(why3, "not finite") && !refused_by(g, 1, 2) &&
	           !refused_by(g, 0, 3),
	   "the aggregator that saw NaN or Inf reports refusing the sender (\"%s\")", why2 ? why2 : "none");
	group_free(g);

	/* -Inf, and a negative NaN, refused the same way. */
	g = group_new(4, 3000, e4, s4);
	g->grad[1][2900] = -INFINITY; /* in member 3's range only */
	g->grad[0][1600] = -NAN;      /* in member 2's range only */
	group_run(g, NULL);
	const int inc_neg[MAXN] = { 0, 0, 1, 1 };
	check_group(g, inc_neg, "-Inf and -NaN");
	ok(refused_by(g, 3, 1) && strstr(refused_by(g, 3, 1), "not finite") && refused_by(g, 2, 0) &&
	           strstr(refused_by(g, 2, 0), "not finite"),
	   "the aggregators that saw -Inf or -NaN refuse the senders");
	group_free(g);

	/* Same with 8-bit slices: the bad block cannot hide in the encoding. */
	g = group_new(4, 3000, e4, s4);
	g->send_comp = COMP_BLOCK8;
	g->grad[1][2000] = NAN;
	group_run(g, NULL);
	const int inc1[MAXN] = { 1, 0, 1, 1 };
	check_group(g, inc1, "NaN in an 8-bit slice");
	group_free(g);

	/* A NaN in the second part of a range of several: the first parts were
	 * already streamed as the sum over all members; the aggregator stops
	 * streaming, and the full RESULT of the others replaces them. */
	uint64_t m4[] = { 120000, 120000, 190000, 200000 };
	g = group_new(4, 200000, m4, s4);
	g->grad[3][150000] = NAN; /* part 1 of member 2's range */
	group_run(g, NULL);
	const int inc3[MAXN] = { 1, 1, 1, 0 };
	check_group(g, inc3, "NaN in a later part of a range of several");
	group_free(g);

	/* One aggregator for a range of 68 MB (more than a frame may carry) and
	 * a member dropped: the sum of the others is not the streamed one, so
	 * it goes to every member in parts (a single RESULT frame could not
	 * hold it). */
	uint64_t big = 17u << 20, b3[] = { big, big, big }, sb[] = { 3, 5, 7 };
	g = group_new(3, big, b3, sb);
	g->collect_ms = 30000;
	g->deadline_ms = 60000;
	g->grad[2][big - 1] = NAN;
	group_run(g, NULL);
	const int inc4[MAXN] = { 1, 1, 0 };
	check_group(g, inc4, "a member dropped from a range of 68 MB");
	group_free(g);

	g = group_new(4, 3000, e4, s4);
	for (size_t j = 0; j < 3000; j++)
		g->grad[3][j] *= 1000.0f;
	group_run(g, NULL);
	const int inc2[MAXN] = { 1, 1, 1, 0 };
	check_group(g, inc2, "outlier norm");
	int all = 1;
	for (size_t a = 0; a < 4; a++) {
		const char *why = refused_by(g, a, 3);
		if (!why || !strstr(why, "median"))
			all = 0;
	}
	ok(all, "every aggregator refused the outlier for its norm (\"%s\")",
	   refused_by(g, 0, 3) ? refused_by(g, 0, 3) : "none");
	group_free(g);

	/* A member with 100 times the samples of the others sends a sum 100
	 * times larger: its norm per sample is theirs, so it is no outlier. */
	uint64_t sm[] = { 2, 3, 4, 200 };
	g = group_new(4, 3000, e4, sm);
	group_run(g, NULL);
	const int inc5[MAXN] = { 1, 1, 1, 1 };
	check_group(g, inc5, "one member with 100 times the samples of the others");
	group_free(g);
}

static void test_faults(void)
{
	/* A sender that never shows up: dropped at the collect deadline. */
	uint64_t s3[] = { 5, 6, 7 }, e3[] = { 400, 1000, 1000 };
	group *g = group_new(3, 1000, e3, s3);
	g->absent[2] = ABSENT_CLOSED;
	g->collect_ms = 1000;
	group_run(g, NULL);
	const int inc[MAXN] = { 1, 1, 0 };
	check_group(g, inc, "a sender that dies before sending");
	group_free(g);

	/* An aggregator that is gone (its port refuses connections), and one
	 * that accepts TCP but never answers: a clean error for everyone,
	 * within the deadline. */
	for (int how = ABSENT_CLOSED; how <= ABSENT_SILENT; how++) {
		uint64_t e[] = { 300, 700, 1000 };
		g = group_new(3, 1000, e, s3);
		g->absent[1] = how;
		g->collect_ms = 1000;
		g->deadline_ms = 2500;
		group_run(g, NULL);
		int clean = 1;
		for (size_t i = 0; i < 3; i++) {
			if (i == 1)
				continue;
			if (g->rc[i] != COT_ERR_NETWORK || g->elapsed[i] > g->deadline_ms + 500 ||
			    !strstr(g->eb[i].msg, "host 11"))
				clean = 0;
			diag("member %zu after %lld ms: %s", i, (long long)g->elapsed[i], g->eb[i].msg);
		}
		ok(clean, "an aggregator that %s: every member fails with a network error in time",
		   how == ABSENT_CLOSED ? "is gone" : "never answers");
		group_free(g);
	}
}

/* ---- A host outside the group ---- */

typedef struct {
	int fd;
	cot_err rc;
	cot_errbuf eb;
	pthread_t th;
} outsider_job;

static void *outsider_main(void *arg)
{
	outsider_job *o = arg;
	peer_conn *c = NULL;
	o->rc = peer_handshake(outsider_ctx, o->fd, PEER_CLIENT, hid[0], deadline_after_ms(5000), &c, &o->eb);
	if (o->rc == COT_OK) {
		hello_msg ours = { .proto_min = HELLO_PROTO_MIN,
			           .proto_max = HELLO_PROTO_MAX,
			           .host_id = OUTSIDER,
			           .round = 7,
			           .max_payload = FRAME_PAYLOAD_DEFAULT_MAX },
		          theirs;
		uint16_t ver;
		snprintf(ours.project, sizeof ours.project, "%s", PROJECT);
		o->rc = hello_exchange(c, &ours, &theirs, &ver, deadline_after_ms(5000), &o->eb);
	}
	peer_close(c);
	return NULL;
}

static outsider_job outsider;

/* Queue the outsider's TCP connection on member 0's listener before the
 * members start, so that it is accepted first. */
static void outsider_dial(group *g)
{
	dialer *d = NULL;
	dialer_result dr;
	dialer_target t = { "127.0.0.1", g->m[0].port, hid[0] };
	if (dialer_direct_new(&d, &outsider.eb) ||
	    dialer_connect(d, &t, deadline_after_ms(2000), &dr, &outsider.eb))
		bail_out("outsider could not connect: %s", outsider.eb.msg);
	dialer_free(d);
	outsider.fd = dr.fd;
	if (pthread_create(&outsider.th, NULL, outsider_main, &outsider))
		bail_out("could not start the outsider");
}

static void test_outsider(void)
{
	uint64_t s2[] = { 3, 4 }, e2[] = { 600, 1000 };
	group *g = group_new(2, 1000, e2, s2);
	group_run(g, outsider_dial);
	pthread_join(outsider.th, NULL);
	ok(outsider.rc == COT_ERR_AUTH && strstr(outsider.eb.msg, "not a member"),
	   "a host outside the group is refused (%s: %s)", cot_strerror(outsider.rc), outsider.eb.msg);
	check_group(g, ALL, "group of 2 with an outsider knocking");
	group_free(g);
}

/* Connections nobody in the group made, queued on every member's
 * listener before the members start: JUNK_CLOSED opened and closed at once
 * (a port scan), JUNK_HALF that send the first bytes of a TLS record and
 * then nothing (a half-open handshake), held until the group is done. */
#define JUNK_CLOSED 40
#define JUNK_HALF 8
static int junk_half[MAXN][JUNK_HALF];

static void junk_dial(group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(g->m[i].port) };
		inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
		for (int k = 0; k < JUNK_CLOSED + JUNK_HALF; k++) {
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
				bail_out("could not connect to member %zu's listener", i);
			if (k < JUNK_CLOSED) {
				close(fd);
				continue;
			}
			static const unsigned char hello[] = { 0x16, 0x03, 0x01, 0x02, 0x00 };
			if (write(fd, hello, sizeof hello) != (ssize_t)sizeof hello)
				bail_out("could not write to member %zu's listener", i);
			junk_half[i][k - JUNK_CLOSED] = fd;
		}
	}
}

static void test_junk_connections(void)
{
	uint64_t s3[] = { 3, 4, 5 }, e3[] = { 300, 700, 1000 };
	group *g = group_new(3, 1000, e3, s3);
	group_run(g, junk_dial);
	for (size_t i = 0; i < g->n; i++)
		for (int k = 0; k < JUNK_HALF; k++)
			close(junk_half[i][k]);
	check_group(g, ALL,
	            "group of 3 with 40 scans and 8 half-open TLS handshakes queued on every listener");
	group_free(g);
}

static void test_params(void)
{
	float grad[10] = { 0 }, out[10];
	allreduce_result res;
	cot_errbuf eb = { 0 };
	allreduce_member m[2] = { { hid[0], "127.0.0.1", 1, 0, 6, 1 }, { hid[1], "127.0.0.1", 1, 5, 10, 1 } };
	allreduce_params p = { .members = m,
		               .n = 2,
		               .self = 0,
		               .grad = grad,
		               .len = 10,
		               .ctx = ctx[0],
		               .deadline = deadline_after_ms(1000) };
	ok(allreduce_run(&p, out, &res, &eb) == COT_ERR_INVALID, "overlapping ranges refused (%s)", eb.msg);
	m[0].end = 4;
	ok(allreduce_run(&p, out, &res, &eb) == COT_ERR_INVALID, "ranges with a gap refused (%s)", eb.msg);
	m[0].end = 5;
	p.self = 1;
	ok(allreduce_run(&p, out, &res, &eb) == COT_ERR_INVALID, "a self that is not us refused (%s)",
	   eb.msg);
}

/* The stage across groups for test_alone: *arg counts the calls; -1
 * makes it fail. */
static cot_err alone_stage(void *arg, float *sum, uint64_t start, uint64_t end, uint64_t samples,
                           cot_errbuf *eb)
{
	int *calls = arg;
	if (*calls < 0)
		return cot_seterr(eb, COT_ERR_NETWORK, "the stage across groups failed");
	(*calls)++;
	for (uint64_t i = start; i < end; i++)
		sum[i] /= (float)samples;
	return COT_OK;
}

static int stage_calls;

/* A group of one (allreduce_alone): its own bytes exactly, and the
 * sketches allreduce_run gives a lone member that aggregates everything
 * and sends nothing on a wire (fp32): partial, result and received equal,
 * error bounds 0, its slice kept. */
static void test_alone(void)
{
	enum { N = 10000, K = 16 };
	float *grad = malloc(N * sizeof *grad), *out = malloc(N * sizeof *out),
	      *ref = malloc(N * sizeof *ref);
	for (size_t j = 0; j < N; j++)
		grad[j] = (float)(urand() - 0.5) * (j % 7 ? 1e-3f : 10.0f);
	allreduce_member m = { hid[0], NULL, 0, 0, N, 8 };
	allreduce_params p = { .members = &m,
		               .n = 1,
		               .grad = grad,
		               .len = N,
		               .ctx = ctx[0],
		               .deadline = deadline_after_ms(5000),
		               .collect_deadline = deadline_after_ms(4000),
		               .sketch_seed = 0x5eed2,
		               .sketch_k = K,
		               .keep_slices = 1 };
	allreduce_result a, r;
	cot_errbuf eb = { 0 }, eb2 = { 0 };
	cot_err rc = allreduce_alone(&p, out, &a, &eb);
	cot_err rc2 = allreduce_run(&p, ref, &r, &eb2);
	ok(rc == COT_OK && rc2 == COT_OK && memcmp(out, grad, N * sizeof *out) == 0 &&
	           memcmp(ref, grad, N * sizeof *ref) == 0 && a.n_included == 1 && a.included[0] == hid[0] &&
	           a.total_samples == 8,
	   "a group of one: its own bytes, itself included with its samples (%s%s)", eb.msg, eb2.msg);
	int same = rc == COT_OK && rc2 == COT_OK && a.sketch_k == K && r.sketch_k == K && a.n_recv == 1 &&
	           r.n_recv == 1 && a.recv_from[0] == hid[0] && a.agg_errs[0] == 0 && a.agg_result_err == 0;
	double d = 0;
	for (size_t i = 0; same && i < K; i++) {
		d = fmax(d, fabs(a.agg_partials[i] - r.agg_partials[i]));
		d = fmax(d, fabs(a.agg_result[i] - r.agg_result[i]));
		d = fmax(d, fabs(a.recv_sketches[i] - r.recv_sketches[i]));
		same &= a.agg_partials[i] == a.agg_result[i] && a.agg_result[i] == a.recv_sketches[i] &&
		        a.agg_partials[i] != 0;
	}
	ok(same && d <= 1e-9 * fabs(a.agg_partials[0]) + 1e-12,
	   "  its sketches are allreduce_run's for a lone member (partial = result = received, largest "
	   "difference %.3g), error bounds 0",
	   d);
	ok(rc == COT_OK && a.agg_slices && a.agg_slices[0] && a.agg_slices[0] != out &&
	           memcmp(a.agg_slices[0], grad, N * sizeof *grad) == 0,
	   "  its slice is kept as a copy for the second seed");
	if (rc == COT_OK)
		allreduce_result_free(&a);
	/* Across groups: the stage makes our sum the mean; group_sum is the
	 * sketch of the sum before it, result and received of the mean. */
	p.cross = alone_stage;
	p.cross_arg = &stage_calls;
	rc = allreduce_alone(&p, out, &a, &eb);
	double dg = 0, dr = 0;
	double mean_sk[K] = { 0 };
	float *mean = malloc(N * sizeof *mean);
	for (size_t j = 0; j < N; j++)
		mean[j] = grad[j] / 8.0f;
	sketch_add(mean, N, 0, p.sketch_seed, K, mean_sk);
	int cross_ok = rc == COT_OK && stage_calls == 1 && a.agg_group_sum && a.agg_group_sum_values &&
	               memcmp(out, mean, N * sizeof *out) == 0 &&
	               memcmp(a.agg_group_sum_values, grad, N * sizeof *grad) == 0 &&
	               memcmp(a.agg_slices[0], grad, N * sizeof *grad) == 0;
	for (size_t i = 0; cross_ok && i < K; i++) {
		dg = fmax(dg, fabs(a.agg_group_sum[i] - r.agg_partials[i]));
		dr = fmax(dr, fabs(a.agg_result[i] - mean_sk[i]));
		cross_ok &= a.recv_sketches[i] == a.agg_result[i] && a.agg_partials[i] == a.agg_group_sum[i];
	}
	ok(cross_ok && dg == 0 && dr == 0 && a.agg_group_sum_err == 0,
	   "  across groups: the stage ran once, its group sum and slice kept, group_sum the sketch of "
	   "the sum, result and received of the mean (%s)",
	   eb.msg);
	if (rc == COT_OK)
		allreduce_result_free(&a);
	stage_calls = -1; /* the stage fails */
	ok(allreduce_alone(&p, out, &a, &eb) == COT_ERR_NETWORK && a.included == NULL &&
	           a.agg_partials == NULL,
	   "  a failed stage across groups fails it, nothing left to free (%s)", eb.msg);
	p.cross = NULL;
	free(mean);
	m.end = N - 1;
	ok(allreduce_alone(&p, out, &a, &eb) == COT_ERR_INVALID, "  a range short of the vector refused (%s)",
	   eb.msg);
	m.end = N;
	p.n = 2;
	ok(allreduce_alone(&p, out, &a, &eb) == COT_ERR_INVALID, "  a group of two refused (%s)", eb.msg);
	if (rc2 == COT_OK)
		allreduce_result_free(&r);
	free(grad);
	free(out);
	free(ref);
}

/* CenteredClip in the all-reduce: every member holds the same bytes, each
 * range what cclip_combine gives for the slices in ascending host order;
 * with a poisoner among 4 the result stays near the honest mean. */
static void test_centered_clip(void)
{
	uint64_t s4[] = { 4, 8, 4, 8 }, e4[] = { 700, 1500, 2300, 3000 };
	group *g = group_new(4, 3000, e4, s4);
	g->cclip = 1;
	/* Members 1 and 2 computed about what member 0 did (per sample);
	 * member 3 (host 13) sends -5 times it. */
	for (size_t j = 0; j < g->len; j++) {
		float g0 = g->grad[0][j] / 4;
		g->grad[1][j] = (g0 + (float)(0.0002 * (urand() - 0.5))) * 8;
		g->grad[2][j] = (g0 + (float)(0.0002 * (urand() - 0.5))) * 4;
		g->grad[3][j] = -5.0f * g0 * 8;
	}
	group_run(g, NULL);
	int all = 1, same = 1;
	for (size_t i = 0; i < 4; i++) {
		all &= g->rc[i] == COT_OK;
		same &= memcmp(g->out[i], g->out[0], g->len * sizeof(float)) == 0;
	}
	ok(all && same, "CenteredClip: every member finished with the same bytes");
	size_t order[4] = { 1, 0, 3, 2 }; /* hosts 11, 12, 13, 14 */
	float *e = calloc(g->len, sizeof *e);
	int match = 1;
	for (size_t a = 0; a < 4; a++) {
		const float *x[4];
		uint64_t smp[4];
		for (size_t k = 0; k < 4; k++) {
			x[k] = g->grad[order[k]] + g->start[a];
			smp[k] = g->samples[order[k]];
		}
		cot_errbuf eb = { 0 };
		match &= cclip_combine(x, smp, 4, g->end[a] - g->start[a], 0.02, 20, e + g->start[a], &eb) ==
		         COT_OK;
	}
	size_t differ = 0;
	for (size_t j = 0; j < g->len; j++)
		differ += e[j] != g->out[0][j];
	ok(match && differ == 0 && g->res[0].n_included == 4,
	   "CenteredClip: each range is cclip_combine of its slices in host order (%zu values differ, %zu "
	   "included)",
	   differ, g->res[0].n_included);
	double d_cc = 0, d_mean = 0;
	for (size_t j = 0; j < g->len; j++) {
		double honest = ((double)g->grad[0][j] + g->grad[1][j] + g->grad[2][j]) / 16;
		double mean = (honest * 16 + g->grad[3][j]) / 24;
		d_cc += (g->out[0][j] / 24.0 - honest) * (g->out[0][j] / 24.0 - honest);
		d_mean += (mean - honest) * (mean - honest);
	}
	ok(sqrt(d_cc) < 0.25 * sqrt(d_mean),
	   "CenteredClip: the poisoner moves the result %.3g, the mean %.3g", sqrt(d_cc), sqrt(d_mean));
	free(e);
	group_free(g);
}

int main(void)
{
	alarm(120);
	plan_lazy();
	cot_errbuf eb = { 0 };
	pki_ca *ca = NULL;
	if (pki_ca_create(PROJECT, 0, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb))
		bail_out("could not make a CA: %s", eb.msg);
	for (size_t i = 0; i < MAXN; i++)
		ctx[i] = make_ctx(ca, hid[i]);
	outsider_ctx = make_ctx(ca, OUTSIDER);

	test_params();
	test_alone();
	test_sizes();
	test_bad_gradients();
	test_faults();
	test_outsider();
	test_junk_connections();
	test_centered_clip();

	for (size_t i = 0; i < MAXN; i++)
		peer_ctx_free(ctx[i]);
	peer_ctx_free(outsider_ctx);
	pki_ca_free(ca);
	free(ca_pem);
	done_testing();
	return exit_status();
}
