/* cotrain tests: text_escape and text_is_clean (shared/common/text.h), the
 * escaping of what a peer sent before it goes into a log line or a JSON
 * error message. */
#include <string.h>

#include "shared/common/text.h"
#include "tests/tap.h"

static void escapes(const char *in, const char *want, const char *what)
{
	char out[256];
	size_t n = text_escape(in, out, sizeof out);
	is_str(out, want, "%s", what);
	is_int((long long)n, (long long)strlen(want), "  its length");
	ok(text_is_clean(out), "  and the result is clean");
}

int main(void)
{
	plan_lazy();
	escapes("plain ascii", "plain ascii", "ASCII as it is");
	escapes("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
	        "two-, three- and four-byte characters as they are");
	escapes("a\nb\tc\rd\x7f", "a\\x0Ab\\x09c\\x0Dd\\x7F",
	        "control characters and DEL escaped: no forged line");
	escapes("\xff\xfe", "\\xFF\\xFE", "bytes that start no character escaped");
	escapes("\xc0\xaf", "\\xC0\\xAF", "an overlong '/' escaped");
	escapes("\xe0\x80\xaf", "\\xE0\\x80\\xAF", "an overlong three-byte form escaped");
	escapes("\xed\xa0\x80", "\\xED\\xA0\\x80", "a UTF-16 surrogate escaped");
	escapes("\xf4\x90\x80\x80", "\\xF4\\x90\\x80\\x80", "past U+10FFFF escaped");
	escapes("ok\xe2\x82", "ok\\xE2\\x82", "a character cut at the end escaped");
	escapes("\xe2\x82x", "\\xE2\\x82x", "a character cut before another escaped byte by byte");

	char small[8];
	size_t n = text_escape("ab\xc3\xa9\xc3\xa9\xc3\xa9", small, sizeof small);
	is_str(small, "ab\xc3\xa9\xc3\xa9", "a character that does not fit whole is left out");
	is_int((long long)n, 6, "  at 6 bytes of 8");
	n = text_escape("abcd\x01", small, sizeof small);
	is_str(small, "abcd", "an escape that does not fit whole is left out");
	n = text_escape("", small, 1);
	is_int((long long)n, 0, "an empty string into one byte");

	ok(text_is_clean("caf\xc3\xa9"), "clean: UTF-8");
	ok(!text_is_clean("a\nb"), "not clean: a newline");
	ok(!text_is_clean("\xc3"), "not clean: a cut character");
	done_testing();
	return exit_status();
}
