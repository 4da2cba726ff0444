/* cotrain tests: the stage across groups (shared/averaging/cross_group.h)
 * between member threads over loopback TLS, with certificates from a test
 * CA: two groups of two, each running the all-reduce within its group with
 * its aggregators averaging their slices with the other group's.
 *
 * Group A (hosts 21, 22) splits the vector at A_CUT, group B (hosts 23, 24)
 * at B_CUT: the slices are [0, B_CUT), [B_CUT, A_CUT), [A_CUT, LEN), each
 * held by one aggregator of each group, which share it equally (the plan's
 * rule at equal bandwidths).  Every member must end with the same bytes:
 *
 *     mean[i] = (float)(((double)sum_A[i] + (double)sum_B[i]) / total)
 *
 * with sum_g[i] = (float)(sum over the group's members, ascending host id,
 * of (double)x[i]), computed here from the inputs.  A holder that fails
 * the stage fails both groups: nobody ends with part of the vector
 * averaged.  alarm() bounds the whole test. */
#include "shared/averaging/allreduce.h"
#include "shared/averaging/cross_group.h"
#include "shared/common/deadline.h"
#include "shared/peer/dialer.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"
#include "tests/tap.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROJECT "crosstest"
#define N 4 /* members: 0, 1 group A; 2, 3 group B */
#define LEN 70000
#define A_CUT 40000
#define B_CUT 25000

static const int64_t hid[N] = { 21, 22, 23, 24 };
static const uint64_t samples[N] = { 3, 5, 7, 11 };
static char *ca_pem;
static peer_ctx *ctx[N];
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

typedef struct {
	float *grad[N], *out[N];
	listener *lst[N];
	uint16_t port[N];
	uint64_t start[N], end[N]; /* each member's range within its group */
	int sabotage;              /* member 3's stage fails at once */
	int comp;                  /* slices' and the stage's encoding; the group's
	                            * results in fp32 under 8-bit, as the client does */
	cot_err rc[N];
	cot_errbuf eb[N];
	int64_t t0;
} world;

typedef struct {
	world *w;
	size_t self;
	pthread_t th;
	cross_holder holders[3][2];
	cross_slice slices[3];
	cross_group_params cp;
} job;

/* The test's sabotage: member 3 fails its stage without a word. */
static cot_err fail_stage(void *arg, float *sum, uint64_t start, uint64_t end, uint64_t group_samples,
                          cot_errbuf *eb)
{
	(void)arg, (void)sum, (void)start, (void)end, (void)group_samples;
	return cot_seterr(eb, COT_ERR_NETWORK, "sabotaged");
}

/* The slices of member self's range and their holders, as the plan gives
 * them: cut at every boundary of both groups, shared equally. */
static void plan_slices(job *j)
{
	world *w = j->w;
	static const uint64_t cuts[4] = { 0, B_CUT, A_CUT, LEN };
	size_t ns = 0;
	for (int s = 0; s < 3; s++) {
		uint64_t lo = cuts[s], hi = cuts[s + 1];
		if (lo < w->start[j->self] || hi > w->end[j->self])
			continue;
		cross_slice *cs = &j->slices[ns];
		*cs = (cross_slice){ .index = s, .lo = lo, .hi = hi, .n = 2, .holders = j->holders[ns] };
		size_t k = 0;
		for (size_t m = 0; m < N; m++) { /* one holder per group, ascending host id */
			if (w->start[m] > lo || w->end[m] < hi)
				continue;
			cross_holder *h = &j->holders[ns][k];
			*h = (cross_holder){ .host_id = hid[m], .port = w->port[m] };
			snprintf(h->addr, sizeof h->addr, "127.0.0.1");
			h->lo = lo + (hi - lo) * k / 2;
			h->hi = lo + (hi - lo) * (k + 1) / 2;
			if (m == j->self)
				cs->self = k;
			k++;
		}
		ns++;
	}
	j->cp.slices = j->slices;
	j->cp.n_slices = ns;
}

static void *member_main(void *arg)
{
	job *j = arg;
	world *w = j->w;
	size_t g0 = j->self < 2 ? 0 : 2; /* the first member of our group */
	dialer *d = NULL;
	if (dialer_direct_new(&d, &w->eb[j->self])) {
		w->rc[j->self] = COT_ERR_NOMEM;
		return NULL;
	}
	allreduce_member m[2];
	for (size_t k = 0; k < 2; k++)
		m[k] = (allreduce_member){ hid[g0 + k],      "127.0.0.1",    w->port[g0 + k],
			                   w->start[g0 + k], w->end[g0 + k], samples[g0 + k] };
	plan_slices(j);
	j->cp.round = 7;
	j->cp.comp = w->comp;
	j->cp.ctx = ctx[j->self];
	j->cp.dialer = d;
	j->cp.lst = w->lst[j->self];
	j->cp.collect_deadline = w->t0 + 6000;
	j->cp.deadline = w->t0 + 7000;
	allreduce_params p = {
		.members = m,
		.n = 2,
		.self = j->self - g0,
		.round = 7,
		.grad = w->grad[j->self],
		.len = LEN,
		.ctx = ctx[j->self],
		.dialer = d,
		.lst = w->lst[j->self],
		.collect_deadline = w->t0 + 3000,
		.deadline = w->t0 + 8000,
		.no_stream = 1,
		.send_comp = w->comp,
		.result_comp = w->comp == COMP_BLOCK8 ? COMP_NONE : w->comp,
		.cross = w->sabotage && j->self == 3 ? fail_stage : cross_group_reduce,
		.cross_arg = &j->cp,
	};
	allreduce_result res;
	w->rc[j->self] = allreduce_run(&p, w->out[j->self], &res, &w->eb[j->self]);
	if (!w->rc[j->self])
		allreduce_result_free(&res);
	dialer_free(d);
	return NULL;
}

