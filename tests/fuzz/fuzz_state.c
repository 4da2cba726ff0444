/* Fuzz harness: the client's state file as it may be found on disk after a
 * crash, a bad disk or a hand edit (client/state.c, cl_state_from_text).
 * Byte 0 picks the form: even, the rest is the JSON body and the harness
 * writes the header line with its correct checksum (so the fuzzer explores
 * the shape checks, not sha256); odd, the rest is the whole file.  A state
 * that loads must save to a text that loads again and saves to the same
 * text. */
#include <string.h>

#include "client/state.h"
#include "shared/common/hash.h"
#include "tests/fuzz/fuzz.h"

/* Load text into a fresh state: COT_OK with *s to free, or an error. */
static cot_err load(const char *text, size_t len, cl_state *s)
{
	cot_errbuf eb;
	if (cl_state_init(s))
		return COT_ERR_NOMEM;
	cot_err rc = cl_state_from_text(s, text, len, &eb);
	if (rc)
		cl_state_free(s);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > CL_STATE_MAX_BYTES)
		return 0;
	char *text;
	size_t len;
	if (data[0] % 2 == 0) {
		char sha[HASH_SHA256_HEX_LEN + 1];
		if (hash_sha256_hex(data + 1, size - 1, sha))
			return 0;
		char head[128];
		int hl = snprintf(head, sizeof head, "%s %d %s\n", CL_STATE_FORMAT, CL_STATE_VERSION, sha);
		len = (size_t)hl + size - 1;
		text = malloc(len + 1);
		if (!text)
			return 0;
		memcpy(text, head, (size_t)hl);
		memcpy(text + hl, data + 1, size - 1);
	} else {
		len = size - 1;
		text = malloc(len + 1);
		if (!text)
			return 0;
		memcpy(text, data + 1, len);
	}
	text[len] = '\0';
	cl_state s, s2;
	if (load(text, len, &s) == COT_OK) {
		FUZZ_CHECK(s.nprojects >= 0 && s.nprojects <= CL_MAX_PROJECTS);
		for (int i = 0; i < s.nprojects; i++)
			FUZZ_CHECK(s.projects[i].work.nfiles >= 0 &&
			           s.projects[i].work.nfiles <= CL_MAX_FILES);
		char *t1 = NULL, *t2 = NULL;
		size_t l1 = 0, l2 = 0;
		cot_errbuf eb;
		FUZZ_CHECK(cl_state_to_text(&s, &t1, &l1, &eb) == COT_OK);
		FUZZ_CHECK(load(t1, l1, &s2) == COT_OK);
		FUZZ_CHECK(cl_state_to_text(&s2, &t2, &l2, &eb) == COT_OK);
		FUZZ_CHECK(l1 == l2 && memcmp(t1, t2, l1) == 0);
		free(t1);
		free(t2);
		cl_state_free(&s2);
		cl_state_free(&s);
	}
	free(text);
	return 0;
}
