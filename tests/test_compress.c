/* cotrain tests: wire compression of fp32 slices (shared/averaging/compress.h). */
#include "shared/averaging/compress.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* Uniform in [-1, 1) times 10^e, e in [-6, 4]: many magnitudes. */
static float rnd_value(void)
{
	float u = (float)(rnd32() % 2000001) / 1000000.0f - 1.0f;
	return u * powf(10.0f, (float)((int)(rnd32() % 11) - 6));
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void test_half(void)
{
	/* Every half survives half -> float -> half (NaNs stay NaN). */
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = comp_half_to_float((uint16_t)h);
		uint16_t back = comp_half_from_float(f);
		if (isnan(f) ? !isnan(comp_half_to_float(back)) : back != h)
			bad++;
	}
	is_int(bad, 0, "all 65536 halves round-trip through float");

#ifdef __FLT16_MAX__
	/* Against the compiler's own conversion (round to nearest even), on
	 * random bit patterns inside the fp16 range. */
	bad = 0;
	int tried = 0;
	for (int i = 0; i < 2000000; i++) {
		float f = u2f(rnd32() << 1 ^ rnd32());
		if (!isfinite(f) || fabsf(f) >= 65504.0f)
			continue;
		tried++;
		_Float16 ref = (_Float16)f;
		uint16_t rb;
		memcpy(&rb, &ref, 2);
		if (comp_half_from_float(f) != rb && bad++ < 3)
			diag("%a: ours 0x%04x, compiler 0x%04x", (double)f, comp_half_from_float(f), rb);
	}
	ok(bad == 0 && tried > 100000, "float -> half matches _Float16 on %d random values (%d differ)",
	   tried, bad);
#else
	skip(1, "the compiler has no _Float16");
#endif
	/* Ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
	is_int(comp_half_from_float(1.0f + 0x1p-11f), 0x3c00, "a tie rounds to the even neighbour");
	is_int(comp_half_from_float(1.0f + 3 * 0x1p-11f), 0x3c02, "a tie rounds up to the even neighbour");
	is_int(comp_half_from_float(1e6f), 0x7bff, "finite overflow clamps to 65504");
	is_int(comp_half_from_float(-65520.0f), 0xfbff, "-65520 clamps to -65504");
	is_int(comp_half_from_float(INFINITY), 0x7c00, "Inf stays Inf");
	ok(isnan(comp_half_to_float(comp_half_from_float(NAN))), "NaN stays NaN");
	is_int(comp_half_from_float(0x1p-24f), 0x0001, "smallest subnormal");
	is_int(comp_half_from_float(0x1p-25f), 0x0000, "half of the smallest subnormal ties to zero");
}

static void test_roundtrip(int kind, size_t n, const char *what)
{
	float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
	size_t len = comp_encoded_size(kind, n);
	unsigned char *buf = malloc(len ? len : 1), *buf2 = malloc(len ? len : 1);
	cot_errbuf eb = { 0 };
	for (size_t i = 0; i < n; i++)
		x[i] = rnd_value();
	if (n > 10)
		x[3] = 0.0f; /* a zero block value */
	ok(comp_encode(kind, x, n, buf, len, &eb) == COT_OK &&
	           comp_encode(kind, x, n, buf2, len, &eb) == COT_OK && memcmp(buf, buf2, len) == 0,
	   "%s: %zu values encode to %zu bytes, twice the same", what, n, len);
	ok(comp_decode(kind, buf, len, y, n, &eb) == COT_OK, "%s: decodes (%s)", what, eb.msg);
	size_t bad = 0;
	for (size_t b = 0; b < n; b += COMP_BLOCK) {
		size_t m = n - b < COMP_BLOCK ? n - b : COMP_BLOCK;
		float absmax = 0;
		for (size_t i = 0; i < m; i++)
			absmax = fmaxf(absmax, fabsf(x[b + i]));
		for (size_t i = b; i < b + m; i++) {
			float err = fabsf(x[i] - y[i]);
			int good;
			if (kind == COMP_NONE)
				good = memcmp(&x[i], &y[i], 4) == 0;
			else if (kind == COMP_FP16)
				good = fabsf(x[i]) >= 0x1p-14f ? err <= 1e-3f * fabsf(x[i]) : err <= 0x1p-25f;
			else
				good = err <= absmax / 127.0f;
			if (!good && bad++ < 3)
				diag("value %zu: %g decoded as %g", i, (double)x[i], (double)y[i]);
		}
	}
	is_int((long long)bad, 0, "%s: every value within its bound", what);
	/* The bound the sketch checks' tolerance rests on (doc/credit.md, "Tied
	 * to the bytes"), from the decoded values alone. */
	double e2 = 0;
	for (size_t i = 0; i < n; i++)
		e2 += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
	double bound = comp_error_bound(kind, y, n, 0);
	ok(sqrt(e2) <= bound && (kind == COMP_NONE ? bound == 0 : sqrt(e2) >= bound / 10),
	   "%s: the encoding's error %.3g is within comp_error_bound %.3g, and not 10 times below", what,
	   sqrt(e2), bound);
	free(x);
	free(y);
	free(buf);
	free(buf2);
}

