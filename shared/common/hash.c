/* cotrain: hashing, randomness and encodings over OpenSSL. */
#include "shared/common/hash.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

cot_err hash_sha256(const void *data, size_t len, unsigned char out[HASH_SHA256_LEN])
{
	unsigned int n = 0;
	if (!EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) || n != HASH_SHA256_LEN)
		return COT_ERR_INTERNAL;
	return COT_OK;
}

void hash_hex(const unsigned char *data, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[data[i] >> 4];
		out[2 * i + 1] = digits[data[i] & 15];
	}
	out[2 * len] = '\0';
}

int hash_hex_digit(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
	                              : -1;
}

cot_err hash_sha256_hex2(const void *a, size_t a_len, const void *b, size_t b_len,
                         char out[HASH_SHA256_HEX_LEN + 1])
{
	unsigned char md[HASH_SHA256_LEN];
	unsigned int n = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, a, a_len) &&
	          EVP_DigestUpdate(ctx, b, b_len) && EVP_DigestFinal_ex(ctx, md, &n) && n == HASH_SHA256_LEN;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return COT_ERR_INTERNAL;
	hash_hex(md, sizeof md, out);
	return COT_OK;
}

cot_err hash_sha256_hex(const void *data, size_t len, char out[HASH_SHA256_HEX_LEN + 1])
{
	unsigned char md[HASH_SHA256_LEN];
	cot_err rc = hash_sha256(data, len, md);
	if (rc)
		return rc;
	hash_hex(md, sizeof md, out);
	return COT_OK;
}

cot_err hash_file_sha256_hex(const char *path, char out[HASH_SHA256_HEX_LEN + 1], long long *size_out,
                             cot_errbuf *eb)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return cot_seterr(eb, COT_ERR_IO, "could not open file \"%s\": %s", path, strerror(errno));
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(ctx);
		fclose(f);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start sha256");
	}
	unsigned char buf[65536];
	long long total = 0;
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
		EVP_DigestUpdate(ctx, buf, n);
		total += (long long)n;
	}
	int err = ferror(f);
	fclose(f);
	unsigned char md[HASH_SHA256_LEN];
	unsigned int mdlen = 0;
	int fin = EVP_DigestFinal_ex(ctx, md, &mdlen);
	EVP_MD_CTX_free(ctx);
	if (err)
		return cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\"", path);
	if (!fin || mdlen != HASH_SHA256_LEN)
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not finish sha256");
	hash_hex(md, sizeof md, out);
	if (size_out)
		*size_out = total;
	return COT_OK;
}

bool hash_is_sha256_hex(const char *s)
{
	size_t i;
	for (i = 0; s[i]; i++) {
		if (i >= HASH_SHA256_HEX_LEN)
			return false;
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return i == HASH_SHA256_HEX_LEN;
}

cot_err hash_random(void *out, size_t len)
{
	if (len > (size_t)0x7fffffff || RAND_bytes(out, (int)len) != 1)
		return COT_ERR_INTERNAL;
	return COT_OK;
}

static long b64_encode(const unsigned char *in, size_t len, char *out, size_t outlen, const char *alphabet,
                       bool pad)
{
	size_t full = 4 * ((len + 2) / 3);
	if (outlen < full + 1)
		return -1;
	size_t o = 0, i = 0;
	for (; i + 2 < len; i += 3) {
		unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
		out[o++] = alphabet[v >> 18 & 63];
		out[o++] = alphabet[v >> 12 & 63];
		out[o++] = alphabet[v >> 6 & 63];
		out[o++] = alphabet[v & 63];
	}
	if (i < len) {
		unsigned v = (unsigned)in[i] << 16 | (i + 1 < len ? (unsigned)in[i + 1] << 8 : 0);
		out[o++] = alphabet[v >> 18 & 63];
		out[o++] = alphabet[v >> 12 & 63];
		if (i + 1 < len)
			out[o++] = alphabet[v >> 6 & 63];
		else if (pad)
			out[o++] = '=';
		if (pad)
			out[o++] = '=';
	}
	out[o] = '\0';
	return (long)o;
}

static const char b64_std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64_url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

long hash_b64url_encode(const unsigned char *in, size_t len, char *out, size_t outlen)
{
	return b64_encode(in, len, out, outlen, b64_url, false);
}

long hash_b64_encode(const unsigned char *in, size_t len, char *out, size_t outlen)
{
	return b64_encode(in, len, out, outlen, b64_std, true);
}

static int b64_value(char c)
{
	const char *p = c ? strchr(b64_std, c) : NULL;
	return p ? (int)(p - b64_std) : -1;
}

long hash_b64_decode(const char *in, unsigned char *out, size_t outlen)
{
	size_t len = strlen(in);
	if (len % 4 != 0)
		return -1;
	size_t o = 0;
	for (size_t i = 0; i < len; i += 4) {
		int v[4], npad = 0;
		for (int k = 0; k < 4; k++) {
			if (in[i + k] == '=' && i + 4 == len && k >= 2) {
				v[k] = 0;
				npad++;
			} else if (npad) {
				return -1; /* data after padding */
			} else if ((v[k] = b64_value(in[i + k])) < 0) {
				return -1;
			}
		}
		unsigned w =
		        (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
		size_t nout = 3 - (size_t)npad;
		if (o + nout > outlen)
			return -1;
		out[o++] = (unsigned char)(w >> 16);
		if (nout > 1)
			out[o++] = (unsigned char)(w >> 8);
		if (nout > 2)
			out[o++] = (unsigned char)w;
	}
	return (long)o;
}

cot_err hash_random_token(size_t nbytes, char *out, size_t outlen)
{
	unsigned char raw[64];
	if (nbytes < 16 || nbytes > sizeof raw)
		return COT_ERR_INVALID;
	cot_err rc = hash_random(raw, nbytes);
	if (rc)
		return rc;
	if (hash_b64url_encode(raw, nbytes, out, outlen) < 0)
		return COT_ERR_INVALID;
	return COT_OK;
}
