/* cotrain kernels: the byte-level tokenizer.
 *
 * Every byte is one token, 0..255, so any text in any language (and any
 * bytes that are not text at all) round-trips exactly, with no vocabulary
 * file.  The model file names its tokenizer: TOK_NAME goes into the
 * checkpoint metadata. */
#ifndef KERN_TOKENIZER_H
#define KERN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define TOK_NAME "byte"
#define TOK_VOCAB 256

/* Encode len bytes of text (UTF-8 or not; NUL bytes included) into
 * out[0..len), which the caller provides.  Returns the number of tokens,
 * always len.  Cannot fail. */
size_t tok_encode(const void *text, size_t len, int32_t *out);

/* Decode n tokens into out[0..n) and write a NUL at out[n]: the caller
 * provides n + 1 bytes.  The text may contain NUL bytes of its own, so use
 * n as its length.  Returns COT_ERR_INVALID, naming the first bad position,
 * when a token is outside 0..TOK_VOCAB-1; out is then unspecified. */
cot_err tok_decode(const int32_t *tokens, size_t n, char *out, cot_errbuf *eb);

#endif