static void run_world(world *w)
{
	cot_errbuf eb = { 0 };
	for (size_t i = 0; i < N; i++) {
		if (listener_open("127.0.0.1", 0, 0, &w->lst[i], &eb))
			bail_out("could not listen: %s", eb.msg);
		w->port[i] = listener_port(w->lst[i]);
		memset(w->out[i], 0, LEN * sizeof(float));
	}
	w->t0 = deadline_now_ms();
	static job jobs[N];
	for (size_t i = 0; i < N; i++) {
		memset(&jobs[i], 0, sizeof jobs[i]);
		jobs[i].w = w;
		jobs[i].self = i;
		if (pthread_create(&jobs[i].th, NULL, member_main, &jobs[i]))
			bail_out("could not start a member thread");
	}
	for (size_t i = 0; i < N; i++)
		pthread_join(jobs[i].th, NULL);
	for (size_t i = 0; i < N; i++)
		listener_close(w->lst[i]);
}

int main(void)
{
	alarm(120);
	plan_lazy();
	cot_errbuf eb = { 0 };
	pki_ca *ca = NULL;
	if (pki_ca_create(PROJECT, 0, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb))
		bail_out("could not make a CA: %s", eb.msg);
	for (size_t i = 0; i < N; i++)
		ctx[i] = make_ctx(ca, hid[i]);

	static world w;
	const uint64_t start[N] = { 0, A_CUT, 0, B_CUT }, end[N] = { A_CUT, LEN, B_CUT, LEN };
	for (size_t i = 0; i < N; i++) {
		w.start[i] = start[i];
		w.end[i] = end[i];
		w.grad[i] = malloc(LEN * sizeof(float));
		w.out[i] = malloc(LEN * sizeof(float));
		for (size_t k = 0; k < LEN; k++)
			w.grad[i][k] = (float)(urand() * (double)samples[i]);
	}
	/* What every member must hold. */
	float *want = malloc(LEN * sizeof *want);
	double total = 0;
	for (size_t i = 0; i < N; i++)
		total += (double)samples[i];
	for (size_t k = 0; k < LEN; k++) {
		float sa = (float)((double)w.grad[0][k] + (double)w.grad[1][k]);
		float sb = (float)((double)w.grad[2][k] + (double)w.grad[3][k]);
		want[k] = (float)(((double)sa + (double)sb) / total);
	}

	run_world(&w);
	for (size_t i = 0; i < N; i++)
		is_int(w.rc[i], COT_OK, "host %lld averaged across groups (%s)", (long long)hid[i],
		       w.eb[i].msg);
	int same = 1;
	for (size_t i = 1; i < N; i++)
		same &= memcmp(w.out[i], w.out[0], LEN * sizeof(float)) == 0;
	ok(same, "every member of both groups holds the same bytes");
	size_t bad = 0;
	for (size_t k = 0; k < LEN; k++)
		bad += memcmp(&w.out[0][k], &want[k], sizeof(float)) != 0;
	is_int((long long)bad, 0, "they are the exact mean of the four contributions, rounded once");

	/* 8-bit on the wire, blocks that straddle the slices: the mean is
	 * encoded once, by the stage, so both groups still hold the same bytes. */
	w.comp = COMP_BLOCK8;
	run_world(&w);
	int all_ok = 1;
	for (size_t i = 0; i < N; i++)
		all_ok &= w.rc[i] == COT_OK;
	same = 1;
	for (size_t i = 1; i < N; i++)
		same &= memcmp(w.out[i], w.out[0], LEN * sizeof(float)) == 0;
	double err = 0, scale = 0;
	for (size_t k = 0; k < LEN; k++) {
		err = fmax(err, fabs((double)w.out[0][k] - (double)want[k]));
		scale = fmax(scale, fabs((double)want[k]));
	}
	ok(all_ok && same && err <= 0.05 * scale,
	   "in 8-bit every member of both groups holds the same bytes, near the mean (error %.3g of %.3g; "
	   "%s)",
	   err, scale, w.eb[0].msg);
	w.comp = COMP_NONE;

	/* A holder whose stage fails: both groups fail, nobody keeps a mix. */
	w.sabotage = 1;
	run_world(&w);
	int failed = 0;
	for (size_t i = 0; i < N; i++)
		failed += w.rc[i] == COT_ERR_NETWORK;
	is_int(failed, N, "a holder failing the stage fails every member of both groups (%s; %s)",
	       w.eb[0].msg, w.eb[2].msg);

	for (size_t i = 0; i < N; i++) {
		free(w.grad[i]);
		free(w.out[i]);
		peer_ctx_free(ctx[i]);
	}
	free(want);
	pki_ca_free(ca);
	free(ca_pem);
	done_testing();
	return exit_status();
}
