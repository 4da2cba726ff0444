/* cotrain: hashing, randomness and encodings over OpenSSL.
 *
 * sha256 of memory and files as raw bytes or lowercase hex, random bytes and
 * printable random tokens (account keys, host tokens) from the OS CSPRNG, and
 * base64 / base64url codecs.  Every function is thread-safe. */
#ifndef COT_HASH_H
#define COT_HASH_H

#include <stdbool.h>
#include <stddef.h>

#include "shared/common/error.h"

#define HASH_SHA256_LEN 32
#define HASH_SHA256_HEX_LEN 64 /* without the terminating NUL */

/* sha256 of len bytes at data into out (32 bytes).  Returns COT_OK, or
 * COT_ERR_INTERNAL when OpenSSL fails (never expected). */
cot_err hash_sha256(const void *data, size_t len, unsigned char out[HASH_SHA256_LEN]);

/* Same, written as 64 lowercase hex digits plus a NUL into out. */
cot_err hash_sha256_hex(const void *data, size_t len, char out[HASH_SHA256_HEX_LEN + 1]);

/* The hex sha256 of the a_len bytes at a followed by the b_len bytes at b
 * (a round's "moments_sha256": a model's first moments, then its second,
 * as fp32).  Errors as hash_sha256. */
cot_err hash_sha256_hex2(const void *a, size_t a_len, const void *b, size_t b_len,
                         char out[HASH_SHA256_HEX_LEN + 1]);

/* sha256 of the file at path, as lowercase hex; *size_out (when not NULL)
 * receives its length.  COT_ERR_IO with a detail in eb when it cannot be read. */
cot_err hash_file_sha256_hex(const char *path, char out[HASH_SHA256_HEX_LEN + 1], long long *size_out,
                             cot_errbuf *eb);

/* Lowercase hex of len bytes: out must hold 2*len+1 chars. */
void hash_hex(const unsigned char *data, size_t len, char *out);

/* The value of one hex digit of either case, or -1 for any other char. */
int hash_hex_digit(char c);

/* True when s is exactly 64 lowercase hex digits (a store name). */
bool hash_is_sha256_hex(const char *s);

/* len random bytes from the CSPRNG (RAND_bytes).  COT_ERR_INTERNAL when the
 * generator is not seeded (never expected on Linux). */
cot_err hash_random(void *out, size_t len);

/* A printable bearer secret: nbytes random bytes (16..64) in base64url
 * without padding, NUL-terminated into out (outlen >= 4*nbytes/3+2).
 * Returns COT_ERR_INVALID on bad sizes. */
cot_err hash_random_token(size_t nbytes, char *out, size_t outlen);

/* base64url (RFC 4648 section 5) without padding of len bytes into out,
 * NUL-terminated.  Returns the encoded length, or -1 when outlen is too small
 * (needs 4*ceil(len/3)+1). */
long hash_b64url_encode(const unsigned char *in, size_t len, char *out, size_t outlen);

/* Standard base64 with padding (RFC 4648 section 4), as in the password
 * format.  Same return convention as above. */
long hash_b64_encode(const unsigned char *in, size_t len, char *out, size_t outlen);

/* Decode standard padded base64 into out (outlen bytes).  Returns the decoded
 * length, or -1 on malformed input or a too small buffer. */
long hash_b64_decode(const char *in, unsigned char *out, size_t outlen);

#endif
