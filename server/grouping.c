/* cotrain: averaging groups by proximity. */
#include "server/grouping.h"

#include <stdlib.h>

static double dist(const double *rtt, int n, int i, int j)
{
	if (i == j)
		return 0;
	double d = rtt[i * n + j];
	if (d < 0)
		d = rtt[j * n + i];
	return d < 0 ? GRP_RTT_UNKNOWN_MS : d;
}

typedef struct {
	double d;
	int peer, grp;
} pair;

static int by_distance(const void *a, const void *b)
{
	const pair *x = a, *y = b;
	if (x->d != y->d)
		return x->d < y->d ? -1 : 1;
	if (x->peer != y->peer)
		return x->peer - y->peer;
	return x->grp - y->grp;
}

cot_err grp_form(int n, const double *rtt, const bool *can_aggregate, int max_size, int *group, int *n_groups,
                 cot_errbuf *eb)
{
	if (n < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "no peers to group");
	if (max_size < 2)
		return cot_seterr(eb, COT_ERR_INVALID, "group size must be at least 2, not %d", max_size);
	int g = (n + max_size - 1) / max_size;
	*n_groups = g;

	int *seed = malloc(sizeof *seed * g);
	int *cap = malloc(sizeof *cap * g);
	double *mind = malloc(sizeof *mind * n);
	pair *pairs = malloc(sizeof *pairs * (size_t)n * g);
	if (!seed || !cap || !mind || !pairs) {
		free(seed);
		free(cap);
		free(mind);
		free(pairs);
		return COT_ERR_NOMEM;
	}
	for (int i = 0; i < n; i++)
		group[i] = -1;

	/* Seeds: farthest-point sampling, capable peers first. */
	int capable = 0;
	for (int i = 0; i < n; i++)
		capable += !can_aggregate || can_aggregate[i];
	bool restrict_capable = capable >= g;
	int first = 0;
	if (restrict_capable && can_aggregate)
		while (!can_aggregate[first])
			first++;
	seed[0] = first;
	group[first] = 0;
	for (int i = 0; i < n; i++)
		mind[i] = dist(rtt, n, first, i);
	for (int s = 1; s < g; s++) {
		int best = -1;
		for (int i = 0; i < n; i++) {
			if (group[i] >= 0)
				continue;
			if (restrict_capable && can_aggregate && !can_aggregate[i])
				continue;
			if (best < 0 || mind[i] > mind[best])
				best = i;
		}
		seed[s] = best;
		group[best] = s;
		for (int i = 0; i < n; i++) {
			double d = dist(rtt, n, best, i);
			if (d < mind[i])
				mind[i] = d;
		}
	}

	/* Balanced capacities: the first n % g groups take one more. */
	for (int s = 0; s < g; s++)
		cap[s] = n / g + (s < n % g) - 1; /* the seed is already in */

	size_t np = 0;
	for (int i = 0; i < n; i++)
		if (group[i] < 0)
			for (int s = 0; s < g; s++)
				pairs[np++] = (pair){ dist(rtt, n, seed[s], i), i, s };
	qsort(pairs, np, sizeof *pairs, by_distance);
	for (size_t k = 0; k < np; k++) {
		pair *p = &pairs[k];
		if (group[p->peer] < 0 && cap[p->grp] > 0) {
			group[p->peer] = p->grp;
			cap[p->grp]--;
		}
	}
	free(seed);
	free(cap);
	free(mind);
	free(pairs);
	return COT_OK;
}
