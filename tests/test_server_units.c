/* cotrain tests: the server's building blocks without a server: sha256 and
 * encodings (shared/hash), password storage (shared/password), JSON shape
 * checks (shared/json) and the spot checks' gradient fingerprint
 * (shared/common/fingerprint). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/fingerprint.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/database/password.h"
#include "tests/tap.h"

static void test_hash(void)
{
	char hex[65];
	hash_sha256_hex("abc", 3, hex);
	is_str(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(\"abc\")");
	ok(hash_is_sha256_hex(hex), "a sha256 is a store name");
	hex[0] = 'B';
	ok(!hash_is_sha256_hex(hex), "uppercase is not a store name");
	ok(!hash_is_sha256_hex("abc"), "short is not a store name");
	char b[80];
	hash_b64_encode((const unsigned char *)"foobar", 6, b, sizeof b);
	is_str(b, "Zm9vYmFy", "base64 of foobar");
	hash_b64_encode((const unsigned char *)"fooba", 5, b, sizeof b);
	is_str(b, "Zm9vYmE=", "base64 with padding");
	hash_b64url_encode((const unsigned char *)"\xfb\xff", 2, b, sizeof b);
	is_str(b, "-_8", "base64url, no padding");
	unsigned char dec[16];
	long n = hash_b64_decode("Zm9vYmE=", dec, sizeof dec);
	ok(n == 5 && memcmp(dec, "fooba", 5) == 0, "base64 decodes");
	ok(hash_b64_decode("Zm9v!mE=", dec, sizeof dec) < 0, "bad base64 refused");
	ok(hash_b64_decode("Zm=v", dec, sizeof dec) < 0, "data after padding refused");
	char t1[64], t2[64];
	ok(hash_random_token(32, t1, sizeof t1) == COT_OK && strlen(t1) == 43,
	   "token of 32 bytes is 43 chars");
	hash_random_token(32, t2, sizeof t2);
	ok(strcmp(t1, t2) != 0, "two tokens differ");
	ok(hash_random_token(8, t1, sizeof t1) == COT_ERR_INVALID, "too short a token refused");
}

static void test_password(void)
{
	char h[PASSWORD_HASH_MAX];
	cot_errbuf eb = { "", "" };
	ok(password_hash("hunter22", 1000, h, sizeof h, &eb) == COT_OK, "hash a password");
	ok(strncmp(h, "pbkdf2-sha256$1000$", 19) == 0, "stored form names KDF and iterations");
	bool m = false;
	ok(password_verify("hunter22", h, &m, &eb) == COT_OK && m, "right password matches");
	ok(password_verify("hunter23", h, &m, &eb) == COT_OK && !m, "wrong password does not");
	char h2[PASSWORD_HASH_MAX];
	password_hash("hunter22", 1000, h2, sizeof h2, &eb);
	ok(strcmp(h, h2) != 0, "salted: same password, different hashes");
	ok(password_verify("x", "md5$abc", &m, &eb) == COT_ERR_CORRUPT && !m, "unknown format refused");
	ok(password_verify("x", "pbkdf2-sha256$0$AAAA$AAAA", &m, &eb) == COT_ERR_CORRUPT,
	   "zero iterations refused");
	ok(password_hash("x", 0, h, sizeof h, &eb) == COT_ERR_INVALID, "cannot hash with 0 iterations");
	/* Cross-checked with Python's hashlib.pbkdf2_hmac("sha256",
	 * b"password", b"saltsalt", 2, 32). */
	bool m2 = false;
	ok(password_verify("password",
	                   "pbkdf2-sha256$2$c2FsdHNhbHQ=$j0Xr2TDUGb2ExAqHE9c43F1b6VtmN1HehzWI9wkQpsQ=", &m2,
	                   &eb) == COT_OK &&
	           m2,
	   "known PBKDF2-HMAC-SHA256 vector");
}

