/* Fuzz harness: the peer frame layer (shared/peer/frame.c), a whole frame as
 * a peer sends it.  The header is decoded under two limits (the default and
 * the smallest a peer may announce) and re-encoded to the same bytes; an
 * ERROR payload goes through frame_error_decode; any other payload is walked
 * with a frame_reader whose reads are chosen by the payload's own bytes. */
#include <string.h>

#include "shared/peer/frame.h"
#include "tests/fuzz/fuzz.h"

/* Read p with the getters, the kind of each read taken from the next byte
 * of p itself, until the reader fails or the payload is used up. */
static void walk(const unsigned char *p, size_t len)
{
	frame_reader r;
	frame_reader_init(&r, p, len);
	char s[300];
	for (int i = 0; i < 64 && !r.failed && r.pos < r.len; i++) {
		uint8_t op;
		uint16_t u16;
		uint32_t u32;
		uint64_t u64;
		int64_t i64;
		float f;
		double d;
		const unsigned char *b;
		size_t n;
		if (frame_get_u8(&r, &op))
			break;
		switch (op % 9) {
		case 0:
			frame_get_u16(&r, &u16);
			break;
		case 1:
			frame_get_u32(&r, &u32);
			break;
		case 2:
			frame_get_u64(&r, &u64);
			break;
		case 3:
			frame_get_i64(&r, &i64);
			break;
		case 4:
			frame_get_f32(&r, &f);
			break;
		case 5:
			frame_get_f64(&r, &d);
			break;
		case 6:
			if (frame_get_blob(&r, &b, &n, op) == 0)
				FUZZ_CHECK(n <= op && b >= p && b + n <= p + len);
			break;
		case 7:
			if (frame_get_str(&r, s, sizeof s) == 0)
				FUZZ_CHECK(strlen(s) < sizeof s);
			break;
		default:
			frame_get_u8(&r, &op);
			break;
		}
		FUZZ_CHECK(r.pos <= r.len);
	}
	cot_errbuf eb;
	frame_reader_end(&r, "fuzz", &eb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t limits[] = { FRAME_PAYLOAD_DEFAULT_MAX, FRAME_PAYLOAD_MIN_MAX, 0 };
	for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
		frame_header h;
		const unsigned char *payload = NULL;
		size_t flen = 0;
		cot_errbuf eb;
		if (frame_decode(data, size, limits[k], &h, &payload, &flen, &eb))
			continue;
		FUZZ_CHECK(flen == FRAME_HEADER_LEN + (size_t)h.length && flen <= size);
		FUZZ_CHECK(h.length <= limits[k] && payload == data + FRAME_HEADER_LEN);
		unsigned char again[FRAME_HEADER_LEN];
		frame_header_encode(&h, again);
		FUZZ_CHECK(memcmp(again, data, FRAME_HEADER_LEN) == 0);
		frame_type_name(h.type);
		if (h.type == FRAME_ERROR) {
			uint16_t code;
			char reason[FRAME_REASON_MAX + 1];
			if (frame_error_decode(payload, h.length, &code, reason, &eb) == 0) {
				FUZZ_CHECK(strlen(reason) <= FRAME_REASON_MAX);
				frame_error_to_cot(code);
			}
		} else {
			walk(payload, h.length);
		}
	}
	return 0;
}
