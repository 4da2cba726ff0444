/* Tests for kernels/safetensors: a round trip through a file, a file laid
 * out as the Python library writes it, and hostile files, every one of
 * which must come back as a clean error with a useful detail. */
#include "kernels/safetensors.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/tap.h"

static char dir[256];
static char path[300];

static void write_file(const char *p, const void *buf, size_t len)
{
	FILE *fp = fopen(p, "wb");
	if (!fp || (len && fwrite(buf, 1, len, fp) != len) || fclose(fp))
		bail_out("cannot write %s", p);
}

static unsigned char *read_file(const char *p, size_t *len)
{
	FILE *fp = fopen(p, "rb");
	if (!fp)
		bail_out("cannot read %s", p);
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	rewind(fp);
	unsigned char *b = malloc((size_t)n + 1);
	if (!b || fread(b, 1, (size_t)n, fp) != (size_t)n)
		bail_out("cannot read %s", p);
	fclose(fp);
	*len = (size_t)n;
	return b;
}

/* A file image: the 8-byte length (hdr_len, or strlen(hdr) when
 * hdr_len is UINT64_MAX... use mk_len for a lying length), hdr, then
 * data_len bytes of 0x11. */
static unsigned char *mk_len(uint64_t n, const char *hdr, size_t data_len, size_t *len)
{
	size_t hl = strlen(hdr);
	*len = 8 + hl + data_len;
	unsigned char *b = malloc(*len);
	if (!b)
		bail_out("out of memory");
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(n >> (8 * i));
	memcpy(b + 8, hdr, hl);
	memset(b + 8 + hl, 0x11, data_len);
	return b;
}

static unsigned char *mk(const char *hdr, size_t data_len, size_t *len)
{
	return mk_len(strlen(hdr), hdr, data_len, len);
}

/* The image must be rejected with code want and a detail containing
 * substr, both from memory and from a file. */
static void expect_bad(const unsigned char *buf, size_t len, cot_err want, const char *substr,
                       const char *what)
{
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	st_file *f = (st_file *)1;
	memset(&eb, 0, sizeof eb);
	cot_err rc = st_parse(buf, len, &f, &eb);
	ok(rc == want && f == NULL && strstr(eb.msg, substr) != NULL, "%s: rejected in memory as %s", what,
	   cot_strerror(want));
	if (rc != want || !strstr(eb.msg, substr))
		diag("got %s: %s", cot_strerror(rc), eb.msg);
	if (rc == COT_OK)
		st_close(f);

	write_file(path, buf, len);
	memset(&eb, 0, sizeof eb);
	f = (st_file *)1;
	rc = st_open(path, &f, &eb);
	ok(rc == want && f == NULL && strstr(eb.msg, substr) != NULL && strstr(eb.msg, path) != NULL,
	   "%s: rejected from a file, detail names the file", what);
	if (rc != want || !strstr(eb.msg, substr))
		diag("got %s: %s", cot_strerror(rc), eb.msg);
	if (rc == COT_OK)
		st_close(f);
}

static void bad(const char *hdr, size_t data_len, cot_err want, const char *substr, const char *what)
{
	size_t len;
	unsigned char *b = mk(hdr, data_len, &len);
	expect_bad(b, len, want, substr, what);
	free(b);
}

