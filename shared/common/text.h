/* cotrain: text that came from outside, made safe to print and to put in
 * JSON.  A path, a header or a field a peer sent may hold bytes that are
 * not UTF-8 (which Jansson refuses to encode) or control characters (which
 * would forge lines in a log). */
#ifndef COT_TEXT_H
#define COT_TEXT_H

#include <stddef.h>

/* Copies the C string in to out (outlen bytes, outlen > 0, always
 * NUL-terminated): valid UTF-8 as it is, except that each byte below 0x20
 * and 0x7F, and each byte of a sequence that is not valid UTF-8 (overlong,
 * a surrogate, past U+10FFFF, truncated), is written as the four characters
 * "\xNN".  A character that does not fit whole is left out with all that
 * follows.  The result is valid UTF-8 without control characters.  Returns
 * the length written. */
size_t text_escape(const char *in, char *out, size_t outlen);

/* Whether the C string s is valid UTF-8 without control characters (the
 * strings text_escape leaves as they are). */
int text_is_clean(const char *s);

#endif
