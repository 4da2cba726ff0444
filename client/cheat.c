/* cotrain client: cheating on purpose, a test hook (see cheat.h). */
#include "client/cheat.h"

#include <stdlib.h>
#include <string.h>

#include "shared/common/log.h"

static int skip_half, poison;

cot_err cl_cheat_init(cot_errbuf *eb)
{
	const char *v = getenv("COTRAIN_CHEAT");
	if (!v || !*v)
		return COT_OK;
	if (strcmp(v, "skip-half") == 0)
		skip_half = 1;
	else if (strcmp(v, "poison") == 0)
		poison = 1;
	else
		return cot_seterr(eb, COT_ERR_INVALID, "unknown cheat \"%s\" in COTRAIN_CHEAT", v);
	log_warn("test hook COTRAIN_CHEAT=%s: this client %s", v,
	         skip_half ? "skips half of its microbatches" : "sends -5 times its gradient");
	return COT_OK;
}

int cl_cheat_skip(int64_t g) { return skip_half && (g & 1); }

float *cl_cheat_poison(const float *grad, size_t n)
{
	float *out = poison ? malloc(n * sizeof *out) : NULL;
	for (size_t i = 0; out && i < n; i++)
		out[i] = -5.0f * grad[i];
	return out;
}
