/* cotrain client: cheating on purpose, a test hook (see cheat.h). */
#include "client/cheat.h"

#include <stdlib.h>
#include <string.h>

#include "shared/common/log.h"

static int skip_half;

cot_err cl_cheat_init(cot_errbuf *eb)
{
	const char *v = getenv("COTRAIN_CHEAT");
	if (!v || !*v)
		return COT_OK;
	if (strcmp(v, "skip-half") != 0)
		return cot_seterr(eb, COT_ERR_INVALID, "unknown cheat \"%s\" in COTRAIN_CHEAT", v);
	skip_half = 1;
	log_warn("test hook COTRAIN_CHEAT=%s: this client skips half of its microbatches", v);
	return COT_OK;
}

int cl_cheat_skip(int64_t g) { return skip_half && (g & 1); }
