/* Fuzz harness: a SentencePiece model's bytes as cotrain reads them for
 * tokenizer.json (kernels/spm_proto.c, spm_proto_parse): the protobuf wire
 * format, read by hand.  What is accepted has at least one piece, and every
 * piece's bytes lie inside the input. */
#include "kernels/spm_proto.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	spm_proto p;
	cot_errbuf eb;
	if (spm_proto_parse(data, size, &p, &eb) == COT_OK) {
		FUZZ_CHECK(p.n_pieces > 0 && p.pieces != NULL);
		for (int i = 0; i < p.n_pieces; i++)
			FUZZ_CHECK((const uint8_t *)p.pieces[i].piece >= data &&
			           (const uint8_t *)p.pieces[i].piece + p.pieces[i].len <= data + size);
		FUZZ_CHECK(p.charsmap_len == 0 ||
		           (p.charsmap >= data && p.charsmap + p.charsmap_len <= data + size));
		spm_proto_free(&p);
	} else {
		FUZZ_CHECK(p.pieces == NULL && p.n_pieces == 0);
	}
	return 0;
}
