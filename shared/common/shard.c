/* cotrain: dataset shards (see shard.h). */
#include "shared/common/shard.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>

#include "shared/common/hash.h"

#define SHARD_FORMAT "cotrain-shard"
#define SHARD_VERSION 1

static cot_err sha256_hex(const void *data, size_t len, char out[FS_SHA_HEX_LEN + 1], cot_errbuf *eb)
{
	if (hash_sha256_hex(data, len, out))
		return cot_seterr(eb, COT_ERR_INTERNAL, "sha256 digest failed");
	return COT_OK;
}

/* ---- writing ---------------------------------------------------------- */

/* libarchive's output goes straight into the store writer. */
typedef struct {
	fs_writer *w;
	cot_errbuf *eb;
	cot_err rc;
} sink;

static la_ssize_t sink_write(struct archive *a, void *data, const void *buf, size_t len)
{
	sink *s = data;
	if (s->rc == COT_OK)
		s->rc = fs_writer_write(s->w, buf, len, s->eb);
	if (s->rc) {
		archive_set_error(a, EIO, "%s", s->eb ? s->eb->msg : "write failed");
		return -1;
	}
	return (la_ssize_t)len;
}

static int add_entry(struct archive *a, const char *name, const void *data, size_t len)
{
	struct archive_entry *e = archive_entry_new();
	if (!e)
		return ARCHIVE_FATAL;
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, AE_IFREG);
	archive_entry_set_perm(e, 0644);
	archive_entry_set_size(e, (la_int64_t)len);
	archive_entry_set_mtime(e, 0, 0);
	archive_entry_set_uid(e, 0);
	archive_entry_set_gid(e, 0);
	int r = archive_write_header(a, e);
	archive_entry_free(e);
	if (r != ARCHIVE_OK)
		return r;
	const unsigned char *p = data;
	while (len) {
		size_t n = len > (1u << 20) ? (1u << 20) : len;
		la_ssize_t w = archive_write_data(a, p, n);
		if (w <= 0)
			return ARCHIVE_FATAL;
		p += w;
		len -= (size_t)w;
	}
	return ARCHIVE_OK;
}

int shard_name_valid(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n < 1 || n > SHARD_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
			return 0;
	}
	return 1;
}