static void test_json(void)
{
	json_t *o;
	cot_errbuf eb = { "", "" };
	const char *src = "{\"a\": 1, \"s\": \"xy\", \"r\": 1.5, \"b\": true, \"n\": null}";
	ok(cot_json_parse_object(src, strlen(src), &o, &eb) == COT_OK, "parse an object");
	long long i = 0;
	const char *s = NULL;
	double d = 0;
	bool b = false;
	ok(cot_json_int(o, "a", true, 0, 10, &i, &eb) == COT_OK && i == 1, "int field");
	ok(cot_json_int(o, "a", true, 2, 10, &i, &eb) == COT_ERR_INVALID, "int out of range");
	ok(cot_json_int(o, "r", true, 0, 10, &i, &eb) == COT_ERR_INVALID, "real is not an int");
	ok(cot_json_num(o, "a", true, 0, 10, &d, &eb) == COT_OK && d == 1, "int is a number");
	ok(cot_json_num(o, "r", true, 0, 10, &d, &eb) == COT_OK && d == 1.5, "real number");
	ok(cot_json_str(o, "s", true, 1, 2, &s, &eb) == COT_OK && strcmp(s, "xy") == 0, "string field");
	ok(cot_json_str(o, "s", true, 3, 9, &s, &eb) == COT_ERR_INVALID, "string too short");
	ok(cot_json_str(o, "a", true, 0, 9, &s, &eb) == COT_ERR_INVALID, "int is not a string");
	is_str(eb.msg, "field \"a\" must be a string", "message names the field");
	ok(cot_json_bool(o, "b", true, &b, &eb) == COT_OK && b, "bool field");
	ok(cot_json_int(o, "n", true, 0, 9, &i, &eb) == COT_ERR_INVALID, "null counts as missing");
	is_str(eb.msg, "missing field \"n\"", "missing field message");
	i = 42;
	ok(cot_json_int(o, "zz", false, 0, 9, &i, &eb) == COT_OK && i == 42, "optional absent keeps default");
	json_decref(o);
	ok(cot_json_parse_object("[1]", 3, &o, &eb) == COT_ERR_INVALID && !o, "array refused");
	ok(cot_json_parse_object("{\"a\":1,\"a\":2}", 13, &o, &eb) == COT_ERR_INVALID,
	   "duplicate keys refused");
	ok(cot_json_parse_object("{\"a\":\"\\u0000\"}", 14, &o, &eb) == COT_ERR_INVALID,
	   "NUL in string refused");
}

/* The fingerprint is k random projections of the gradient, each scaled by
 * 1/sqrt(n) (fingerprint.h): what a spot check can see of a cheat depends on
 * each projection using its own signs.  Checked by what follows from that,
 * not by the formula: a gradient of n ones gives k values whose squares
 * average about 1 (each is a sum of n random signs over sqrt(n)); the
 * gradient with its values in another order, or the same gradient under
 * another seed, gives a fingerprint far from the first; a rounding-level
 * change stays well inside the default tolerance (1e-3). */
static void test_fingerprint(void)
{
	enum { N = 4096, K = 256 };
	float *g = malloc(N * sizeof *g), *h = malloc(N * sizeof *h);
	double a[K], b[K];
	if (!g || !h)
		bail_out("out of memory");
	for (size_t i = 0; i < N; i++)
		g[i] = 1.0f;
	spot_fingerprint_compute(g, N, 12345, K, a);
	double sq = 0, big = 0;
	for (int j = 0; j < K; j++) {
		sq += a[j] * a[j];
		big = fabs(a[j]) > big ? fabs(a[j]) : big;
	}
	ok(sq / K > 0.7 && sq / K < 1.3 && big < 6,
	   "n ones: the %d values are sums of random signs over sqrt(n) (mean square %.3f, max %.2f)", K,
	   sq / K, big);

	uint32_t x = 2463534242u;
	for (size_t i = 0; i < N; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		g[i] = (float)((double)x / 4294967296.0 - 0.5);
		h[N - 1 - i] = g[i];
	}
	spot_fingerprint_compute(g, N, 777, K, a);
	spot_fingerprint_compute(h, N, 777, K, b);
	double d = spot_fingerprint_distance(a, b, K);
	ok(d > 0.5, "the same values in reverse order: distance %.3f, far from agreeing", d);
	spot_fingerprint_compute(g, N, 778, K, b);
	d = spot_fingerprint_distance(a, b, K);
	ok(d > 0.5, "the same gradient under another seed: distance %.3f", d);
	int same = 0;
	for (int j = 1; j < K; j++)
		same += a[j] == a[0];
	ok(same == 0, "the %d projections differ from one another (%d equal the first)", K, same);
	memcpy(h, g, N * sizeof *g);
	h[17] = nextafterf(h[17], 1.0f);
	spot_fingerprint_compute(h, N, 777, K, b);
	d = spot_fingerprint_distance(a, b, K);
	ok(d < 1e-5, "one value changed by one ulp: distance %.2g, within the tolerance", d);
	spot_fingerprint_compute(g, N, 777, K, b);
	ok(memcmp(a, b, sizeof a) == 0, "the same gradient and seed give the same bits");
	free(g);
	free(h);
}

int main(void)
{
	plan_lazy();
	test_hash();
	test_password();
	test_json();
	test_fingerprint();
	return exit_status();
}
