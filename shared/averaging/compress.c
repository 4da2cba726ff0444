/* cotrain: wire compression of fp32 slices (see compress.h). */
#include "shared/averaging/compress.h"

#include <math.h>
#include <string.h>

comp_kind comp_choose(size_t n, comp_policy policy)
{
	switch (policy) {
	case COMP_POLICY_NONE:
		return COMP_NONE;
	case COMP_POLICY_FP16:
		return COMP_FP16;
	case COMP_POLICY_BLOCK8:
		return COMP_BLOCK8;
	case COMP_POLICY_AUTO:
		break;
	}
	return n >= COMP_AUTO_BLOCK8_MIN ? COMP_BLOCK8 : COMP_FP16;
}

const char *comp_name(int kind)
{
	switch (kind) {
	case COMP_NONE:
		return "none";
	case COMP_FP16:
		return "fp16";
	case COMP_BLOCK8:
		return "block8";
	}
	return "unknown";
}

int comp_kind_valid(int kind) { return kind == COMP_NONE || kind == COMP_FP16 || kind == COMP_BLOCK8; }

size_t comp_encoded_size(int kind, size_t n)
{
	switch (kind) {
	case COMP_NONE:
		return n > SIZE_MAX / 4 ? 0 : 4 * n;
	case COMP_FP16:
		return n > SIZE_MAX / 2 ? 0 : 2 * n;
	case COMP_BLOCK8: {
		size_t blocks = n / COMP_BLOCK + (n % COMP_BLOCK != 0);
		if (n > SIZE_MAX - 4 * blocks)
			return 0;
		return n + 4 * blocks;
	}
	}
	return 0;
}

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Integer-only rounding, so that the result never depends on the FPU's
 * mode or on flush-to-zero. */
uint16_t comp_half_from_float(float f)
{
	uint32_t x = f2u(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	uint32_t a = x & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: a quiet NaN */
		return sign | 0x7e00;
	if (a == 0x7f800000u) /* Inf stays Inf */
		return sign | 0x7c00;
	if (a >= 0x477ff000u) /* >= 65520 would round to Inf: clamp */
		return sign | 0x7bff;
	if (a >= 0x38800000u) { /* normal half: |f| >= 2^-14 */
		uint32_t base = (a >> 13) - (112u << 10);
		uint32_t rem = a & 0x1fffu;
		if (rem > 0x1000u || (rem == 0x1000u && (base & 1)))
			base++; /* a mantissa carry moves into the exponent */
		return sign | (uint16_t)base;
	}
	/* Subnormal half (or zero): units of 2^-24. */
	uint32_t e = a >> 23;
	if (e < 102) /* below 2^-25: rounds to zero */
		return sign;
	uint32_t mant = (a & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126 - e; /* 14..24 */
	uint32_t base = mant >> shift;
	uint32_t rem = mant & ((1u << shift) - 1);
	uint32_t half = 1u << (shift - 1);
	if (rem > half || (rem == half && (base & 1)))
		base++;
	return sign | (uint16_t)base;
}

float comp_half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f;
	uint32_t m = h & 0x3ff;
	if (e == 0) {
		float v = (float)m * 0x1p-24f; /* exact */
		return sign ? -v : v;
	}
	if (e == 31)
		return u2f(sign | 0x7f800000u | (m << 13));
	return u2f(sign | ((e + 112) << 23) | (m << 13));
}

static void block8_encode(const float *x, size_t n, unsigned char *out)
{
	for (size_t b = 0; b < n; b += COMP_BLOCK) {
		size_t m = n - b < COMP_BLOCK ? n - b : COMP_BLOCK;
		float scale = 0.0f;
		int bad = 0;
		for (size_t i = 0; i < m; i++) {
			float v = fabsf(x[b + i]);
			if (!isfinite(v))
				bad = 1;
			else if (v > scale)
				scale = v;
		}
		/* A block holding NaN or Inf gets a NaN scale, which every
		 * decoder refuses: bad input is not hidden by the encoding. */
		if (bad)
			scale = u2f(0x7fc00000u);
		put_le32(out, f2u(scale));
		out += 4;
		for (size_t i = 0; i < m; i++) {
			long q = 0;
			if (!bad && scale > 0.0f) {
				q = lrint((double)x[b + i] / (double)scale * 127.0);
				if (q > 127)
					q = 127;
				if (q < -127)
					q = -127;
			}
			out[i] = (unsigned char)(int8_t)q;
		}
		out += m;
	}
}

static cot_err block8_decode(const unsigned char *in, size_t n, float *out, cot_errbuf *eb)
{
	for (size_t b = 0; b < n; b += COMP_BLOCK) {
		size_t m = n - b < COMP_BLOCK ? n - b : COMP_BLOCK;
		float scale = u2f(get_le32(in));
		in += 4;
		if (!isfinite(scale) || scale < 0.0f)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid scale %g in block %zu of an 8-bit slice", (double)scale,
			                  b / COMP_BLOCK);
		for (size_t i = 0; i < m; i++) {
			int8_t q = (int8_t)in[i];
			if (q == -128)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "invalid code -128 at value %zu of an 8-bit slice", b + i);
			out[b + i] = (float)((double)q * (double)scale / 127.0);
		}
		in += m;
	}
	return COT_OK;
}

