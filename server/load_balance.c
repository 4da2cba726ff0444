/* cotrain: DeDLOC load balancing, closed form. */
#include "server/load_balance.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
	double b;
	int idx;
} ranked;

/* Descending bandwidth, then ascending index: a total order, so the result
 * never depends on qsort's instability. */
static int by_bandwidth_desc(const void *a, const void *b)
{
	const ranked *x = a, *y = b;
	if (x->b != y->b)
		return x->b > y->b ? -1 : 1;
	return x->idx - y->idx;
}

cot_err lb_shares(const lb_peer *peers, int n, double *w, double *time_per_value, cot_errbuf *eb)
{
	if (n < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "a group needs at least one peer");
	int m = 0;
	for (int i = 0; i < n; i++) {
		if (!(peers[i].bandwidth > 0) || !isfinite(peers[i].bandwidth))
			return cot_seterr(eb, COT_ERR_INVALID, "peer %d has an invalid bandwidth", i);
		m += peers[i].can_aggregate;
		w[i] = 0;
	}
	if (m == 0) {
		cot_err e = cot_seterr(eb, COT_ERR_INVALID, "no peer of the group can aggregate");
		cot_sethint(eb,
		            "At least one peer must accept connections (or be reached through the relay).");
		return e;
	}

	ranked *r = malloc(sizeof *r * m);
	if (!r)
		return COT_ERR_NOMEM;
	m = 0;
	for (int i = 0; i < n; i++)
		if (peers[i].can_aggregate)
			r[m++] = (ranked){ peers[i].bandwidth, i };
	qsort(r, m, sizeof *r, by_bandwidth_desc);

	if (n <= 2) {
		/* Times do not depend on w: split in proportion to bandwidth. */
		double sum = 0;
		for (int j = 0; j < m; j++)
			sum += r[j].b;
		for (int j = 0; j < m; j++)
			w[r[j].idx] = r[j].b / sum;
	} else {
		/* Largest k with every w_i > 0; w_i > 0 <=> xi b_i > 1, and since
		 * the b are sorted, checking the slowest of the k suffices. */
		double sum = 0, best_xi = 0;
		int best_k = 1;
		for (int k = 1; k <= m; k++) {
			sum += r[k - 1].b;
			double xi = (n - 2 + k) / sum;
			if (xi * r[k - 1].b > 1) {
				best_k = k;
				best_xi = xi;
			}
		}
		if (best_xi == 0) /* k = 1 always qualifies: xi b = n-1 > 1 */
			best_xi = (n - 1) / r[0].b;
		double total = 0;
		for (int j = 0; j < best_k; j++) {
			double wi = (best_xi * r[j].b - 1) / (n - 2);
			w[r[j].idx] = wi;
			total += wi;
		}
		for (int j = 0; j < best_k; j++) /* remove rounding drift */
			w[r[j].idx] /= total;
	}
	free(r);

	if (time_per_value) {
		double t = 0;
		for (int i = 0; i < n; i++) {
			double ti = (1 + (n - 2) * w[i]) / peers[i].bandwidth;
			if (n == 1)
				ti = 0;
			if (ti > t)
				t = ti;
		}
		*time_per_value = t;
	}
	return COT_OK;
}

void lb_split(const double *w, int n, uint64_t len, uint64_t *start)
{
	/* Floors first, then hand the remaining elements out by largest
	 * fractional part (ties: lower index). */
	uint64_t *cnt = calloc(n, sizeof *cnt);
	double *frac = calloc(n, sizeof *frac);
	uint64_t given = 0;
	if (!cnt || !frac) {
		/* Cannot happen in practice; fall back to "all to the first
		 * aggregator" so the split is still a valid partition. */
		int first = 0;
		for (int i = 0; i < n; i++)
			if (w[i] > 0) {
				first = i;
				break;
			}
		for (int i = 0; i <= n; i++)
			start[i] = i <= first ? 0 : len;
		free(cnt);
		free(frac);
		return;
	}
	for (int i = 0; i < n; i++) {
		double exact = w[i] * (double)len;
		cnt[i] = (uint64_t)floor(exact);
		if (cnt[i] > len)
			cnt[i] = len;
		frac[i] = exact - (double)cnt[i];
		given += cnt[i];
	}
	while (given > len) { /* only from float noise; trim the largest */
		int big = 0;
		for (int i = 1; i < n; i++)
			if (cnt[i] > cnt[big])
				big = i;
		cnt[big]--;
		given--;
	}
	while (given < len) {
		int best = -1;
		for (int i = 0; i < n; i++)
			if (w[i] > 0 && (best < 0 || frac[i] > frac[best]))
				best = i;
		if (best < 0)
			best = 0;
		cnt[best]++;
		frac[best] = -1; /* at most one extra each per pass */
		given++;
		int left = 0;
		for (int i = 0; i < n; i++)
			left += w[i] > 0 && frac[i] >= 0;
		if (!left)
			for (int i = 0; i < n; i++)
				if (w[i] > 0)
					frac[i] = 0;
	}
	start[0] = 0;
	for (int i = 0; i < n; i++)
		start[i + 1] = start[i] + cnt[i];
	free(cnt);
	free(frac);
}
