/* cotrain tests: load balancing (DeDLOC) and group formation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/grouping.h"
#include "server/load_balance.h"
#include "tests/tap.h"

static double max_time(const lb_peer *p, int n, const double *w)
{
	double t = 0;
	for (int i = 0; i < n; i++) {
		double ti = (1 + (n - 2) * w[i]) / p[i].bandwidth;
		if (ti > t)
			t = ti;
	}
	return t;
}

static double sum(const double *w, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += w[i];
	return s;
}

static void test_shapes(void)
{
	cot_errbuf eb;
	double w[8], t;

	lb_peer eq[5];
	for (int i = 0; i < 5; i++)
		eq[i] = (lb_peer){ 100e6, true };
	ok(lb_shares(eq, 5, w, &t, &eb) == COT_OK, "equal bandwidths solve");
	bool all_fifth = true;
	for (int i = 0; i < 5; i++)
		all_fifth &= fabs(w[i] - 0.2) < 1e-12;
	ok(all_fifth, "equal bandwidths give 1/n each (butterfly all-reduce)");

	lb_peer ps[4] = { { 1e3, true }, { 1, true }, { 1, true }, { 1, true } };
	lb_shares(ps, 4, w, &t, &eb);
	ok(fabs(w[0] - 1) < 1e-12 && w[1] == 0 && w[2] == 0 && w[3] == 0,
	   "one dominant peer takes everything (parameter server): %.3f %.3f %.3f %.3f", w[0], w[1], w[2],
	   w[3]);

	lb_peer hy[4] = { { 10, true }, { 10, true }, { 1, true }, { 1, true } };
	lb_shares(hy, 4, w, &t, &eb);
	ok(w[0] > 0 && fabs(w[0] - w[1]) < 1e-12 && w[2] == 0 && w[3] == 0,
	   "two fast peers share, slow ones send only (hybrid): %.3f %.3f %.3f %.3f", w[0], w[1], w[2], w[3]);

	lb_peer nat[4] = { { 100, false }, { 100, true }, { 100, false }, { 100, true } };
	lb_shares(nat, 4, w, &t, &eb);
	ok(w[0] == 0 && w[2] == 0 && fabs(w[1] - 0.5) < 1e-12 && fabs(w[3] - 0.5) < 1e-12,
	   "peers that cannot accept connections aggregate nothing");

	lb_peer one[1] = { { 5, true } };
	ok(lb_shares(one, 1, w, &t, &eb) == COT_OK && w[0] == 1, "a group of one aggregates all");
	lb_peer two[2] = { { 30, true }, { 10, true } };
	lb_shares(two, 2, w, &t, &eb);
	ok(fabs(w[0] - 0.75) < 1e-12 && fabs(w[1] - 0.25) < 1e-12, "two peers split by bandwidth");

	lb_peer none[2] = { { 1, false }, { 1, false } };
	is_int(lb_shares(none, 2, w, &t, &eb), COT_ERR_INVALID, "no aggregator is an error");
	ok(strstr(eb.msg, "aggregate") != NULL, "that names the problem: %s", eb.msg);
	lb_peer bad[2] = { { 0, true }, { NAN, true } };
	is_int(lb_shares(bad, 2, w, &t, &eb), COT_ERR_INVALID, "zero or NaN bandwidth refused");
	is_int(lb_shares(bad, 0, w, &t, &eb), COT_ERR_INVALID, "an empty group refused");
}

/* The closed form must be no worse than any feasible split: check against
 * many random points of the simplex (restricted to aggregators). */
static void test_optimality(void)
{
	srand(7);
	int worse = 0, bad_sum = 0, trials = 200;
	for (int trial = 0; trial < trials; trial++) {
		int n = 3 + rand() % 6;
		lb_peer p[8];
		for (int i = 0; i < n; i++)
			p[i] = (lb_peer){ 1 + rand() % 1000, rand() % 4 != 0 };
		p[rand() % n].can_aggregate = true;
		double w[8], t;
		cot_errbuf eb;
		if (lb_shares(p, n, w, &t, &eb) != COT_OK) {
			worse++;
			continue;
		}
		bad_sum += fabs(sum(w, n) - 1) > 1e-9;
		double mine = max_time(p, n, w);
		if (fabs(mine - t) > 1e-12 * mine)
			worse++;
		for (int s = 0; s < 2000; s++) {
			double r[8], tot = 0;
			for (int i = 0; i < n; i++) {
				r[i] = p[i].can_aggregate ? -log((rand() + 1.0) / (RAND_MAX + 2.0)) : 0;
				if (s % 10 == 0 && p[i].can_aggregate && rand() % 2)
					r[i] = 0; /* sparse corners of the simplex too */
				tot += r[i];
			}
			if (tot == 0)
				continue;
			for (int i = 0; i < n; i++)
				r[i] /= tot;
			if (max_time(p, n, r) < mine * (1 - 1e-9)) {
				worse++;
				break;
			}
		}
	}
	is_int(worse, 0, "closed form beats %d x 2000 random feasible splits", trials);
	is_int(bad_sum, 0, "shares always sum to 1");
}

