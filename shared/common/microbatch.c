/* cotrain: the tokens of a stream microbatch (see microbatch.h). */
#include "shared/common/microbatch.h"

#include <stddef.h>

#define MB_POS_MAX ((uint64_t)1 << 62)

int64_t mb_per_epoch(uint64_t n_tokens, int64_t T, int64_t B)
{
	if (T < 1 || B < 1 || n_tokens < 1)
		return 0;
	uint64_t samples = (n_tokens - 1) / (uint64_t)T;
	uint64_t m = samples / (uint64_t)B;
	return m > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)m;
}

cot_err mb_shape_check(const mb_shape *s, cot_errbuf *eb)
{
	if (s->B < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "microbatch size %lld is below 1", (long long)s->B);
	if (s->T < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "sequence length %lld is below 1", (long long)s->T);
	if (s->mb_per_epoch < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "microbatches per epoch %lld is below 1",
		                  (long long)s->mb_per_epoch);
	uint64_t bt, all;
	if (__builtin_mul_overflow((uint64_t)s->B, (uint64_t)s->T, &bt) ||
	    __builtin_mul_overflow(bt, (uint64_t)s->mb_per_epoch, &all) || all >= MB_POS_MAX)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "an epoch of %lld microbatches of %lld x %lld tokens is too long",
		                  (long long)s->mb_per_epoch, (long long)s->B, (long long)s->T);
	return COT_OK;
}

uint64_t mb_first_token(const mb_shape *s, int64_t g)
{
	uint64_t m = (uint64_t)(g % s->mb_per_epoch);
	return m * (uint64_t)s->B * (uint64_t)s->T;
}

/* Index of the span holding pos, or -1. */
static int span_of(const mb_span *spans, int nspans, uint64_t pos)
{
	for (int i = 0; i < nspans; i++)
		if (pos >= spans[i].first && pos - spans[i].first < spans[i].n)
			return i;
	return -1;
}

/* Token j of span sp: one byte, or a little-endian u16 or u32. */
static int32_t token(const mb_span *sp, uint64_t j)
{
	const unsigned char *p = sp->tokens;
	switch (sp->width) {
	case 2:
		return (int32_t)((uint32_t)p[2 * j] | (uint32_t)p[2 * j + 1] << 8);
	case 4:
		return (int32_t)((uint32_t)p[4 * j] | (uint32_t)p[4 * j + 1] << 8 |
		                 (uint32_t)p[4 * j + 2] << 16 | (uint32_t)p[4 * j + 3] << 24);
	default:
		return p[j];
	}
}

int mb_token_at(const mb_span *spans, int nspans, uint64_t pos)
{
	int i = span_of(spans, nspans, pos);
	return i < 0 ? -1 : (int)token(&spans[i], pos - spans[i].first);
}

cot_err mb_fill(const mb_shape *s, const mb_span *spans, int nspans, int64_t g, int32_t *in, int32_t *tgt,
                cot_errbuf *eb)
{
	cot_err rc = mb_shape_check(s, eb);
	if (rc)
		return rc;
	if (g < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "microbatch %lld is negative", (long long)g);
	uint64_t base = mb_first_token(s, g);
	uint64_t n = (uint64_t)s->B * (uint64_t)s->T + 1; /* tokens read */
	/* Copy run by run: find the span of the next position, take as much of
	 * it as the microbatch needs.  Token k of the run feeds in[k] (k < n-1)
	 * and tgt[k-1] (k >= 1). */
	uint64_t k = 0;
	while (k < n) {
		uint64_t pos = base + k;
		int i = span_of(spans, nspans, pos);
		if (i < 0)
			return cot_seterr(eb, COT_ERR_INVALID, "token %llu of microbatch %lld is missing",
			                  (unsigned long long)pos, (long long)g);
		uint64_t off = pos - spans[i].first, run = spans[i].n - off;
		if (run > n - k)
			run = n - k;
		if (in && spans[i].width > 1) {
			for (uint64_t r = 0; r < run; r++, k++) {
				int32_t v = token(&spans[i], off + r);
				if (k < n - 1)
					in[k] = v;
				if (k >= 1)
					tgt[k - 1] = v;
			}
		} else if (in) {
			const unsigned char *t = spans[i].tokens + off;
			for (uint64_t r = 0; r < run; r++, k++) {
				if (k < n - 1)
					in[k] = t[r];
				if (k >= 1)
					tgt[k - 1] = t[r];
			}
		} else {
			k += run;
		}
	}
	return COT_OK;
}
