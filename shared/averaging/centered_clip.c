/* cotrain: CenteredClip (contract in centered_clip.h). */
#include "shared/averaging/centered_clip.h"

#include <math.h>
#include <stdlib.h>

/* The median start, coordinate by coordinate: element k / 2 of the sorted
 * means (insertion sort of at most 256 values). */
static void median_start(const float *const *x, const double *inv_s, size_t k, size_t len, double *v,
                         double *col)
{
	for (size_t c = 0; c < len; c++) {
		for (size_t i = 0; i < k; i++) {
			double g = (double)x[i][c] * inv_s[i], t;
			size_t j = i;
			while (j > 0 && (t = col[j - 1]) > g) {
				col[j] = t;
				j--;
			}
			col[j] = g;
		}
		v[c] = col[k / 2];
	}
}

cot_err cclip_combine(const float *const *x, const uint64_t *samples, size_t k, size_t len, double tau,
                      int iters, float *out, cot_errbuf *eb)
{
	if (k < 1 || k > 256)
		return cot_seterr(eb, COT_ERR_INVALID, "CenteredClip takes 1 to 256 contributions, not %zu",
		                  k);
	if (!(tau > 0) || !isfinite(tau) || iters < 1 || iters > CCLIP_ITERS_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "CenteredClip needs tau > 0 and 1 to %d iterations",
		                  CCLIP_ITERS_MAX);
	double total = 0, inv_s[256], w[256], col[256], coef[256];
	for (size_t i = 0; i < k; i++) {
		if (samples[i] == 0)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "a contribution to CenteredClip has no samples");
		inv_s[i] = 1.0 / (double)samples[i];
		total += (double)samples[i];
	}
	for (size_t i = 0; i < k; i++)
		w[i] = (double)samples[i] / total;
	double *v = malloc((len ? len : 1) * sizeof *v);
	if (!v)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for CenteredClip");
	median_start(x, inv_s, k, len, v, col);
	for (int it = 0; it < iters; it++) {
		for (size_t i = 0; i < k; i++) {
			double n2 = 0;
			for (size_t c = 0; c < len; c++) {
				double d = (double)x[i][c] * inv_s[i] - v[c];
				n2 += d * d;
			}
			double norm = sqrt(n2);
			coef[i] = w[i] * (norm > tau ? tau / norm : 1.0);
		}
		for (size_t c = 0; c < len; c++) {
			double step = 0;
			for (size_t i = 0; i < k; i++)
				step += coef[i] * ((double)x[i][c] * inv_s[i] - v[c]);
			v[c] += step;
		}
	}
	for (size_t c = 0; c < len; c++)
		out[c] = (float)(v[c] * total);
	free(v);
	return COT_OK;
}