static void test_split(void)
{
	double w[4] = { 0.5, 0.25, 0.25, 0 };
	uint64_t st[5];
	lb_split(w, 4, 10, st);
	ok(st[0] == 0 && st[4] == 10, "split covers the whole vector");
	ok(st[1] - st[0] == 5 && st[4] - st[3] == 0, "sizes follow the shares, zero share gets nothing");
	ok(st[2] - st[1] + st[3] - st[2] == 5, "the two quarters take the remaining five (%llu, %llu)",
	   (unsigned long long)(st[2] - st[1]), (unsigned long long)(st[3] - st[2]));

	srand(3);
	int bad = 0;
	for (int trial = 0; trial < 500; trial++) {
		int n = 1 + rand() % 7;
		double ww[8], tot = 0;
		for (int i = 0; i < n; i++)
			tot += ww[i] = rand() % 3 ? rand() % 100 + 1 : 0;
		if (tot == 0) {
			ww[0] = 1;
			tot = 1;
		}
		for (int i = 0; i < n; i++)
			ww[i] /= tot;
		uint64_t len = rand() % 100000, s[9];
		lb_split(ww, n, len, s);
		if (s[0] != 0 || s[n] != len)
			bad++;
		for (int i = 0; i < n; i++) {
			double got = (double)(s[i + 1] - s[i]);
			if (s[i + 1] < s[i] || fabs(got - ww[i] * len) > 1.0 + 1e-9 ||
			    (ww[i] == 0 && got != 0))
				bad++;
		}
	}
	is_int(bad, 0, "500 random splits: exact partitions, each within one element of its share");
}

static void test_groups(void)
{
	/* Three sites of 4 peers: 2 ms inside a site, 80 ms between sites. */
	enum { N = 12 };
	double rtt[N * N];
	for (int i = 0; i < N; i++)
		for (int j = 0; j < N; j++)
			rtt[i * N + j] = (i / 4 == j / 4) ? 2 : 80;
	int group[N], ng;
	cot_errbuf eb;
	ok(grp_form(N, rtt, NULL, 4, group, &ng, &eb) == COT_OK, "groups form");
	is_int(ng, 3, "three groups of at most four");
	bool by_site = true;
	for (int i = 0; i < N; i++)
		by_site &= group[i] == group[(i / 4) * 4];
	ok(by_site, "each site is one group (nearby peers together)");

	/* Uneven: 10 peers, groups of at most 4 -> sizes 4, 3, 3. */
	int g10[10], cnt[4] = { 0 };
	double r10[100];
	for (int i = 0; i < 100; i++)
		r10[i] = -1; /* nothing measured */
	grp_form(10, r10, NULL, 4, g10, &ng, &eb);
	bool once = ng == 3;
	for (int i = 0; i < 10; i++) {
		once &= g10[i] >= 0 && g10[i] < ng;
		if (g10[i] >= 0 && g10[i] < 4)
			cnt[g10[i]]++;
	}
	ok(once, "every peer in exactly one group");
	ok(cnt[0] == 4 && cnt[1] == 3 && cnt[2] == 3, "sizes balanced: %d %d %d", cnt[0], cnt[1], cnt[2]);

	/* Only peers 5 and 9 can aggregate: each of two groups gets one. */
	bool capable[10] = { false };
	capable[5] = capable[9] = true;
	grp_form(10, r10, capable, 5, g10, &ng, &eb);
	ok(ng == 2 && g10[5] != g10[9], "each group gets a peer that can aggregate");

	int again[N];
	grp_form(N, rtt, NULL, 4, again, &ng, &eb);
	ok(memcmp(group, again, sizeof group) == 0, "deterministic");
	is_int(grp_form(3, rtt, NULL, 1, group, &ng, &eb), COT_ERR_INVALID, "group size 1 refused");
}

int main(void)
{
	plan_lazy();
	test_shapes();
	test_optimality();
	test_split();
	test_groups();
	return exit_status();
}