static void test_round_trip(void)
{
	float w[6] = { 1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f };
	int64_t ids[4] = { 7, -1, INT64_MAX, INT64_MIN };
	uint16_t half = 0x3c00;
	int64_t s_w[2] = { 2, 3 }, s_ids[1] = { 4 }, s_empty[2] = { 0, 5 };
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	st_writer *wr;

	snprintf(path, sizeof path, "%s/round.safetensors", dir);
	if (st_writer_new(&wr, &eb))
		bail_out("st_writer_new: %s", eb.msg);
	is_int(st_writer_meta(wr, "format", "pt", &eb), COT_OK, "metadata set");
	is_int(st_writer_meta(wr, "note", "first", &eb), COT_OK, "metadata set");
	is_int(st_writer_meta(wr, "note", "ünïcödé ✓", &eb), COT_OK, "metadata replaced");
	is_int(st_writer_add(wr, "w", ST_F32, 2, s_w, w, &eb), COT_OK, "add F32");
	is_int(st_writer_add(wr, "ids", ST_I64, 1, s_ids, ids, &eb), COT_OK, "add I64");
	is_int(st_writer_add(wr, "empty", ST_F32, 2, s_empty, NULL, &eb), COT_OK, "add an empty tensor");
	is_int(st_writer_add(wr, "scalar", ST_F16, 0, NULL, &half, &eb), COT_OK, "add a scalar");
	is_int(st_writer_add(wr, "w", ST_F32, 2, s_w, w, &eb), COT_ERR_INVALID, "duplicate name refused");
	ok(strstr(eb.msg, "duplicate") != NULL, "detail says duplicate: %s", eb.msg);
	int64_t neg[1] = { -3 };
	is_int(st_writer_add(wr, "n", ST_F32, 1, neg, w, &eb), COT_ERR_INVALID, "negative dimension refused");
	int64_t huge[3] = { INT64_MAX, INT64_MAX, 2 };
	is_int(st_writer_add(wr, "h", ST_F32, 3, huge, w, &eb), COT_ERR_TOO_LARGE,
	       "overflowing shape refused");
	is_int(st_writer_add(wr, "__metadata__", ST_F32, 1, s_ids, w, &eb), COT_ERR_INVALID,
	       "reserved name refused");
	eb.msg[0] = '\0';
	is_int(st_writer_write(wr, path, &eb), COT_OK, "written: %s", eb.msg);

	/* Write again over it (atomic replace), and into a missing folder. */
	is_int(st_writer_write(wr, path, &eb), COT_OK, "rewritten in place");
	char bad_path[400];
	snprintf(bad_path, sizeof bad_path, "%s/missing/x.safetensors", dir);
	is_int(st_writer_write(wr, bad_path, &eb), COT_ERR_IO, "missing folder is an I/O error");
	ok(strstr(eb.msg, "missing/x.safetensors") != NULL, "detail names it: %s", eb.msg);
	st_writer_free(wr);

	size_t len;
	unsigned char *img = read_file(path, &len);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | img[i];
	ok(n % 8 == 0 && 8 + n + 24 + 32 + 2 == len,
	   "header padded to 8 bytes, data follows (n=%llu, len=%zu)", (unsigned long long)n, len);
	ok(memcmp(img + 8, "{\"__metadata__\":", 16) == 0, "__metadata__ comes first");

	st_file *f;
	eb.msg[0] = '\0';
	is_int(st_open(path, &f, &eb), COT_OK, "opened: %s", eb.msg);
	if (!f)
		bail_out("cannot continue");
	is_int((long long)st_count(f), 4, "four tensors");
	const st_tensor *t = st_tensor_at(f, 0);
	is_str(t->name, "w", "first in data order is w");
	ok(t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6 &&
	           t->nbytes == 24,
	   "w has dtype, shape and sizes");
	ok(memcmp(t->data, w, sizeof w) == 0, "w data identical");
	t = st_find(f, "ids");
	ok(t && t->dtype == ST_I64 && t->numel == 4 && memcmp(t->data, ids, sizeof ids) == 0,
	   "ids found, data identical");
	t = st_find(f, "empty");
	ok(t && t->numel == 0 && t->nbytes == 0 && t->shape[0] == 0 && t->shape[1] == 5,
	   "empty tensor keeps its shape");
	t = st_find(f, "scalar");
	ok(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 2 && memcmp(t->data, &half, 2) == 0,
	   "scalar round-trips");
	ok(st_find(f, "nope") == NULL, "unknown name is NULL");
	ok(st_tensor_at(f, 4) == NULL, "index past the end is NULL");
	is_str(st_meta(f, "format"), "pt", "metadata format");
	is_str(st_meta(f, "note"), "ünïcödé ✓", "metadata replaced value");
	ok(st_meta(f, "absent") == NULL, "absent metadata is NULL");
	st_close(f);

	/* Every proper prefix of a valid file is invalid: truncation is
	 * always detected, never read past. */
	int all = 1;
	for (size_t k = 0; k < len; k++) {
		st_file *g = NULL;
		cot_err rc = st_parse(img, k, &g, &eb);
		if (rc == COT_OK || g) {
			all = 0;
			diag("prefix of %zu bytes accepted", k);
			st_close(g);
		}
	}
	ok(all, "all %zu proper prefixes rejected in memory", len);
	all = 1;
	for (size_t k = 0; k < len; k++) {
		st_file *g = NULL;
		write_file(path, img, k);
		cot_err rc = st_open(path, &g, &eb);
		if (rc != COT_ERR_CORRUPT || g) {
			all = 0;
			diag("file of %zu bytes: %s %s", k, cot_strerror(rc), eb.msg);
			st_close(g);
		}
	}
	ok(all, "all %zu truncated files rejected as corrupt", len);
	free(img);
}

