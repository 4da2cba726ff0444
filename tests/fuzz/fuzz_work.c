/* Fuzz harness: the server's answer to a work request as the client checks
 * it (client/api.c, cl_api_parse_work), from JSON text as it comes off the
 * wire.  What is accepted must be a work unit the client can compute: a
 * non-empty range no longer than an epoch, at most CL_MAX_FILES files with
 * well-formed hashes. */
#include <string.h>

#include <jansson.h>

#include "client/api.h"
#include "shared/common/hash.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *a = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	if (!a)
		return 0;
	static cl_project p;
	static cl_work w;
	memset(&p, 0, sizeof p);
	snprintf(p.name, sizeof p.name, "demo");
	cot_errbuf eb;
	if (cl_api_parse_work(a, 1700000000, &p, &w, &eb) == COT_OK) {
		FUZZ_CHECK(w.id > 0 && w.lo >= 0 && w.hi > w.lo && w.hi - w.lo <= p.mb_per_epoch);
		FUZZ_CHECK(w.nfiles <= CL_MAX_FILES && p.seq_len > 0 && p.microbatch_size > 0);
		for (int i = 0; i < w.nfiles; i++)
			FUZZ_CHECK(hash_is_sha256_hex(w.files[i].sha256) && w.files[i].size >= 0);
	}
	json_decref(a);
	return 0;
}