cot_err shard_write(const char *store_dir, shard_meta *meta, const unsigned char *tokens, size_t n,
                    char sha_hex[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb)
{
	if (n == 0 || n > SHARD_TOKENS_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "shard of %zu tokens: must hold 1 to %u tokens", n,
		                  SHARD_TOKENS_MAX);
	if (!shard_name_valid(meta->dataset))
		return cot_seterr(eb, COT_ERR_INVALID, "invalid dataset name \"%.80s\"", meta->dataset);
	if (meta->width == 0)
		meta->width = 1;
	if (meta->width != 1 && meta->width != 2 && meta->width != 4)
		return cot_seterr(eb, COT_ERR_INVALID, "shard tokens of %d bytes: use 1, 2 or 4",
		                  meta->width);
	if ((meta->width == 1) != (meta->tokenizer_sha256[0] == '\0') ||
	    (meta->width > 1 && !fs_sha_valid(meta->tokenizer_sha256)))
		return cot_seterr(eb, COT_ERR_INVALID, "a shard of %d-byte tokens %s a tokenizer model",
		                  meta->width, meta->width == 1 ? "cannot name" : "must name");
	size_t bytes = n * (size_t)meta->width;
	meta->n_tokens = n;
	cot_err rc = sha256_hex(tokens, bytes, meta->tokens_sha256, eb);
	if (rc)
		return rc;

	const char *dtype = meta->width == 1 ? "u8" : meta->width == 2 ? "u16" : "u32";
	json_t *j =
	        json_pack("{s:s, s:i, s:s, s:i, s:I, s:I, s:s, s:s, s:s}", "format", SHARD_FORMAT, "version",
	                  SHARD_VERSION, "dataset", meta->dataset, "idx", (int)meta->idx, "first_token",
	                  (json_int_t)meta->first_token, "n_tokens", (json_int_t)meta->n_tokens, "dtype",
	                  dtype, "tokenizer", meta->width == 1 ? "byte" : "sentencepiece", "tokens_sha256",
	                  meta->tokens_sha256);
	if (j && meta->width > 1 &&
	    json_object_set_new(j, "tokenizer_sha256", json_string(meta->tokenizer_sha256)) != 0) {
		json_decref(j);
		j = NULL;
	}
	char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
	json_decref(j);
	if (!text)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	size_t tlen = strlen(text);
	char *json_text = realloc(text, tlen + 2); /* end with a newline */
	if (!json_text) {
		free(text);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	json_text[tlen++] = '\n';
	json_text[tlen] = '\0';

	sink s = { NULL, eb, COT_OK };
	rc = fs_writer_open(store_dir, &s.w, eb);
	if (rc) {
		free(json_text);
		return rc;
	}
	struct archive *a = archive_write_new();
	if (!a) {
		free(json_text);
		fs_writer_abort(s.w);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	int r = archive_write_set_format_ustar(a);
	if (r == ARCHIVE_OK)
		r = archive_write_add_filter_gzip(a);
	if (r == ARCHIVE_OK)
		r = archive_write_set_filter_option(a, "gzip", "timestamp", NULL);
	if (r == ARCHIVE_OK)
		r = archive_write_set_bytes_in_last_block(a, 1);
	if (r == ARCHIVE_OK)
		r = archive_write_open2(a, &s, NULL, sink_write, NULL, NULL);
	if (r == ARCHIVE_OK)
		r = add_entry(a, "shard.json", json_text, tlen);
	char entry[16];
	snprintf(entry, sizeof entry, "tokens.%s", dtype);
	if (r == ARCHIVE_OK)
		r = add_entry(a, entry, tokens, bytes);
	if (r == ARCHIVE_OK)
		r = archive_write_close(a);
	if (r != ARCHIVE_OK && !s.rc)
		s.rc = cot_seterr(eb, COT_ERR_IO, "could not write shard %d of dataset \"%s\": %s",
		                  (int)meta->idx, meta->dataset,
		                  archive_error_string(a) ? archive_error_string(a) : "unknown error");
	archive_write_free(a);
	free(json_text);
	if (s.rc) {
		fs_writer_abort(s.w);
		return s.rc;
	}
	return fs_writer_commit(s.w, sha_hex, size, eb);
}

/* ---- reading ---------------------------------------------------------- */

static cot_err read_all(struct archive *a, const char *path, const char *what, unsigned char *buf,
                        size_t want, cot_errbuf *eb)
{
	size_t got = 0;
	for (;;) {
		/* Ask for one byte more than expected, to notice a longer entry. */
		la_ssize_t n = archive_read_data(a, buf + got, want - got);
		if (n < 0)
			return cot_seterr(eb, COT_ERR_CORRUPT, "could not read %s of shard \"%s\": %s", what,
			                  path,
			                  archive_error_string(a) ? archive_error_string(a) : "read error");
		if (n == 0)
			break;
		got += (size_t)n;
		if (got == want) {
			unsigned char extra;
			n = archive_read_data(a, &extra, 1);
			if (n != 0)
				return cot_seterr(eb, COT_ERR_CORRUPT,
				                  "shard \"%s\" is corrupt: %s is longer than declared", path,
				                  what);
			break;
		}
	}
	if (got != want)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "shard \"%s\" is corrupt: %s is %zu bytes, expected %zu", path, what, got,
		                  want);
	return COT_OK;
}

/* The token width that dtype and tokenizer name (into m->width, with
 * m->tokenizer_sha256); false for any other pair. */
static bool dtype_ok(json_t *j, const char *dtype, const char *tok, shard_meta *m)
{
	if (strcmp(dtype, "u8") == 0 && strcmp(tok, "byte") == 0 && !json_object_get(j, "tokenizer_sha256")) {
		m->width = 1;
		return true;
	}
	const char *sha = json_string_value(json_object_get(j, "tokenizer_sha256"));
	if (strcmp(tok, "sentencepiece") != 0 || !sha || !fs_sha_valid(sha))
		return false;
	if (strcmp(dtype, "u16") == 0)
		m->width = 2;
	else if (strcmp(dtype, "u32") == 0)
		m->width = 4;
	else
		return false;
	memcpy(m->tokenizer_sha256, sha, FS_SHA_HEX_LEN + 1);
	return true;
}

static cot_err parse_meta(const char *path, const char *text, size_t len, shard_meta *m, cot_errbuf *eb)
{
	json_error_t jerr;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!j || !json_is_object(j)) {
		json_decref(j);
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "shard \"%s\" is corrupt: shard.json is not a JSON object", path);
	}
	const char *format = NULL, *dataset = NULL, *dtype = NULL, *tok = NULL, *sha = NULL;
	json_int_t version = 0, idx = -1, first = -1, ntok = -1;
	size_t dataset_len = 0;
	int bad =
	        json_unpack(j, "{s:s, s:I, s:s%, s:I, s:I, s:I, s:s, s:s, s:s}", "format", &format, "version",
	                    &version, "dataset", &dataset, &dataset_len, "idx", &idx, "first_token", &first,
	                    "n_tokens", &ntok, "dtype", &dtype, "tokenizer", &tok, "tokens_sha256", &sha);
	cot_err rc = COT_OK;
	if (bad || strcmp(format, SHARD_FORMAT) != 0 || version != SHARD_VERSION)
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "shard \"%s\" is corrupt: shard.json lacks a field or is not format %s "
		                "version %d",
		                path, SHARD_FORMAT, SHARD_VERSION);
	else if (!dtype_ok(j, dtype, tok, m))
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "shard \"%s\" has dtype \"%.20s\" and tokenizer \"%.20s\": only u8 with "
		                "byte, "
		                "and u16 or u32 with sentencepiece and its tokenizer_sha256, are supported",
		                path, dtype, tok);
	else if (idx < 0 || idx > INT32_MAX || first < 0 || ntok < 1 || !fs_sha_valid(sha) ||
	         strlen(dataset) != dataset_len || !shard_name_valid(dataset))
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "shard \"%s\" is corrupt: shard.json holds a value out of range", path);
	if (!rc) {
		snprintf(m->dataset, sizeof m->dataset, "%s", dataset);
		m->idx = (int32_t)idx;
		m->first_token = (uint64_t)first;
		m->n_tokens = (uint64_t)ntok;
		memcpy(m->tokens_sha256, sha, FS_SHA_HEX_LEN + 1);
	}
	json_decref(j);
	return rc;
}