/* A file as Python's safetensors (numpy or torch) writes it:
 *   save({"weight": [[1.5, -2], [3.25, 4]] (float32), "ids": [7, -1]
 *   (int64), "flag": [1] (uint8)}, metadata={"format": "pt"})
 * Data are ordered by alignment, then name; the JSON may list tensors in
 * any order; the header is padded with spaces to a multiple of 8. */
static void test_python_layout(void)
{
	static const char hdr[] = "{\"__metadata__\":{\"format\":\"pt\"},"
	                          "\"weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
	                          "\"data_offsets\":[16,32]},"
	                          "\"flag\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[32,33]},"
	                          "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}";
	static const unsigned char data[33] = {
		/* ids: 7, -1 (int64 little-endian) */
		0x07,
		0,
		0,
		0,
		0,
		0,
		0,
		0,
		0xff,
		0xff,
		0xff,
		0xff,
		0xff,
		0xff,
		0xff,
		0xff,
		/* weight: 1.5, -2.0, 3.25, 4.0 (float32 little-endian) */
		0x00,
		0x00,
		0xc0,
		0x3f,
		0x00,
		0x00,
		0x00,
		0xc0,
		0x00,
		0x00,
		0x50,
		0x40,
		0x00,
		0x00,
		0x80,
		0x40,
		/* flag */
		0x01,
	};
	size_t hl = sizeof hdr - 1, padded = (hl + 7) / 8 * 8;
	size_t len = 8 + padded + sizeof data;
	unsigned char *img = calloc(1, len);
	if (!img)
		bail_out("out of memory");
	for (int i = 0; i < 8; i++)
		img[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	memcpy(img + 8, hdr, hl);
	memset(img + 8 + hl, ' ', padded - hl);
	memcpy(img + 8 + padded, data, sizeof data);

	snprintf(path, sizeof path, "%s/python.safetensors", dir);
	write_file(path, img, len);
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	st_file *f;
	eb.msg[0] = '\0';
	is_int(st_open(path, &f, &eb), COT_OK, "Python layout opens: %s", eb.msg);
	if (!f)
		bail_out("cannot continue");
	is_str(st_tensor_at(f, 0)->name, "ids", "data order, not JSON order");
	const st_tensor *t = st_find(f, "weight");
	float w[4];
	ok(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 2,
	   "weight is F32 [2, 2]");
	if (t) {
		memcpy(w, t->data, sizeof w);
		ok(w[0] == 1.5f && w[1] == -2.0f && w[2] == 3.25f && w[3] == 4.0f, "weight values read back");
	} else {
		ok(0, "weight values read back");
	}
	t = st_find(f, "ids");
	int64_t ids[2] = { 0, 0 };
	if (t)
		memcpy(ids, t->data, sizeof ids);
	ok(t && t->dtype == ST_I64 && ids[0] == 7 && ids[1] == -1, "ids values");
	t = st_find(f, "flag");
	ok(t && t->dtype == ST_U8 && *(const unsigned char *)t->data == 1, "flag value");
	is_str(st_meta(f, "format"), "pt", "metadata format is pt");
	st_close(f);
	free(img);

	/* No __metadata__ at all, and no tensors at all, are both fine. */
	size_t l2;
	unsigned char *b = mk("{\"a\":{\"dtype\":\"BF16\",\"shape\":[],"
	                      "\"data_offsets\":[0,2]}}",
	                      2, &l2);
	eb.msg[0] = '\0';
	is_int(st_parse(b, l2, &f, &eb), COT_OK, "file without metadata: %s", eb.msg);
	ok(f && st_meta(f, "format") == NULL && st_count(f) == 1, "one tensor, no metadata");
	st_close(f);
	free(b);
	b = mk("{}", 0, &l2);
	eb.msg[0] = '\0';
	is_int(st_parse(b, l2, &f, &eb), COT_OK, "empty header object: %s", eb.msg);
	ok(f && st_count(f) == 0 && st_find(f, "a") == NULL, "no tensors");
	st_close(f);
	free(b);
}

static void test_hostile(void)
{
	size_t len;
	unsigned char *b;
	snprintf(path, sizeof path, "%s/bad.safetensors", dir);

	expect_bad((const unsigned char *)"", 0, COT_ERR_CORRUPT, "too short", "zero-length file");
	expect_bad((const unsigned char *)"\x02\0\0\0", 4, COT_ERR_CORRUPT, "too short", "four-byte file");

	b = mk_len(1000, "{}", 0, &len);
	expect_bad(b, len, COT_ERR_CORRUPT, "truncated", "header length larger than the file");
	free(b);
	b = mk_len(1ull << 63, "{}", 0, &len);
	expect_bad(b, len, COT_ERR_TOO_LARGE, "exceeds the limit", "header length 2^63");
	free(b);
	b = mk_len(UINT64_MAX, "{}", 0, &len);
	expect_bad(b, len, COT_ERR_TOO_LARGE, "exceeds the limit", "header length 2^64-1");
	free(b);
	b = mk_len(ST_HEADER_MAX + 1ull, "{}", 0, &len);
	expect_bad(b, len, COT_ERR_TOO_LARGE, "exceeds the limit", "header length one over the bound");
	free(b);
	b = mk_len(0, "", 0, &len);
	expect_bad(b, len, COT_ERR_CORRUPT, "JSON object", "empty header");
	free(b);

	bad("{not json}", 0, COT_ERR_CORRUPT, "not valid JSON", "header not JSON");
	bad("{\"a\": 1} trailing", 0, COT_ERR_CORRUPT, "not valid JSON", "garbage after the JSON");
	bad("[1, 2, 3]", 0, COT_ERR_CORRUPT, "JSON object", "header an array, not an object");
	bad("\"text\"", 0, COT_ERR_CORRUPT, "JSON object", "header a string");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}\xff}", 4, COT_ERR_CORRUPT,
	    "not valid JSON", "header not UTF-8");
	bad("{\"a\":\"x\"}", 0, COT_ERR_CORRUPT, "not a JSON object", "tensor entry not an object");
	bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT,
	    "unknown dtype", "wrong dtype");
	bad("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT, "unknown dtype",
	    "dtype not a string");
	bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT, "unknown dtype",
	    "dtype missing");
	bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT, "no shape",
	    "shape missing");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
	    "\"data_offsets\":[0,4]}}",
	    4, COT_ERR_CORRUPT, "overflows", "shape product overflow");
	bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
	    "\"data_offsets\":[0,4]}}",
	    4, COT_ERR_CORRUPT, "overflows", "byte size overflow");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT,
	    "non-negative", "negative dimension");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT,
	    "non-negative", "fractional dimension");
	bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
	    "\"data_offsets\":[0,1]}}",
	    1, COT_ERR_CORRUPT, "dimensions", "too many dimensions");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[0,1000]}}", 8, COT_ERR_CORRUPT,
	    "data_offsets", "offsets outside the data");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
	    "\"data_offsets\":[0,99999999999999999999]}}",
	    4, COT_ERR_CORRUPT, "not valid JSON", "offset beyond 64 bits");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, COT_ERR_CORRUPT,
	    "data_offsets", "offsets backwards");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, COT_ERR_CORRUPT,
	    "data_offsets", "three offsets");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, COT_ERR_CORRUPT,
	    "data_offsets", "negative offset");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
	    12, COT_ERR_CORRUPT, "must not overlap", "overlapping offsets");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
	    8, COT_ERR_CORRUPT, "must not overlap", "two tensors on the same bytes");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
	    12, COT_ERR_CORRUPT, "contiguous", "hole between tensors");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, COT_ERR_CORRUPT,
	    "contiguous", "hole at the start");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, COT_ERR_CORRUPT,
	    "cover 4 bytes of a 12-byte", "extra bytes after the last tensor");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, COT_ERR_CORRUPT, "need 12",
	    "numel does not match the span");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
	    8, COT_ERR_CORRUPT, "duplicate", "duplicate names");
	bad("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, COT_ERR_CORRUPT, "name",
	    "empty name");
	bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
	    "\"extra\":1}}",
	    4, COT_ERR_CORRUPT, "unknown field", "unknown field");
	bad("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],"
	    "\"data_offsets\":[0,4]}}",
	    4, COT_ERR_CORRUPT, "not valid JSON", "NUL inside a name");
	bad("{\"__metadata__\":[1]}", 0, COT_ERR_CORRUPT, "__metadata__", "metadata not an object");
	bad("{\"__metadata__\":{\"k\":3}}", 0, COT_ERR_CORRUPT, "not a string",
	    "metadata value not a string");

	char name[400], hdr[600];
	memset(name, 'n', 300);
	name[300] = '\0';
	snprintf(hdr, sizeof hdr,
	         "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],"
	         "\"data_offsets\":[0,1]}}",
	         name);
	bad(hdr, 1, COT_ERR_CORRUPT, "name", "name over 255 bytes");

	/* Not a file at all. */
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	st_file *f;
	is_int(st_open(dir, &f, &eb), COT_ERR_INVALID, "a folder is refused");
	ok(f == NULL && strstr(eb.msg, "not a regular file"), "detail: %s", eb.msg);
	snprintf(name, sizeof name, "%s/absent.safetensors", dir);
	is_int(st_open(name, &f, &eb), COT_ERR_NOT_FOUND, "a missing file");
	ok(strstr(eb.msg, "absent.safetensors") != NULL, "detail names it: %s", eb.msg);
}