cot_err comp_encode(int kind, const float *x, size_t n, unsigned char *out, size_t outlen, cot_errbuf *eb)
{
	size_t want = comp_encoded_size(kind, n);
	if (!comp_kind_valid(kind))
		return cot_seterr(eb, COT_ERR_INVALID, "unknown compression %d", kind);
	if (want != outlen || (want == 0 && n != 0))
		return cot_seterr(eb, COT_ERR_INVALID, "%s encoding of %zu values needs %zu bytes, not %zu",
		                  comp_name(kind), n, want, outlen);
	switch (kind) {
	case COMP_NONE:
		for (size_t i = 0; i < n; i++)
			put_le32(out + 4 * i, f2u(x[i]));
		break;
	case COMP_FP16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = comp_half_from_float(x[i]);
			out[2 * i] = (unsigned char)h;
			out[2 * i + 1] = (unsigned char)(h >> 8);
		}
		break;
	case COMP_BLOCK8:
		block8_encode(x, n, out);
		break;
	}
	return COT_OK;
}

cot_err comp_decode(int kind, const unsigned char *in, size_t len, float *out, size_t n, cot_errbuf *eb)
{
	if (!comp_kind_valid(kind))
		return cot_seterr(eb, COT_ERR_INVALID, "unknown compression %d", kind);
	size_t want = comp_encoded_size(kind, n);
	if (want != len || (want == 0 && n != 0))
		return cot_seterr(eb, COT_ERR_INVALID, "%s slice of %zu values must be %zu bytes, not %zu",
		                  comp_name(kind), n, want, len);
	switch (kind) {
	case COMP_NONE:
		for (size_t i = 0; i < n; i++)
			out[i] = u2f(get_le32(in + 4 * i));
		break;
	case COMP_FP16:
		for (size_t i = 0; i < n; i++)
			out[i] = comp_half_to_float((uint16_t)(in[2 * i] | in[2 * i + 1] << 8));
		break;
	case COMP_BLOCK8:
		return block8_decode(in, n, out, eb);
	}
	return COT_OK;
}

double comp_error_bound(int kind, const float *y, size_t n, double rel)
{
	/* Per value the bound is c + d |y|: per block, the sum of its squares
	 * is m c^2 + 2 c d sum |y| + d^2 sum y^2. */
	double sq = 0;
	for (size_t b = 0; b < n; b += COMP_BLOCK) {
		size_t m = n - b < COMP_BLOCK ? n - b : COMP_BLOCK;
		double s1 = 0, s2 = 0;
		float mx = 0;
		for (size_t i = 0; i < m; i++) {
			float a = fabsf(y[b + i]);
			s1 += a;
			s2 += (double)a * a;
			mx = a > mx ? a : mx;
		}
		double c = 0, d = rel;
		if (kind == COMP_BLOCK8) { /* plus the decoder's rounding to fp32 */
			c = mx / 254.0;
			d += 0x1p-24;
		} else if (kind == COMP_FP16) {
			c = 0x1p-25;
			d += 0x1p-11;
		}
		sq += (double)m * c * c + 2 * c * d * s1 + d * d * s2;
	}
	return sqrt(sq);
}
