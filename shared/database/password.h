/* cotrain: password storage with a slow KDF.
 *
 * Stored form (account.password_hash):
 *     pbkdf2-sha256$<iterations>$<salt base64>$<hash base64>
 * PBKDF2-HMAC-SHA256 (OpenSSL PKCS5_PBKDF2_HMAC), a 16-byte random salt and a
 * 32-byte derived key.  Production uses PASSWORD_DEFAULT_ITERATIONS; tests
 * may pass fewer so they stay fast.  Verification reads the iteration count
 * from the stored string, so changing the default never locks anyone out. */
#ifndef COT_PASSWORD_H
#define COT_PASSWORD_H

#include <stdbool.h>
#include <stddef.h>

#include "shared/common/error.h"

#define PASSWORD_DEFAULT_ITERATIONS 210000 /* OWASP 2023 for PBKDF2-HMAC-SHA256 */
#define PASSWORD_MIN_ITERATIONS 1
#define PASSWORD_MAX_ITERATIONS 10000000
#define PASSWORD_MAX_LEN 1024 /* bytes; longer passwords are refused */
#define PASSWORD_HASH_MAX 160 /* room for the stored string and its NUL */

/* Derive the stored form of password with the given iteration count into out
 * (outlen >= PASSWORD_HASH_MAX).  COT_ERR_INVALID for an iteration count out
 * of range or a password longer than PASSWORD_MAX_LEN; COT_ERR_INTERNAL when
 * OpenSSL fails.  Details in eb. */
cot_err password_hash(const char *password, int iterations, char *out, size_t outlen, cot_errbuf *eb);

/* Check password against a stored form.  *match is set to true only when it
 * matches (constant-time comparison).  COT_ERR_CORRUPT when stored is not a
 * form this module writes; a mismatch is not an error. */
cot_err password_verify(const char *password, const char *stored, bool *match, cot_errbuf *eb);

#endif