/* More tensors than the bound: refused before any per-tensor work. */
static void test_too_many(void)
{
	size_t cap = (size_t)(ST_MAX_TENSORS + 1) * 64 + 16, at = 0;
	char *hdr = malloc(cap);
	if (!hdr)
		bail_out("out of memory");
	hdr[at++] = '{';
	for (int i = 0; i <= ST_MAX_TENSORS; i++)
		at += (size_t)snprintf(hdr + at, cap - at,
		                       "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],"
		                       "\"data_offsets\":[0,0]}",
		                       i ? "," : "", i);
	hdr[at++] = '}';
	hdr[at] = '\0';
	size_t len;
	unsigned char *b = mk(hdr, 0, &len);
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	st_file *f;
	cot_err rc = st_parse(b, len, &f, &eb);
	ok(rc == COT_ERR_TOO_LARGE && strstr(eb.msg, "tensors"), "%d tensors refused: %s", ST_MAX_TENSORS + 1,
	   eb.msg);
	free(b);
	free(hdr);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/test_safetensors.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		bail_out("cannot create a temporary folder under %s", dir);

	plan_lazy();
	test_round_trip();
	test_python_layout();
	test_hostile();
	test_too_many();

	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		diag("could not remove %s", dir);
	done_testing();
	return exit_status();
}
