/* Fuzz harness: a maintainer's project file (server/project_file.c,
 * pf_parse), which cotrain-admin reads and the server re-reads from the
 * database.  A file that parses must normalize to a text that parses again
 * to the same normalized text. */
#include <string.h>

#include "server/project_file.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pf_project p;
	char *norm = NULL;
	cot_errbuf eb;
	if (pf_parse((const char *)data, size, &p, &norm, &eb)) {
		FUZZ_CHECK(norm == NULL);
		return 0;
	}
	FUZZ_CHECK(norm != NULL);
	FUZZ_CHECK(strlen(p.name) <= PF_NAME_MAX &&
	           (!p.description || strlen(p.description) <= PF_DESCRIPTION_MAX));
	FUZZ_CHECK(pf_param_count(&p.model) <= PF_MAX_PARAMS);
	pf_project q;
	char *norm2 = NULL;
	FUZZ_CHECK(pf_parse(norm, strlen(norm), &q, &norm2, &eb) == COT_OK);
	FUZZ_CHECK(strcmp(norm, norm2) == 0);
	pf_free(&q);
	free(norm2);
	pf_free(&p);
	free(norm);
	return 0;
}
