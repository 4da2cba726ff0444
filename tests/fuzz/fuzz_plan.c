/* Fuzz harness: an averaging plan as the client checks it (client/round.c,
 * cl_plan_parse), from JSON text as it comes off the wire, for host 7 in
 * round 3 of a 100-parameter model (the fixture of test_client_round).
 * What is accepted must be usable as is: members ascending and unique,
 * ranges tiling [0, param_count), ourselves among them. */
#include <string.h>

#include <jansson.h>

#include "client/round.h"
#include "shared/averaging/compress.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	if (!j)
		return 0;
	static cl_plan p;
	cot_errbuf eb;
	if (cl_plan_parse(j, 7, 3, 100, &p, &eb) == COT_OK) {
		FUZZ_CHECK(p.n >= 1 && p.n <= CL_PLAN_MAX_MEMBERS && p.self < p.n);
		FUZZ_CHECK(p.members[p.self].host_id == 7 && p.version == 3 && p.param_count == 100);
		FUZZ_CHECK(comp_kind_valid(p.comp));
		uint64_t at = 0;
		for (size_t i = 0; i < p.n; i++) {
			FUZZ_CHECK(i == 0 || p.members[i - 1].host_id < p.members[i].host_id);
			FUZZ_CHECK(p.members[i].lo == at && p.members[i].hi >= at);
			FUZZ_CHECK(p.members[i].samples > 0 && p.members[i].port > 0);
			at = p.members[i].hi;
		}
		FUZZ_CHECK(at == 100);
		for (size_t i = 0; i < p.n_cross; i++) /* the slices tile our range */
			FUZZ_CHECK(p.cross[i].lo == (i ? p.cross[i - 1].hi : p.members[p.self].lo) &&
			           p.cross[i].self < p.cross[i].n &&
			           p.cross[i].holders[p.cross[i].self].host_id == 7);
		FUZZ_CHECK(!p.n_cross || p.cross[p.n_cross - 1].hi == p.members[p.self].hi);
		cl_plan_free(&p);
	}
	json_decref(j);
	return 0;
}
