/* cotrain kernels: sentence-order pairs and dynamic masking.  See masking.h. */
#include "kernels/masking.h"

#include "kernels/encoder.h"
#include "kernels/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kern_mask_raw_per_sample(const kern_config *c) { return c->seq_len - 3; }

/* splitmix64's finaliser: a bijection that spreads every input bit. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A uniform integer in [0, n), n >= 1 (the tiny modulo bias is the same
 * everywhere, which is what matters here). */
static uint64_t below(kern_rng *r, uint64_t n) { return kern_rng_next(r) % n; }

/* A token masking never picks: the four special ones and [UNK]. */
static int is_special(const kern_config *c, int32_t t)
{
	return t == c->cls_id || t == c->sep_id || t == c->mask_id || t == c->pad_id || t == c->unk_id;
}

/* One sample from its n = T - 3 raw tokens; cand is [T] scratch. */
static void build_sample(const kern_config *c, kern_rng *r, const int32_t *raw, int32_t *ids, int32_t *seg,
                         int32_t *lab, int32_t *sop, int32_t *cand)
{
	int T = c->seq_len, n = T - 3, lo = n / 4 < 1 ? 1 : n / 4;
	int a = lo + (int)below(r, (uint64_t)(n - 2 * lo + 1));
	int swap = (int)(kern_rng_next(r) >> 63);
	const int32_t *first = swap ? raw + a : raw, *second = swap ? raw : raw + a;
	int n1 = swap ? n - a : a, n2 = n - n1, t = 0;
	ids[t++] = c->cls_id;
	memcpy(ids + t, first, (size_t)n1 * sizeof *ids);
	t += n1;
	ids[t++] = c->sep_id;
	for (int i = 0; i < t; i++)
		seg[i] = 0;
	memcpy(ids + t, second, (size_t)n2 * sizeof *ids);
	t += n2;
	ids[t++] = c->sep_id;
	for (int i = n1 + 2; i < T; i++)
		seg[i] = 1;
	*sop = swap;

	int k = 0;
	for (int i = 0; i < T; i++) {
		lab[i] = KERN_ENC_IGNORE;
		if (!is_special(c, ids[i]))
			cand[k++] = i;
	}
	int npred = k ? (int)lround(KERN_MASK_RATE * k) : 0;
	if (k && npred < 1)
		npred = 1;
	for (int j = 0; j < npred; j++) {
		/* partial Fisher-Yates: cand[j] becomes a uniform pick of the rest */
		int pick = j + (int)below(r, (uint64_t)(k - j));
		int32_t pos = cand[pick];
		cand[pick] = cand[j];
		cand[j] = pos;
		lab[pos] = ids[pos];
		double u = kern_rng_uniform(r);
		if (u < 0.8) {
			ids[pos] = c->mask_id;
		} else if (u < 0.9) {
			int32_t tok;
			do
				tok = (int32_t)below(r, (uint64_t)c->vocab);
			while (is_special(c, tok));
			ids[pos] = tok;
		}
	}
}

cot_err kern_mask_build(const kern_config *c, uint64_t seed, int64_t epoch, int64_t microbatch, int B,
                        const int32_t *raw, size_t raw_stride, int32_t *ids, int32_t *segments,
                        int32_t *labels, int32_t *sop, cot_errbuf *eb)
{
	int T = c->seq_len, n = kern_mask_raw_per_sample(c);
	if (B < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "batch size %d is below 1", B);
	if (raw_stride < (size_t)n)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "raw token stride %zu is below the %d tokens of a sample", raw_stride, n);
	for (int b = 0; b < B; b++)
		for (int i = 0; i < n; i++) {
			int32_t t = raw[(size_t)b * raw_stride + i];
			if (t < 0 || t >= c->vocab)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "raw token %d of sample %d, position %d, is outside the "
				                  "vocabulary 0..%d",
				                  (int)t, b, i, c->vocab - 1);
		}
	int32_t *cand = malloc((size_t)T * sizeof *cand);
	if (!cand)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for masking");
	for (int b = 0; b < B; b++) {
		uint64_t h = mix64(seed ^ 0x656e636f64657273ULL); /* "encoders" */
		h = mix64(h ^ (uint64_t)epoch);
		h = mix64(h ^ (uint64_t)microbatch);
		h = mix64(h ^ (uint64_t)b);
		kern_rng r;
		kern_rng_seed(&r, h);
		size_t o = (size_t)b * T;
		build_sample(c, &r, raw + (size_t)b * raw_stride, ids + o, segments + o, labels + o, sop + b,
		             cand);
	}
	free(cand);
	return COT_OK;
}
