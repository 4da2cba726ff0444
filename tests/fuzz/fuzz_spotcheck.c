/* Fuzz harness: a spot check as the server hands it to a client
 * (client/spotcheck.c, cl_spot_check_parse), from JSON text as it comes off
 * the wire, for project "demo" with 1000 microbatches an epoch. */
#include <string.h>

#include <jansson.h>

#include "client/spotcheck.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *c = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	if (!c)
		return 0;
	static cl_project p;
	memset(&p, 0, sizeof p);
	snprintf(p.name, sizeof p.name, "demo");
	p.seq_len = 128;
	p.microbatch_size = 8;
	p.mb_per_epoch = 1000;
	cot_errbuf eb;
	cl_spot_check_parse(c, &p, &eb);
	json_decref(c);
	return 0;
}
