/* cotrain: text from outside made safe to print and to put in JSON. */
#include "shared/common/text.h"

#include <stdio.h>
#include <string.h>

/* The length of the valid UTF-8 character at p (1 to 4), or 0 when p does
 * not start one.  Reads no further than the first byte that does not fit,
 * so a NUL ends it. */
static size_t utf8_char_len(const unsigned char *p)
{
	unsigned c = p[0];
	size_t n;
	unsigned min;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		n = 2, min = 0x80;
	else if (c >= 0xE0 && c <= 0xEF)
		n = 3, min = 0x800;
	else if (c >= 0xF0 && c <= 0xF4)
		n = 4, min = 0x10000;
	else
		return 0;
	unsigned cp = c & (0x7F >> n);
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3F);
	}
	if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return n;
}

static int is_control(unsigned char c) { return c < 0x20 || c == 0x7F; }

size_t text_escape(const char *in, char *out, size_t outlen)
{
	const unsigned char *p = (const unsigned char *)in;
	size_t o = 0;
	while (*p) {
		size_t n = utf8_char_len(p);
		if (n == 0 || (n == 1 && is_control(*p))) {
			if (o + 4 >= outlen)
				break;
			snprintf(out + o, 5, "\\x%02X", *p);
			o += 4;
			p++;
		} else {
			if (o + n >= outlen)
				break;
			memcpy(out + o, p, n);
			o += n;
			p += n;
		}
	}
	out[o] = '\0';
	return o;
}

int text_is_clean(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_char_len(p);
		if (n == 0 || (n == 1 && is_control(*p)))
			return 0;
		p += n;
	}
	return 1;
}
