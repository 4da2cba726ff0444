/* cotrain: a byte dataset's text, read back from its shards (see
 * dataset_text.h). */
#include "server/dataset_text.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/shard.h"

/* Length of the sequence that lead byte c starts and the allowed range of
 * its second byte (RFC 3629, section 4); 0 when c cannot start one. */
static int seq_len(unsigned char c, unsigned char *lo, unsigned char *hi)
{
	*lo = 0x80;
	*hi = 0xBF;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		return 2;
	if (c == 0xE0) {
		*lo = 0xA0;
		return 3;
	}
	if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
		return 3;
	if (c == 0xED) {
		*hi = 0x9F;
		return 3;
	}
	if (c == 0xF0) {
		*lo = 0x90;
		return 4;
	}
	if (c >= 0xF1 && c <= 0xF3)
		return 4;
	if (c == 0xF4) {
		*hi = 0x8F;
		return 4;
	}
	return 0;
}

size_t dt_utf8_prefix(const unsigned char *p, size_t n, int *cut)
{
	*cut = 0;
	size_t i = 0;
	while (i < n) {
		unsigned char lo, hi;
		int k = seq_len(p[i], &lo, &hi);
		if (k == 0)
			return i;
		for (int j = 1; j < k; j++) {
			if (i + (size_t)j == n) {
				*cut = 1;
				return i;
			}
			unsigned char c = p[i + (size_t)j];
			if (c < (j == 1 ? lo : 0x80) || c > (j == 1 ? hi : 0xBF))
				return i;
		}
		i += (size_t)k;
	}
	return n;
}

cot_err dt_read_text(const char *store_dir, const char *name, const dt_shard *s, size_t n, uint64_t limit,
                     char **text, size_t *len, cot_errbuf *eb)
{
	*text = NULL;
	*len = 0;
	if (limit > DT_TEXT_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "cannot read more than %llu bytes of dataset \"%s\"",
		                  (unsigned long long)DT_TEXT_MAX, name);
	if (limit == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "dataset \"%s\" has no training text", name);
	char *buf = malloc((size_t)limit + 1);
	if (!buf)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for %llu bytes of text",
		                  (unsigned long long)limit);
	uint64_t got = 0;
	cot_err rc = COT_OK;
	for (size_t i = 0; i < n && got < limit && !rc; i++) {
		char path[PATH_MAX];
		shard_meta meta;
		unsigned char *tok = NULL;
		if (s[i].first_token != got) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "dataset \"%s\": shard %zu starts at token %llu, not %llu", name, i,
			                (unsigned long long)s[i].first_token, (unsigned long long)got);
			break;
		}
		if ((rc = fs_path(store_dir, s[i].sha256, path, sizeof path, eb)) ||
		    (rc = shard_read(path, SHARD_TOKENS_MAX, &meta, &tok, eb)))
			break;
		if (meta.first_token != s[i].first_token || meta.n_tokens != s[i].n_tokens) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "shard \"%s\" of dataset \"%s\" holds tokens %llu..%llu, not those "
			                "the "
			                "database lists",
			                path, name, (unsigned long long)meta.first_token,
			                (unsigned long long)(meta.first_token + meta.n_tokens));
			free(tok);
			break;
		}
		uint64_t take = meta.n_tokens < limit - got ? meta.n_tokens : limit - got;
		memcpy(buf + got, tok, (size_t)take);
		free(tok);
		got += take;
	}
	if (!rc && got < limit)
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "dataset \"%s\" lists shards for %llu of its %llu tokens", name,
		                (unsigned long long)got, (unsigned long long)limit);
	if (!rc) {
		int cut;
		size_t ok = dt_utf8_prefix((const unsigned char *)buf, (size_t)got, &cut);
		if (ok < got && !(cut && got == limit)) {
			size_t at = 0;
			while (at + 1 < n && s[at + 1].first_token <= ok)
				at++;
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "dataset \"%s\" is not valid UTF-8 text: bad byte 0x%02x at stream "
			                "offset %zu "
			                "(shard %zu)",
			                name, (unsigned char)buf[ok], ok, at);
			cot_sethint(eb,
			            "A tokenizer is trained on a dataset imported as text; import the text "
			            "again (cotrain-admin dataset import checks it).");
		}
		got = ok;
	}
	if (rc) {
		free(buf);
		return rc;
	}
	buf[got] = '\0';
	*text = buf;
	*len = (size_t)got;
	return COT_OK;
}
