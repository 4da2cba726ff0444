/* Fuzz harness: the wire encodings of gradient slices
 * (shared/averaging/compress.c), decoded from a peer's bytes.  Byte 0 is
 * the kind (any value: unknown ones must be refused), bytes 1..2 the count
 * of values (little-endian), the rest the encoded data.  A decoded FP16 or
 * NONE payload must encode back to the same bytes (NaNs aside); a BLOCK8
 * one must decode to values within its blocks' scales. */
#include <math.h>
#include <string.h>

#include "shared/averaging/compress.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	int kind = data[0];
	size_t n = (size_t)data[1] | (size_t)data[2] << 8;
	const uint8_t *in = data + 3;
	size_t len = size - 3;
	float *out = malloc((n ? n : 1) * sizeof *out);
	if (!out)
		return 0;
	cot_errbuf eb;
	if (comp_decode(kind, in, len, out, n, &eb) == COT_OK) {
		FUZZ_CHECK(comp_kind_valid(kind) && len == comp_encoded_size(kind, n));
		int has_nan = 0;
		for (size_t i = 0; i < n; i++)
			has_nan |= isnan(out[i]);
		if (kind == COMP_BLOCK8) {
			for (size_t i = 0; i < n; i++) {
				float scale;
				memcpy(&scale, in + (i / COMP_BLOCK) * (4 + COMP_BLOCK), 4);
				FUZZ_CHECK(fabsf(out[i]) <= scale);
			}
		} else if (!has_nan) {
			unsigned char *again = malloc(len ? len : 1);
			if (again) {
				FUZZ_CHECK(comp_encode(kind, out, n, again, len, &eb) == COT_OK);
				FUZZ_CHECK(memcmp(again, in, len) == 0);
				free(again);
			}
		}
	}
	free(out);
	return 0;
}
