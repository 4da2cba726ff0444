/* cotrain kernels: the byte-level tokenizer (see tokenizer.h). */
#include "kernels/tokenizer.h"

size_t tok_encode(const void *text, size_t len, int32_t *out)
{
	const unsigned char *s = text;
	for (size_t i = 0; i < len; i++)
		out[i] = s[i];
	return len;
}

cot_err tok_decode(const int32_t *tokens, size_t n, char *out, cot_errbuf *eb)
{
	for (size_t i = 0; i < n; i++) {
		if (tokens[i] < 0 || tokens[i] >= TOK_VOCAB)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "token %d at position %zu is outside the "
			                  "byte vocabulary 0..%d",
			                  (int)tokens[i], i, TOK_VOCAB - 1);
		out[i] = (char)(unsigned char)tokens[i];
	}
	out[n] = '\0';
	return COT_OK;
}
