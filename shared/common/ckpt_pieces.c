/* cotrain: piece manifests of content-addressed files (ckpt_pieces.h). */
#include "shared/common/ckpt_pieces.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "shared/common/json.h"

uint32_t ckpt_piece_size(uint64_t size)
{
	uint64_t want = (size + CKPT_PIECES_TARGET - 1) / CKPT_PIECES_TARGET;
	uint32_t ps = CKPT_PIECE_MIN;
	while (ps < want && ps < CKPT_PIECE_MAX)
		ps <<= 1;
	return ps;
}

uint32_t ckpt_piece_len(const ckpt_manifest *m, uint32_t i)
{
	uint64_t off = (uint64_t)i * m->piece_size;
	if (i >= m->n || off >= m->size)
		return 0;
	uint64_t left = m->size - off;
	return left < m->piece_size ? (uint32_t)left : m->piece_size;
}

static cot_err alloc_pieces(ckpt_manifest *m, const char *sha256, uint64_t size, cot_errbuf *eb)
{
	memset(m, 0, sizeof *m);
	if (size == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "file %s is empty: it has no pieces", sha256);
	if (size > CKPT_FILE_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "file %s has %llu bytes, more than pieces allow",
		                  sha256, (unsigned long long)size);
	snprintf(m->sha256, sizeof m->sha256, "%s", sha256);
	m->size = size;
	m->piece_size = ckpt_piece_size(size);
	m->n = (uint32_t)((size + m->piece_size - 1) / m->piece_size);
	m->hash = malloc((size_t)m->n * sizeof *m->hash);
	if (!m->hash)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	return COT_OK;
}

cot_err ckpt_manifest_build(const char *path, const char *sha256, ckpt_manifest *m, cot_errbuf *eb)
{
	memset(m, 0, sizeof *m);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open file \"%s\": %s", path, strerror(errno));
	struct stat st;
	cot_err rc = COT_OK;
	unsigned char *buf = NULL;
	EVP_MD_CTX *whole = EVP_MD_CTX_new();
	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		rc = cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\": not a regular file", path);
	else if (!whole || !(buf = malloc(CKPT_PIECE_MAX)))
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	else if (!(rc = alloc_pieces(m, sha256, (uint64_t)st.st_size, eb)) &&
	         !EVP_DigestInit_ex(whole, EVP_sha256(), NULL))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not start a sha256");
	for (uint32_t i = 0; !rc && i < m->n; i++) {
		uint32_t len = ckpt_piece_len(m, i);
		ssize_t got = pread(fd, buf, len, (off_t)i * m->piece_size);
		if (got != (ssize_t)len)
			rc = cot_seterr(eb, COT_ERR_IO, "could not read piece %u of \"%s\": %s", i, path,
			                got < 0 ? strerror(errno) : "the file is shorter than it was");
		else if (hash_sha256(buf, len, m->hash[i]) || !EVP_DigestUpdate(whole, buf, len))
			rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash piece %u", i);
	}
	unsigned char dig[HASH_SHA256_LEN];
	char hex[HASH_SHA256_HEX_LEN + 1];
	if (!rc) {
		if (!EVP_DigestFinal_ex(whole, dig, NULL))
			rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not finish a sha256");
		hash_hex(dig, sizeof dig, hex);
		if (!rc && strcmp(hex, sha256) != 0)
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "file \"%s\" hashes to %s, not %s", path, hex,
			                sha256);
	}
	EVP_MD_CTX_free(whole);
	free(buf);
	close(fd);
	if (rc)
		ckpt_manifest_free(m);
	return rc;
}

json_t *ckpt_manifest_to_json(const ckpt_manifest *m)
{
	json_t *pieces = json_array();
	for (uint32_t i = 0; pieces && i < m->n; i++) {
		char hex[HASH_SHA256_HEX_LEN + 1];
		hash_hex(m->hash[i], HASH_SHA256_LEN, hex);
		if (json_array_append_new(pieces, json_string(hex))) {
			json_decref(pieces);
			return NULL;
		}
	}
	if (!pieces)
		return NULL;
	return json_pack("{s:s, s:I, s:I, s:o}", "sha256", m->sha256, "size", (json_int_t)m->size,
	                 "piece_size", (json_int_t)m->piece_size, "pieces", pieces);
}

static int unhex(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

cot_err ckpt_manifest_from_json(const json_t *j, const char *sha256, uint64_t size, ckpt_manifest *m,
                                cot_errbuf *eb)
{
	memset(m, 0, sizeof *m);
	const char *sha = NULL;
	long long sz = 0, ps = 0;
	cot_errbuf e2 = { "", "" };
	if (!json_is_object(j) || cot_json_str(j, "sha256", true, 64, 64, &sha, &e2) ||
	    cot_json_int(j, "size", true, 1, (long long)CKPT_FILE_MAX, &sz, &e2) ||
	    cot_json_int(j, "piece_size", true, CKPT_PIECE_MIN, CKPT_PIECE_MAX, &ps, &e2))
		return cot_seterr(eb, COT_ERR_INVALID, "malformed piece manifest: %s",
		                  e2.msg[0] ? e2.msg : "not an object");
	if (strcmp(sha, sha256) != 0 || (uint64_t)sz != size)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "piece manifest is for file %s of %lld bytes, not %s of %llu bytes", sha,
		                  sz, sha256, (unsigned long long)size);
	if ((uint32_t)ps != ckpt_piece_size(size))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "piece manifest has pieces of %lld bytes, files of %llu bytes have %u", ps,
		                  (unsigned long long)size, ckpt_piece_size(size));
	/* The count before anything is allocated for it. */
	uint64_t want = (size + (uint64_t)ps - 1) / (uint64_t)ps;
	const json_t *pieces = json_object_get(j, "pieces");
	if (!json_is_array(pieces) || json_array_size(pieces) != want)
		return cot_seterr(eb, COT_ERR_INVALID, "piece manifest must list %llu pieces",
		                  (unsigned long long)want);
	cot_err rc = alloc_pieces(m, sha256, size, eb);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < m->n; i++) {
		const char *h = json_string_value(json_array_get(pieces, i));
		if (!h || !hash_is_sha256_hex(h)) {
			ckpt_manifest_free(m);
			return cot_seterr(eb, COT_ERR_INVALID, "piece %u of the manifest is not a sha256", i);
		}
		for (int k = 0; k < HASH_SHA256_LEN; k++)
			m->hash[i][k] = (unsigned char)(unhex(h[2 * k]) << 4 | unhex(h[2 * k + 1]));
	}
	return COT_OK;
}

bool ckpt_piece_ok(const ckpt_manifest *m, uint32_t i, const void *data, size_t len)
{
	unsigned char dig[HASH_SHA256_LEN];
	return i < m->n && len == ckpt_piece_len(m, i) && !hash_sha256(data, len, dig) &&
	       memcmp(dig, m->hash[i], sizeof dig) == 0;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
	free(m->hash);
	m->hash = NULL;
	m->n = 0;
}
