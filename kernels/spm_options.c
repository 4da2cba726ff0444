/* cotrain kernels: the options of a subword tokenizer, as a maintainer
 * types them (--normalize, --special; see spm.h). */
#include "kernels/spm.h"

#include <string.h>

cot_err spm_parse_special(const char *s, char *buf, const char *out[SPM_SPECIAL_MAX], int *n, cot_errbuf *eb)
{
	*n = 0;
	strcpy(buf, s);
	if (!*buf)
		return COT_OK;
	char *p = buf;
	for (;;) {
		char *comma = strchr(p, ',');
		if (comma)
			*comma = '\0';
		size_t len = strlen(p);
		if (len == 0 || len > SPM_SPECIAL_LEN_MAX)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "special token %d is %s: use 1 to %d printable ASCII characters",
			                  *n + 1, len ? "too long" : "empty", SPM_SPECIAL_LEN_MAX);
		for (size_t i = 0; i < len; i++)
			if (p[i] <= ' ' || p[i] > '~')
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "special token \"%.40s\" holds a space or a character that "
				                  "is not "
				                  "printable ASCII",
				                  p);
		for (int i = 0; i < *n; i++)
			if (strcmp(out[i], p) == 0)
				return cot_seterr(eb, COT_ERR_INVALID, "special token \"%s\" is given twice",
				                  p);
		if (*n == SPM_SPECIAL_MAX)
			return cot_seterr(eb, COT_ERR_INVALID, "too many special tokens: at most %d",
			                  SPM_SPECIAL_MAX);
		out[(*n)++] = p;
		if (!comma)
			return COT_OK;
		p = comma + 1;
	}
}

cot_err spm_parse_normalize(const char *s, unsigned *flags, cot_errbuf *eb)
{
	*flags = 0;
	if (strcmp(s, "none") == 0)
		return COT_OK;
	const char *p = s;
	while (*p) {
		size_t len = strcspn(p, ",");
		if (len == 4 && strncmp(p, "nfkc", 4) == 0)
			*flags |= SPM_NORM_NFKC;
		else if (len == 9 && strncmp(p, "lowercase", 9) == 0)
			*flags |= SPM_NORM_LOWERCASE;
		else if (len == 12 && strncmp(p, "keep-accents", 12) == 0)
			*flags |= SPM_NORM_KEEP_ACCENTS;
		else
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "unknown normalisation \"%.*s\": use nfkc, lowercase and "
			                  "keep-accents, "
			                  "separated by commas",
			                  (int)(len > 40 ? 40 : len), p);
		p += len;
		if (*p == ',')
			p++;
	}
	if ((*flags & SPM_NORM_LOWERCASE) && !(*flags & SPM_NORM_NFKC)) {
		cot_seterr(eb, COT_ERR_INVALID, "normalisation \"lowercase\" needs \"nfkc\"");
		cot_sethint(eb, "SentencePiece lowercases as part of NFKC (its nfkc_cf rule): give "
		                "--normalize nfkc,lowercase.");
		return COT_ERR_INVALID;
	}
	return COT_OK;
}
