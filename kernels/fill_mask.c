/* cotrain kernels: fill-mask.  See fill_mask.h. */
#include "kernels/fill_mask.h"

#include "kernels/encoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fill_result_free(fill_result *r)
{
	free(r->token);
	free(r->prob);
	r->token = NULL;
	r->prob = NULL;
}

void fill_token_name(const kern_config *c, int32_t t, char out[8])
{
	if (t == c->cls_id)
		snprintf(out, 8, "[CLS]");
	else if (t == c->sep_id)
		snprintf(out, 8, "[SEP]");
	else if (t == c->mask_id)
		snprintf(out, 8, "[MASK]");
	else if (t == c->pad_id)
		snprintf(out, 8, "[PAD]");
	else if (t >= 0x20 && t < 0x7f)
		snprintf(out, 8, "%c", (char)t);
	else
		snprintf(out, 8, "\\x%02x", (unsigned)t & 0xff);
}

/* Encode text into ids[0..*n): [CLS] bytes [SEP], "[MASK]" as mask_id;
 * the mask positions into r. */
static cot_err encode(const kern_config *c, const char *text, size_t len, int32_t *ids, int *n,
                      fill_result *r, cot_errbuf *eb)
{
	size_t ml = strlen(FILL_MASK_TEXT);
	int T = c->seq_len, t = 0;
	ids[t++] = c->cls_id;
	r->n_masks = 0;
	for (size_t i = 0; i < len;) {
		if (t >= T - 1)
			return cot_seterr(eb, COT_ERR_INVALID, "the text does not fit the model's %d tokens",
			                  T - 2);
		if (len - i >= ml && memcmp(text + i, FILL_MASK_TEXT, ml) == 0) {
			if (r->n_masks == FILL_MAX_MASKS)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "the text has more than %d " FILL_MASK_TEXT "s",
				                  FILL_MAX_MASKS);
			r->position[r->n_masks++] = t;
			ids[t++] = c->mask_id;
			i += ml;
		} else {
			ids[t++] = (unsigned char)text[i++];
		}
	}
	ids[t++] = c->sep_id;
	*n = t;
	if (r->n_masks == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "the text has no " FILL_MASK_TEXT " to fill");
	return COT_OK;
}

/* The forward of the encoded sample ids[0..n) (n <= seq_len, masks at
 * r->position) and the top k of each mask into r; ids is padded in place. */
static cot_err predict(kern_model *m, int32_t *ids, int n, int k, fill_result *r, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	int T = c->seq_len;
	int32_t *seg = calloc((size_t)T, sizeof *seg);
	cot_err rc = seg ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!rc) {
		for (int t = n; t < T; t++)
			ids[t] = c->pad_id;
		int32_t lens[1] = { n };
		kern_enc_batch b = { ids, seg, NULL, NULL, lens };
		rc = kern_enc_forward(m, &b, 1, NULL, eb);
	}
	if (!rc) {
		r->k = k;
		r->token = malloc((size_t)r->n_masks * k * sizeof *r->token);
		r->prob = malloc((size_t)r->n_masks * k * sizeof *r->prob);
		if (!r->token || !r->prob)
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	const float *logits = rc ? NULL : kern_enc_mlm_logits(m, NULL, NULL);
	for (int i = 0; !rc && i < r->n_masks; i++) {
		const float *l = logits + (size_t)r->position[i] * c->vocab;
		float mx = l[0];
		for (int v = 1; v < c->vocab; v++)
			mx = l[v] > mx ? l[v] : mx;
		double sum = 0;
		for (int v = 0; v < c->vocab; v++)
			sum += exp((double)l[v] - mx);
		/* top k by selection: k is small */
		int32_t *tk = r->token + (size_t)i * k;
		float *pk = r->prob + (size_t)i * k;
		for (int j = 0; j < k; j++) {
			int best = -1;
			for (int v = 0; v < c->vocab; v++) {
				int taken = 0;
				for (int q = 0; q < j && !taken; q++)
					taken = tk[q] == v;
				if (!taken && (best < 0 || l[v] > l[best]))
					best = v;
			}
			tk[j] = best;
			pk[j] = (float)(exp((double)l[best] - mx) / sum);
		}
	}
	free(seg);
	return rc;
}

/* The checks every fill-mask makes of m and k. */
static cot_err check_model(const kern_config *c, int k, cot_errbuf *eb)
{
	if (c->arch == KERN_ARCH_GPT)
		return cot_seterr(eb, COT_ERR_INVALID, "fill-mask needs an encoder; this model is a gpt");
	if (k < 1 || k > c->vocab)
		return cot_seterr(eb, COT_ERR_INVALID, "%d predictions per mask is outside 1..%d", k,
		                  c->vocab);
	return COT_OK;
}

cot_err fill_mask(kern_model *m, const char *text, size_t len, int k, fill_result *r, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	memset(r, 0, sizeof *r);
	cot_err rc = check_model(c, k, eb);
	if (rc)
		return rc;
	if (c->cls_id < 256 || c->sep_id < 256 || c->mask_id < 256 || c->pad_id < 256)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "fill-mask reads text with the byte tokenizer, and this model's special "
		                  "tokens are not after the 256 bytes");
	int T = c->seq_len, n = 0;
	int32_t *ids = malloc((size_t)T * sizeof *ids);
	rc = ids ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!rc)
		rc = encode(c, text, len, ids, &n, r, eb);
	if (!rc)
		rc = predict(m, ids, n, k, r, eb);
	free(ids);
	if (rc)
		fill_result_free(r);
	return rc;
}

cot_err fill_mask_ids(kern_model *m, const int32_t *text_ids, size_t n, int k, fill_result *r, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	memset(r, 0, sizeof *r);
	cot_err rc = check_model(c, k, eb);
	if (rc)
		return rc;
	int T = c->seq_len;
	if (n > (size_t)T - 2)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "the text is %zu tokens, and the model reads %d between [CLS] and [SEP]", n,
		                  T - 2);
	for (size_t i = 0; i < n; i++) {
		if (text_ids[i] < 0 || text_ids[i] >= c->vocab)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "token %d at position %zu is outside the vocabulary 0..%d",
			                  (int)text_ids[i], i, c->vocab - 1);
		if (text_ids[i] == c->mask_id) {
			if (r->n_masks == FILL_MAX_MASKS)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "the text has more than %d " FILL_MASK_TEXT "s",
				                  FILL_MAX_MASKS);
			r->position[r->n_masks++] = (int)i + 1;
		}
	}
	if (r->n_masks == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "the text has no " FILL_MASK_TEXT " to fill");
	int32_t *ids = malloc((size_t)T * sizeof *ids);
	if (!ids)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	ids[0] = c->cls_id;
	memcpy(ids + 1, text_ids, n * sizeof *ids);
	ids[n + 1] = c->sep_id;
	rc = predict(m, ids, (int)n + 2, k, r, eb);
	free(ids);
	if (rc)
		fill_result_free(r);
	return rc;
}
