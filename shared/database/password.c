/* cotrain: password storage with PBKDF2-HMAC-SHA256. */
#include "shared/database/password.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "shared/common/hash.h"

#define SALT_LEN 16
#define KEY_LEN 32
#define PREFIX "pbkdf2-sha256$"

static cot_err derive(const char *password, const unsigned char *salt, size_t saltlen, int iterations,
                      unsigned char key[KEY_LEN], cot_errbuf *eb)
{
	size_t plen = strlen(password);
	if (plen > PASSWORD_MAX_LEN)
		return cot_seterr(eb, COT_ERR_INVALID, "password is longer than %d bytes", PASSWORD_MAX_LEN);
	if (!PKCS5_PBKDF2_HMAC(password, (int)plen, salt, (int)saltlen, iterations, EVP_sha256(), KEY_LEN,
	                       key))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not derive the password key");
	return COT_OK;
}

cot_err password_hash(const char *password, int iterations, char *out, size_t outlen, cot_errbuf *eb)
{
	if (iterations < PASSWORD_MIN_ITERATIONS || iterations > PASSWORD_MAX_ITERATIONS)
		return cot_seterr(eb, COT_ERR_INVALID, "KDF iteration count %d is out of range", iterations);
	unsigned char salt[SALT_LEN], key[KEY_LEN];
	if (hash_random(salt, sizeof salt))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not draw a random salt");
	cot_err rc = derive(password, salt, sizeof salt, iterations, key, eb);
	if (rc)
		return rc;
	char salt64[32], key64[64];
	hash_b64_encode(salt, sizeof salt, salt64, sizeof salt64);
	hash_b64_encode(key, sizeof key, key64, sizeof key64);
	OPENSSL_cleanse(key, sizeof key);
	int n = snprintf(out, outlen, PREFIX "%d$%s$%s", iterations, salt64, key64);
	if (n < 0 || (size_t)n >= outlen)
		return cot_seterr(eb, COT_ERR_INVALID, "password hash buffer is too small");
	return COT_OK;
}

cot_err password_verify(const char *password, const char *stored, bool *match, cot_errbuf *eb)
{
	*match = false;
	if (strncmp(stored, PREFIX, strlen(PREFIX)) != 0)
		return cot_seterr(eb, COT_ERR_CORRUPT, "unknown password hash format");
	const char *p = stored + strlen(PREFIX);
	char *end;
	long iters = strtol(p, &end, 10);
	if (end == p || *end != '$' || iters < PASSWORD_MIN_ITERATIONS || iters > PASSWORD_MAX_ITERATIONS)
		return cot_seterr(eb, COT_ERR_CORRUPT, "bad iteration count in password hash");
	const char *salt64 = end + 1;
	const char *dollar = strchr(salt64, '$');
	if (!dollar || (size_t)(dollar - salt64) >= 64)
		return cot_seterr(eb, COT_ERR_CORRUPT, "bad salt in password hash");
	char saltbuf[64];
	memcpy(saltbuf, salt64, (size_t)(dollar - salt64));
	saltbuf[dollar - salt64] = '\0';
	unsigned char salt[48], want[48], got[KEY_LEN];
	long saltlen = hash_b64_decode(saltbuf, salt, sizeof salt);
	long keylen = hash_b64_decode(dollar + 1, want, sizeof want);
	if (saltlen < 8 || keylen != KEY_LEN)
		return cot_seterr(eb, COT_ERR_CORRUPT, "bad salt or key in password hash");
	cot_err rc = derive(password, salt, (size_t)saltlen, (int)iters, got, eb);
	if (rc)
		return rc;
	*match = CRYPTO_memcmp(got, want, KEY_LEN) == 0;
	OPENSSL_cleanse(got, sizeof got);
	return COT_OK;
}
