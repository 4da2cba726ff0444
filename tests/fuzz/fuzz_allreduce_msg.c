/* Fuzz harness: the all-reduce's messages (shared/averaging/allreduce_msg.c)
 * as a group member or aggregator sends them.  The first byte picks the
 * decoder (SLICE, ACCEPTED, RESULT, RESULT_PART, STREAM), the rest is the
 * payload.  What decodes must encode back to the same bytes, id lists must
 * be strictly ascending and bounded, and blobs must lie inside the payload;
 * a slice's or part's data then goes through comp_decode as the receivers
 * do, for a range of up to 2^16 values. */
#include <string.h>

#include "shared/averaging/allreduce_msg.h"
#include "shared/averaging/compress.h"
#include "tests/fuzz/fuzz.h"

#define MAX_IDS 256

/* w's bytes are exactly p[0..len). */
static void same_bytes(frame_writer *w, cot_err rc, const uint8_t *p, size_t len)
{
	FUZZ_CHECK(rc == COT_OK);
	FUZZ_CHECK(w->len == len && memcmp(w->buf, p, len) == 0);
	frame_writer_free(w);
}

static void in_payload(const unsigned char *d, size_t n, const uint8_t *p, size_t len)
{
	FUZZ_CHECK(n == 0 || (d >= p && d + n <= p + len));
}

static void ascending(const int64_t *ids, size_t n)
{
	FUZZ_CHECK(n <= MAX_IDS);
	for (size_t i = 1; i < n; i++)
		FUZZ_CHECK(ids[i - 1] < ids[i]);
}

/* Decode data as the values [start, end) the way a receiver would. */
static void values(int comp, uint64_t start, uint64_t end, const unsigned char *d, size_t n)
{
	if (end <= start || end - start > (1u << 16))
		return;
	size_t count = (size_t)(end - start);
	float *out = malloc(count * sizeof *out);
	if (!out)
		return;
	cot_errbuf eb;
	if (comp_decode(comp, d, n, out, count, &eb) == COT_OK)
		FUZZ_CHECK(n == comp_encoded_size(comp, count));
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const uint8_t *p = data + 1;
	size_t len = size - 1;
	cot_errbuf eb;
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	switch (data[0] % 5) {
	case 0: {
		ar_slice_msg m;
		if (ar_slice_decode(p, len, &m, &eb) == COT_OK) {
			in_payload(m.data, m.dlen, p, len);
			same_bytes(&w, ar_slice_encode(&w, &m), p, len);
			values(m.comp, m.start, m.end, m.data, m.dlen);
		}
		break;
	}
	case 1: {
		ar_accepted_msg m;
		if (ar_accepted_decode(p, len, MAX_IDS, &m, &eb) == COT_OK) {
			ascending(m.ids, m.n_ids);
			same_bytes(&w, ar_accepted_encode(&w, &m), p, len);
			free(m.ids);
		}
		break;
	}
	case 2: {
		ar_result_msg m;
		if (ar_result_decode(p, len, MAX_IDS, &m, &eb) == COT_OK) {
			ascending(m.ids, m.n_ids);
			in_payload(m.data, m.dlen, p, len);
			same_bytes(&w, ar_result_encode(&w, &m), p, len);
			values(m.comp, m.start, m.end, m.data, m.dlen);
			free(m.ids);
		}
		break;
	}
	case 3: {
		ar_part_msg m;
		if (ar_part_decode(p, len, &m, &eb) == COT_OK) {
			in_payload(m.data, m.dlen, p, len);
			same_bytes(&w, ar_part_encode(&w, &m), p, len);
			for (int comp = COMP_NONE; comp <= COMP_BLOCK8; comp++)
				values(comp, m.start, m.end, m.data, m.dlen);
		}
		break;
	}
	default: {
		ar_stream_msg m;
		if (ar_stream_decode(p, len, &m, &eb) == COT_OK)
			same_bytes(&w, ar_stream_encode(&w, &m), p, len);
		break;
	}
	}
	frame_writer_free(&w);
	return 0;
}
