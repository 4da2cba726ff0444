/* Fuzz harness: a project's information as the client reads it from
 * GET /v1/projects/<name> (client/api.c, cl_api_parse_project), from JSON
 * text as it comes off the wire, and then the training mode it keeps, as
 * the compute session reads it (kern_mode_config_from_json,
 * kern_opt_config_from_json, kernels/opt_json.c).  What is accepted must be
 * a model the kernels can build. */
#include <string.h>

#include <jansson.h>

#include "client/api.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *a = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	if (!a)
		return 0;
	static cl_project p;
	memset(&p, 0, sizeof p);
	snprintf(p.name, sizeof p.name, "demo");
	cot_errbuf eb;
	if (cl_api_parse_project(a, &p, &eb) == COT_OK) {
		FUZZ_CHECK(p.seq_len > 0 && p.microbatch_size > 0 && p.mb_per_epoch > 0);
		FUZZ_CHECK(kern_config_validate(&p.model, &eb) == COT_OK);
		FUZZ_CHECK(p.mode.known && strlen(p.mode.json) < sizeof p.mode.json);
		kern_mode_config mc;
		kern_opt_config oc;
		if (kern_mode_config_from_json(p.mode.json, &mc, &eb) == COT_OK)
			FUZZ_CHECK(mc.mode == KERN_MODE_SYNC || mc.mode == KERN_MODE_LOCAL);
		kern_opt_config_from_json(p.mode.json, &oc, &eb);
	}
	json_decref(a);
	return 0;
}
