/* cotrain kernels: text generation (see generate.h). */
#include "kernels/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void gen_rng_seed(gen_rng *r, uint64_t seed) { r->s = seed; }

uint64_t gen_rng_next(gen_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double gen_rng_uniform(gen_rng *r) { return (double)(gen_rng_next(r) >> 11) * 0x1.0p-53; }

static int greedy(const gen_options *o) { return o->top_k == 1 || o->temperature == 0.0f; }

static cot_err check_options(const gen_options *o, cot_errbuf *eb)
{
	if (o->top_k < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "top-k %d is negative", o->top_k);
	if (!isfinite(o->temperature) || o->temperature < 0.0f)
		return cot_seterr(eb, COT_ERR_INVALID, "temperature %g is not a finite number >= 0",
		                  (double)o->temperature);
	return COT_OK;
}

/* Select the k largest of logits into idx[0..k) in order, by insertion
 * into a sorted prefix (no global state, so threads may sample at once). */
static void top_k(const float *logits, int V, int k, int *idx)
{
	int n = 0;
	for (int i = 0; i < V; i++) {
		float x = logits[i];
		if (n == k && !(x > logits[idx[k - 1]]))
			continue; /* not better than the worst kept (ties lose) */
		int at = n < k ? n++ : k - 1;
		while (at > 0 && x > logits[idx[at - 1]]) {
			idx[at] = idx[at - 1];
			at--;
		}
		idx[at] = i;
	}
}

cot_err gen_sample(const float *logits, int V, const gen_options *o, gen_rng *rng, int32_t *token,
                   cot_errbuf *eb)
{
	cot_err rc = check_options(o, eb);
	if (rc)
		return rc;
	if (V < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "vocabulary size %d is not positive", V);
	int best = 0;
	for (int i = 0; i < V; i++) {
		if (isnan(logits[i]) || logits[i] == INFINITY)
			return cot_seterr(eb, COT_ERR_INVALID, "logit %d is %g; the model has diverged", i,
			                  (double)logits[i]);
		if (logits[i] > logits[best])
			best = i;
	}
	if (greedy(o) || logits[best] == -INFINITY) {
		*token = best;
		return COT_OK;
	}

	int k = o->top_k == 0 || o->top_k > V ? V : o->top_k;
	int *idx = malloc((size_t)k * sizeof *idx);
	double *p = malloc((size_t)k * sizeof *p);
	if (!idx || !p) {
		free(idx);
		free(p);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for %d sampling candidates", k);
	}
	top_k(logits, V, k, idx);
	double sum = 0, inv_t = 1.0 / o->temperature, top = logits[idx[0]];
	for (int i = 0; i < k; i++) {
		p[i] = exp(((double)logits[idx[i]] - top) * inv_t);
		sum += p[i];
	}
	/* p[0] == 1, so sum >= 1; candidates with -Inf logits get 0. */
	double u = gen_rng_uniform(rng) * sum, acc = 0;
	*token = idx[0];
	for (int i = 0; i < k; i++) {
		acc += p[i];
		if (p[i] > 0) {
			*token = idx[i];
			if (u < acc)
				break;
		}
	}
	free(idx);
	free(p);
	return COT_OK;
}

cot_err gen_generate(kern_model *m, const int32_t *prompt, int n_prompt, const gen_options *o, int32_t *out,
                     cot_errbuf *eb)
{
	const int T = m->config.seq_len, V = m->config.vocab;
	cot_err rc = check_options(o, eb);
	if (rc)
		return rc;
	if (o->n_tokens < 0 || o->n_tokens > GEN_MAX_TOKENS)
		return cot_seterr(eb, COT_ERR_INVALID, "cannot generate %d tokens; the limit is %d",
		                  o->n_tokens, GEN_MAX_TOKENS);
	if (n_prompt < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "the prompt must hold at least one token");
	for (int i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= V)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "prompt token %d at position %d is outside "
			                  "the vocabulary 0..%d",
			                  (int)prompt[i], i, V - 1);

	/* The window holds the last n <= T tokens at its start; the rest is
	 * padding that causal attention never lets position n-1 see. */
	int32_t *win = calloc((size_t)T, sizeof *win);
	if (!win)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for a window of %d tokens", T);
	int n = n_prompt < T ? n_prompt : T;
	memcpy(win, prompt + (n_prompt - n), (size_t)n * sizeof *win);

	gen_rng rng;
	gen_rng_seed(&rng, o->seed);
	for (int step = 0; step < o->n_tokens; step++) {
		float loss;
		rc = kern_forward(m, win, NULL, 1, &loss, eb);
		if (rc)
			break;
		const float *logits = kern_logits(m) + (size_t)(n - 1) * V;
		int32_t tok;
		rc = gen_sample(logits, V, o, &rng, &tok, eb);
		if (rc)
			break;
		out[step] = tok;
		if (n == T) {
			memmove(win, win + 1, (size_t)(T - 1) * sizeof *win);
			n--;
		}
		win[n++] = tok;
	}
	free(win);
	return rc;
}