static void test_hostile(void)
{
	float x[5000], y[5000];
	unsigned char buf[20000];
	cot_errbuf eb = { 0 };
	for (int i = 0; i < 5000; i++)
		x[i] = (float)i - 2500.0f;
	size_t len = comp_encoded_size(COMP_BLOCK8, 5000);
	is_int((long long)len, 5000 + 8, "8-bit size: two scales and 5000 codes");
	comp_encode(COMP_BLOCK8, x, 5000, buf, len, &eb);

	for (int k = 0; k <= 2; k++) {
		size_t l = comp_encoded_size(k, 5000);
		ok(comp_decode(k, buf, l - 1, y, 5000, &eb) == COT_ERR_INVALID &&
		           comp_decode(k, buf, l + 1, y, 5000, &eb) == COT_ERR_INVALID,
		   "%s: a payload one byte short or long is refused", comp_name(k));
	}
	ok(comp_decode(7, buf, 10, y, 5, &eb) == COT_ERR_INVALID, "an unknown kind is refused");

	unsigned char bad[20000];
	const uint32_t scales[] = { 0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf800000u };
	const char *names[] = { "NaN", "Inf", "-Inf", "negative" };
	for (int s = 0; s < 4; s++) {
		memcpy(bad, buf, len);
		/* The second block's scale sits after 4 + 4096 bytes. */
		bad[4100] = (unsigned char)scales[s];
		bad[4101] = (unsigned char)(scales[s] >> 8);
		bad[4102] = (unsigned char)(scales[s] >> 16);
		bad[4103] = (unsigned char)(scales[s] >> 24);
		ok(comp_decode(COMP_BLOCK8, bad, len, y, 5000, &eb) == COT_ERR_INVALID,
		   "8-bit: a %s scale is refused (%s)", names[s], eb.msg);
	}
	memcpy(bad, buf, len);
	bad[10] = 0x80;
	ok(comp_decode(COMP_BLOCK8, bad, len, y, 5000, &eb) == COT_ERR_INVALID,
	   "8-bit: code -128 is refused");

	x[4500] = NAN;
	comp_encode(COMP_BLOCK8, x, 5000, buf, len, &eb);
	ok(comp_decode(COMP_BLOCK8, buf, len, y, 5000, &eb) == COT_ERR_INVALID,
	   "8-bit: a block holding NaN does not decode to finite values");
	x[4500] = INFINITY;
	comp_encode(COMP_FP16, x, 5000, buf, 10000, &eb);
	ok(comp_decode(COMP_FP16, buf, 10000, y, 5000, &eb) == COT_OK && isinf(y[4500]),
	   "fp16: Inf stays Inf, for the caller to refuse");
	ok(comp_encode(COMP_NONE, x, 10, buf, 39, &eb) == COT_ERR_INVALID,
	   "encode refuses an output of the wrong size");
}

int main(void)
{
	alarm(60);
	plan_lazy();
	is_int(comp_choose(65536, COMP_POLICY_AUTO), COMP_BLOCK8, "auto: 2^16 values get 8-bit");
	is_int(comp_choose(65535, COMP_POLICY_AUTO), COMP_FP16, "auto: fewer get fp16");
	is_int(comp_choose(10, COMP_POLICY_NONE), COMP_NONE, "policy none");
	is_int(comp_choose(1 << 20, COMP_POLICY_FP16), COMP_FP16, "policy fp16");
	test_half();
	test_roundtrip(COMP_NONE, 1000, "none");
	test_roundtrip(COMP_FP16, 100000, "fp16");
	test_roundtrip(COMP_BLOCK8, 3 * COMP_BLOCK + 17, "8-bit");
	test_roundtrip(COMP_BLOCK8, 5, "8-bit, one short block");
	test_hostile();
	done_testing();
	return exit_status();
}