cot_err shard_read(const char *path, uint64_t max_tokens, shard_meta *meta, unsigned char **tokens,
                   cot_errbuf *eb)
{
	*tokens = NULL;
	memset(meta, 0, sizeof *meta);
	if (max_tokens > SHARD_TOKENS_MAX)
		max_tokens = SHARD_TOKENS_MAX;
	struct archive *a = archive_read_new();
	if (!a)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	archive_read_support_filter_gzip(a);
	archive_read_support_format_tar(a);
	cot_err rc = COT_OK;
	unsigned char *tok = NULL;
	char *json_text = NULL;
	if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not open shard \"%s\": %s", path,
		                archive_error_string(a) ? archive_error_string(a) : "unknown error");
		goto out;
	}
	const char *names[2] = { "shard.json", "tokens.u8" };
	for (int i = 0; i < 3 && !rc; i++) {
		struct archive_entry *e;
		int r = archive_read_next_header(a, &e);
		if (i == 2) {
			if (r != ARCHIVE_EOF)
				rc = cot_seterr(eb, COT_ERR_CORRUPT,
				                "shard \"%s\" is corrupt: unexpected entry after %s", path,
				                names[1]);
			break;
		}
		if (r != ARCHIVE_OK) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "shard \"%s\" is corrupt: %s", path,
			                r == ARCHIVE_EOF          ? "entries missing"
			                : archive_error_string(a) ? archive_error_string(a)
			                                          : "bad header");
			break;
		}
		const char *name = archive_entry_pathname(e);
		if (!name || strcmp(name, names[i]) != 0 || archive_entry_filetype(e) != AE_IFREG ||
		    !archive_entry_size_is_set(e)) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "shard \"%s\" is corrupt: entry %d is not %s",
			                path, i + 1, names[i]);
			break;
		}
		la_int64_t sz = archive_entry_size(e);
		if (i == 0) {
			if (sz <= 0 || sz > (la_int64_t)SHARD_JSON_MAX) {
				rc = cot_seterr(eb, COT_ERR_CORRUPT,
				                "shard \"%s\" is corrupt: shard.json of %lld bytes", path,
				                (long long)sz);
				break;
			}
			if (!(json_text = malloc((size_t)sz + 1))) {
				rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
				break;
			}
			rc = read_all(a, path, "shard.json", (unsigned char *)json_text, (size_t)sz, eb);
			if (rc)
				break;
			json_text[sz] = '\0';
			rc = parse_meta(path, json_text, (size_t)sz, meta, eb);
			names[1] = meta->width == 4   ? "tokens.u32"
			           : meta->width == 2 ? "tokens.u16"
			                              : "tokens.u8";
			if (!rc && meta->n_tokens > max_tokens)
				rc = cot_seterr(eb, COT_ERR_TOO_LARGE,
				                "shard \"%s\" holds %llu tokens, more than the %llu allowed",
				                path, (unsigned long long)meta->n_tokens,
				                (unsigned long long)max_tokens);
		} else {
			size_t bytes = (size_t)meta->n_tokens * (size_t)meta->width;
			if ((uint64_t)sz != bytes) {
				rc = cot_seterr(eb, COT_ERR_CORRUPT,
				                "shard \"%s\" is corrupt: %s is %lld bytes, "
				                "shard.json says %llu tokens",
				                path, names[1], (long long)sz,
				                (unsigned long long)meta->n_tokens);
				break;
			}
			if (!(tok = malloc(bytes))) {
				rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
				break;
			}
			rc = read_all(a, path, names[1], tok, bytes, eb);
			if (rc)
				break;
			char sha[FS_SHA_HEX_LEN + 1];
			rc = sha256_hex(tok, bytes, sha, eb);
			if (rc)
				break;
			if (strcmp(sha, meta->tokens_sha256) != 0)
				rc = cot_seterr(eb, COT_ERR_CORRUPT,
				                "shard \"%s\" is corrupt: %s does not match its "
				                "sha256",
				                path, names[1]);
		}
	}
out:
	archive_read_free(a);
	free(json_text);
	if (rc) {
		free(tok);
		return rc;
	}
	*tokens = tok;
	return COT_OK;
}
