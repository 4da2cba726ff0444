/* Fuzz harness: a HELLO payload as a peer sends it (shared/peer/hello.c).
 * Whatever hello_decode accepts must be checkable against ours and must
 * encode back to the same bytes. */
#include <string.h>

#include "shared/peer/hello.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	hello_msg theirs;
	cot_errbuf eb;
	if (hello_decode(data, size, &theirs, &eb))
		return 0;
	FUZZ_CHECK(strlen(theirs.project) <= PKI_PROJECT_MAX);
	FUZZ_CHECK(theirs.proto_min >= 1 && theirs.proto_min <= theirs.proto_max);
	FUZZ_CHECK(theirs.max_payload >= FRAME_PAYLOAD_MIN_MAX && theirs.host_id > 0);

	hello_msg ours = { .proto_min = HELLO_PROTO_MIN,
		           .proto_max = HELLO_PROTO_MAX,
		           .project = "demo",
		           .host_id = 1,
		           .round = 3,
		           .max_payload = FRAME_PAYLOAD_DEFAULT_MAX };
	uint16_t version = 0;
	if (hello_check(&ours, &theirs, theirs.host_id, &version, &eb) == 0)
		FUZZ_CHECK(version >= HELLO_PROTO_MIN && version <= HELLO_PROTO_MAX);
	hello_check(&ours, &theirs, 2, &version, &eb);

	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	FUZZ_CHECK(hello_encode(&theirs, &w) == COT_OK);
	FUZZ_CHECK(w.len == size && memcmp(w.buf, data, size) == 0);
	frame_writer_free(&w);
	return 0;
}
