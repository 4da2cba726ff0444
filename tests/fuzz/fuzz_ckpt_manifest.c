/* Fuzz harness: a checkpoint's piece manifest as the client reads it from
 * GET /v1/projects/<name>/checkpoints/<sha256> (shared/common/ckpt_pieces.c,
 * ckpt_manifest_from_json), JSON text as it comes off the wire, checked
 * against the sha256 and size it names itself (the client's come from the
 * project's answer).  What is accepted must have the pieces its size
 * needs, of the size the size says, and read back from its own JSON. */
#include <string.h>

#include <jansson.h>

#include "shared/common/ckpt_pieces.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *a = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	if (!a)
		return 0;
	const char *sha = json_string_value(json_object_get(a, "sha256"));
	json_int_t sz = json_integer_value(json_object_get(a, "size"));
	ckpt_manifest m, back;
	cot_errbuf eb;
	if (sha && sz > 0 && ckpt_manifest_from_json(a, sha, (uint64_t)sz, &m, &eb) == COT_OK) {
		FUZZ_CHECK(m.size == (uint64_t)sz && m.piece_size == ckpt_piece_size(m.size));
		FUZZ_CHECK(m.n == (m.size + m.piece_size - 1) / m.piece_size);
		FUZZ_CHECK(ckpt_piece_len(&m, m.n - 1) > 0 && ckpt_piece_len(&m, m.n) == 0);
		json_t *j = ckpt_manifest_to_json(&m);
		FUZZ_CHECK(j && ckpt_manifest_from_json(j, sha, m.size, &back, &eb) == COT_OK);
		FUZZ_CHECK(back.n == m.n && memcmp(back.hash, m.hash, (size_t)m.n * sizeof *m.hash) == 0);
		json_decref(j);
		ckpt_manifest_free(&back);
		ckpt_manifest_free(&m);
	}
	json_decref(a);
	return 0;
}
