/* cotrain kernels: reading and writing the safetensors layout (see
 * safetensors.h for the format and the contract). */
#include "kernels/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

static const struct {
	const char *name;
	size_t size;
} dtypes[ST_NDTYPES] = {
	[ST_BOOL] = { "BOOL", 1 },       [ST_U8] = { "U8", 1 },           [ST_I8] = { "I8", 1 },
	[ST_F8_E5M2] = { "F8_E5M2", 1 }, [ST_F8_E4M3] = { "F8_E4M3", 1 }, [ST_I16] = { "I16", 2 },
	[ST_U16] = { "U16", 2 },         [ST_F16] = { "F16", 2 },         [ST_BF16] = { "BF16", 2 },
	[ST_I32] = { "I32", 4 },         [ST_U32] = { "U32", 4 },         [ST_F32] = { "F32", 4 },
	[ST_I64] = { "I64", 8 },         [ST_U64] = { "U64", 8 },         [ST_F64] = { "F64", 8 },
};

const char *st_dtype_name(st_dtype d) { return (unsigned)d < ST_NDTYPES ? dtypes[d].name : NULL; }

size_t st_dtype_size(st_dtype d) { return (unsigned)d < ST_NDTYPES ? dtypes[d].size : 0; }

static int dtype_from_name(const char *s)
{
	for (int i = 0; i < ST_NDTYPES; i++)
		if (strcmp(s, dtypes[i].name) == 0)
			return i;
	return -1;
}

/* ---- reading ----------------------------------------------------------- */

struct st_file {
	void *map; /* mmap'd file, or NULL for st_parse */
	size_t map_len;
	json_t *header;     /* owns the tensor names */
	json_t *meta;       /* borrowed from header, or NULL */
	st_tensor *tensors; /* in data-offset order */
	const st_tensor **by_name;
	size_t count;
};

typedef struct {
	st_tensor *t;
	size_t begin, end;
} span;

static int span_cmp(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->t->name, y->t->name);
}

static int name_cmp(const void *a, const void *b)
{
	const st_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

/* A JSON integer in [0, max] into *v; false otherwise. */
static int get_index(const json_t *j, size_t max, size_t *v)
{
	if (!json_is_integer(j))
		return 0;
	json_int_t x = json_integer_value(j);
	if (x < 0 || (unsigned long long)x > max)
		return 0;
	*v = (size_t)x;
	return 1;
}

/* Validate one tensor entry "name": {...} and fill *t (data still relative:
 * offsets into *sp).  Returns COT_OK or an error with a detail in eb. */
static cot_err parse_tensor(const char *name, json_t *e, size_t data_len, st_tensor *t, span *sp,
                            cot_errbuf *eb)
{
	size_t nlen = strlen(name);
	if (nlen == 0 || nlen > ST_NAME_MAX)
		return cot_seterr(eb, COT_ERR_CORRUPT, "a tensor name is %zu bytes, outside 1..%d", nlen,
		                  ST_NAME_MAX);
	if (!json_is_object(e))
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" is not a JSON object", name);
	const char *k;
	json_t *v;
	json_object_foreach(e, k, v)
	{
		if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
			return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" has unknown field \"%.64s\"",
			                  name, k);
	}
	memset(t, 0, sizeof *t);
	t->name = name;

	json_t *jd = json_object_get(e, "dtype");
	int d = json_is_string(jd) ? dtype_from_name(json_string_value(jd)) : -1;
	if (d < 0)
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" has a missing or unknown dtype", name);
	t->dtype = (st_dtype)d;

	json_t *js = json_object_get(e, "shape");
	if (!json_is_array(js))
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" has no shape array", name);
	if (json_array_size(js) > ST_MAX_DIMS)
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" has %zu dimensions, more than %d", name,
		                  json_array_size(js), ST_MAX_DIMS);
	t->ndim = (int)json_array_size(js);
	size_t numel = 1;
	for (int i = 0; i < t->ndim; i++) {
		size_t dim;
		if (!get_index(json_array_get(js, (size_t)i), (size_t)INT64_MAX, &dim))
			return cot_seterr(eb, COT_ERR_CORRUPT,
			                  "tensor \"%s\" has a shape entry that is not a "
			                  "non-negative integer",
			                  name);
		t->shape[i] = (int64_t)dim;
		if (__builtin_mul_overflow(numel, dim, &numel))
			return cot_seterr(eb, COT_ERR_CORRUPT,
			                  "tensor \"%s\" has a shape whose element count "
			                  "overflows",
			                  name);
	}
	t->numel = numel;
	if (__builtin_mul_overflow(numel, dtypes[d].size, &t->nbytes))
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" has a byte size that overflows", name);

	json_t *jo = json_object_get(e, "data_offsets");
	if (!json_is_array(jo) || json_array_size(jo) != 2 ||
	    !get_index(json_array_get(jo, 0), data_len, &sp->begin) ||
	    !get_index(json_array_get(jo, 1), data_len, &sp->end) || sp->end < sp->begin)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "tensor \"%s\" has data_offsets that are not "
		                  "[begin, end] with begin <= end <= %zu, the size of "
		                  "the data region",
		                  name, data_len);
	if (sp->end - sp->begin != t->nbytes)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "tensor \"%s\" spans %zu bytes but its dtype and "
		                  "shape need %zu",
		                  name, sp->end - sp->begin, t->nbytes);
	sp->t = t;
	return COT_OK;
}

static cot_err check_meta(json_t *m, cot_errbuf *eb)
{
	if (!json_is_object(m))
		return cot_seterr(eb, COT_ERR_CORRUPT, "__metadata__ is not a JSON object");
	const char *k;
	json_t *v;
	json_object_foreach(m, k, v)
	{
		if (!json_is_string(v))
			return cot_seterr(eb, COT_ERR_CORRUPT,
			                  "__metadata__ value of \"%.64s\" is not a "
			                  "string",
			                  k);
	}
	return COT_OK;
}

/* Validate buf[0..len) and fill f (whose map fields the caller set).  Errors
 * carry only the detail; the public functions add what was being read. */
static cot_err parse(st_file *f, const unsigned char *buf, size_t len, cot_errbuf *eb)
{
	if (len < 8)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "it is %zu bytes long, too short for the 8-byte "
		                  "header length",
		                  len);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | buf[i];
	if (n > ST_HEADER_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "its header length %llu exceeds the limit of %u "
		                  "bytes",
		                  (unsigned long long)n, ST_HEADER_MAX);
	if (n > len - 8)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "its header length %llu exceeds the %zu bytes that "
		                  "follow; the file is truncated",
		                  (unsigned long long)n, len - 8);
	if (n < 2 || buf[8] != '{')
		return cot_seterr(eb, COT_ERR_CORRUPT, "its header does not start with a JSON object");

	json_error_t jerr;
	f->header = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
	if (!f->header)
		return cot_seterr(eb, COT_ERR_CORRUPT, "its header is not valid JSON: %s at byte %d",
		                  jerr.text, jerr.position);
	if (!json_is_object(f->header))
		return cot_seterr(eb, COT_ERR_CORRUPT, "its header is not a JSON object");

	const unsigned char *data = buf + 8 + n;
	size_t data_len = len - 8 - (size_t)n;
	size_t count = json_object_size(f->header);
	f->meta = json_object_get(f->header, "__metadata__");
	if (f->meta) {
		cot_err rc = check_meta(f->meta, eb);
		if (rc)
			return rc;
		count--;
	}
	if (count > ST_MAX_TENSORS)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "it holds %zu tensors, more than the limit of %d",
		                  count, ST_MAX_TENSORS);

	span *spans = NULL;
	if (count) {
		f->tensors = calloc(count, sizeof *f->tensors);
		f->by_name = calloc(count, sizeof *f->by_name);
		spans = calloc(count, sizeof *spans);
		if (!f->tensors || !f->by_name || !spans) {
			free(spans);
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for %zu tensors", count);
		}
	}
	cot_err rc = COT_OK;
	size_t i = 0;
	const char *k;
	json_t *v;
	json_object_foreach(f->header, k, v)
	{
		if (strcmp(k, "__metadata__") == 0)
			continue;
		rc = parse_tensor(k, v, data_len, &f->tensors[i], &spans[i], eb);
		if (rc)
			goto out;
		i++;
	}

	/* The tensors must tile the data region exactly, as the reference
	 * implementation requires: no gaps, no overlaps, nothing after. */
	if (count)
		qsort(spans, count, sizeof *spans, span_cmp);
	size_t at = 0;
	for (i = 0; i < count; i++) {
		if (spans[i].begin != at) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "tensor \"%s\" begins at data offset %zu, but "
			                "the previous tensor ends at %zu (tensors must "
			                "be contiguous and must not overlap)",
			                spans[i].t->name, spans[i].begin, at);
			goto out;
		}
		at = spans[i].end;
	}
	if (at != data_len) {
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "its tensors cover %zu bytes of a %zu-byte data "
		                "region",
		                at, data_len);
		goto out;
	}

	/* Hand out tensors in offset order, with data pointers resolved. */
	st_tensor *sorted = count ? calloc(count, sizeof *sorted) : NULL;
	if (count && !sorted) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for %zu tensors", count);
		goto out;
	}
	for (i = 0; i < count; i++) {
		sorted[i] = *spans[i].t;
		sorted[i].data = data + spans[i].begin;
	}
	free(f->tensors);
	f->tensors = sorted;
	f->count = count;
	for (i = 0; i < count; i++)
		f->by_name[i] = &f->tensors[i];
	if (count)
		qsort(f->by_name, count, sizeof *f->by_name, name_cmp);
out:
	free(spans);
	return rc;
}

void st_close(st_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->map_len);
	json_decref(f->header);
	free(f->tensors);
	free(f->by_name);
	free(f);
}

cot_err st_parse(const void *buf, size_t len, st_file **out, cot_errbuf *eb)
{
	*out = NULL;
	st_file *f = calloc(1, sizeof *f);
	if (!f)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_errbuf d;
	memset(&d, 0, sizeof d);
	cot_err rc = parse(f, buf, len, &d);
	if (rc) {
		st_close(f);
		return cot_seterr(eb, rc, "invalid safetensors buffer: %s", d.msg);
	}
	*out = f;
	return COT_OK;
}

cot_err st_open(const char *path, st_file **out, cot_errbuf *eb)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open safetensors file \"%s\": %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not stat safetensors file \"%s\": %s", path,
		                  strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "cannot read safetensors file \"%s\": not a regular "
		                  "file",
		                  path);
	}
	st_file *f = calloc(1, sizeof *f);
	if (!f) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	f->map_len = (size_t)st.st_size;
	if (f->map_len > 0) {
		f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (f->map == MAP_FAILED) {
			int e = errno;
			f->map = NULL;
			close(fd);
			st_close(f);
			return cot_seterr(eb, COT_ERR_IO, "could not map safetensors file \"%s\": %s", path,
			                  strerror(e));
		}
	}
	close(fd);
	cot_errbuf d;
	memset(&d, 0, sizeof d);
	cot_err rc = parse(f, f->map, f->map_len, &d);
	if (rc) {
		st_close(f);
		return cot_seterr(eb, rc, "invalid safetensors file \"%s\": %s", path, d.msg);
	}
	*out = f;
	return COT_OK;
}

size_t st_count(const st_file *f) { return f->count; }

const st_tensor *st_tensor_at(const st_file *f, size_t i) { return i < f->count ? &f->tensors[i] : NULL; }

const st_tensor *st_find(const st_file *f, const char *name)
{
	if (f->count == 0)
		return NULL;
	st_tensor key = { .name = name };
	const st_tensor *kp = &key;
	const st_tensor **hit = bsearch(&kp, f->by_name, f->count, sizeof *f->by_name, name_cmp);
	return hit ? *hit : NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
	return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct {
	const void *data;
	size_t nbytes;
} wchunk;

struct st_writer {
	json_t *tensors; /* name -> entry, in insertion (= data) order */
	json_t *meta;    /* key -> string */
	wchunk *chunks;
	size_t count, cap;
	size_t data_len;
	size_t meta_bytes;
};

cot_err st_writer_new(st_writer **out, cot_errbuf *eb)
{
	st_writer *w = calloc(1, sizeof *w);
	*out = NULL;
	if (!w)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	w->tensors = json_object();
	w->meta = json_object();
	if (!w->tensors || !w->meta) {
		st_writer_free(w);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	*out = w;
	return COT_OK;
}

void st_writer_free(st_writer *w)
{
	if (!w)
		return;
	json_decref(w->tensors);
	json_decref(w->meta);
	free(w->chunks);
	free(w);
}

cot_err st_writer_meta(st_writer *w, const char *key, const char *value, cot_errbuf *eb)
{
	size_t kl = strlen(key), vl = strlen(value);
	if (kl == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "cannot set an empty safetensors metadata key");
	w->meta_bytes += kl + vl;
	if (w->meta_bytes > ST_HEADER_MAX / 4)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "safetensors metadata exceed %u bytes",
		                  ST_HEADER_MAX / 4);
	json_t *s = json_string(value);
	if (!s)
		return cot_seterr(eb, COT_ERR_INVALID, "metadata value of \"%.64s\" is not valid UTF-8", key);
	if (json_object_set_new(w->meta, key, s))
		return cot_seterr(eb, COT_ERR_INVALID, "cannot set metadata key \"%.64s\"", key);
	return COT_OK;
}

cot_err st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, cot_errbuf *eb)
{
	size_t nl = strlen(name);
	if (nl == 0 || nl > ST_NAME_MAX || strcmp(name, "__metadata__") == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid tensor name \"%.64s\"", name);
	if (json_object_get(w->tensors, name))
		return cot_seterr(eb, COT_ERR_INVALID, "duplicate tensor name \"%.64s\"", name);
	if ((unsigned)dtype >= ST_NDTYPES || ndim < 0 || ndim > ST_MAX_DIMS)
		return cot_seterr(eb, COT_ERR_INVALID, "tensor \"%.64s\" has a bad dtype or dimension count",
		                  name);
	if (w->count >= ST_MAX_TENSORS)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "more than %d tensors", ST_MAX_TENSORS);
	size_t numel = 1, nbytes, end;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return cot_seterr(eb, COT_ERR_INVALID, "tensor \"%.64s\" has a negative dimension",
			                  name);
		if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
			return cot_seterr(eb, COT_ERR_TOO_LARGE, "tensor \"%.64s\" has too many elements",
			                  name);
	}
	if (__builtin_mul_overflow(numel, dtypes[dtype].size, &nbytes) ||
	    __builtin_add_overflow(w->data_len, nbytes, &end) || end > (size_t)INT64_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "tensor \"%.64s\" is too large", name);
	if (nbytes && !data)
		return cot_seterr(eb, COT_ERR_INVALID, "tensor \"%.64s\" has no data", name);

	if (w->count == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 64;
		wchunk *c = realloc(w->chunks, cap * sizeof *c);
		if (!c)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		w->chunks = c;
		w->cap = cap;
	}
	json_t *js = json_array(), *e = json_object();
	int bad = !js || !e;
	for (int i = 0; !bad && i < ndim; i++)
		bad = json_array_append_new(js, json_integer(shape[i]));
	bad = bad || json_object_set_new(e, "dtype", json_string(dtypes[dtype].name)) ||
	      json_object_set(e, "shape", js) ||
	      json_object_set_new(e, "data_offsets",
	                          json_pack("[II]", (json_int_t)w->data_len, (json_int_t)end));
	json_decref(js);
	if (bad || json_object_set_new(w->tensors, name, e)) {
		if (bad)
			json_decref(e);
		return cot_seterr(eb, COT_ERR_NOMEM, "could not add tensor \"%.64s\"", name);
	}
	w->chunks[w->count++] = (wchunk){ data, nbytes };
	w->data_len = end;
	return COT_OK;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

/* fsync the folder holding path, so that a rename into it is durable. */
static int sync_parent(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	if (!slash)
		strcpy(dir, ".");
	else if (slash == path)
		strcpy(dir, "/");
	else
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	if (rc < 0 && errno == EINVAL) /* file systems that cannot */
		rc = 0;
	close(fd);
	return rc;
}

cot_err st_writer_write(st_writer *w, const char *path, cot_errbuf *eb)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "cannot write safetensors file \"%.200s\": path too "
		                  "long",
		                  path);

	/* "__metadata__" first, as the Python library writes it. */
	json_t *h = json_object();
	if (!h || (json_object_size(w->meta) && json_object_set(h, "__metadata__", w->meta)) ||
	    json_object_update(h, w->tensors)) {
		json_decref(h);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	char *hdr = json_dumps(h, JSON_COMPACT);
	json_decref(h);
	if (!hdr)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the safetensors header");
	size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
	if (padded > ST_HEADER_MAX) {
		free(hdr);
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "safetensors header of %zu bytes exceeds the limit "
		                  "of %u",
		                  padded, ST_HEADER_MAX);
	}
	char *buf = malloc(8 + padded);
	if (!buf) {
		free(hdr);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (char)((uint64_t)padded >> (8 * i) & 0xff);
	memcpy(buf + 8, hdr, hl);
	memset(buf + 8 + hl, ' ', padded - hl);
	free(hdr);

	int fd = mkstemp(tmp);
	if (fd < 0) {
		int e = errno;
		free(buf);
		return cot_seterr(eb, COT_ERR_IO, "could not create temporary file \"%s\": %s", tmp,
		                  strerror(e));
	}
	const char *what = "write";
	int fail = fchmod(fd, 0644) < 0 || write_all(fd, buf, 8 + padded) < 0;
	for (size_t i = 0; !fail && i < w->count; i++)
		fail = write_all(fd, w->chunks[i].data, w->chunks[i].nbytes) < 0;
	if (!fail && fsync(fd) < 0) {
		what = "fsync";
		fail = 1;
	}
	int e = errno;
	free(buf);
	if (close(fd) < 0 && !fail) {
		e = errno;
		what = "close";
		fail = 1;
	}
	if (!fail && rename(tmp, path) < 0) {
		e = errno;
		what = "rename";
		fail = 1;
	}
	if (fail) {
		unlink(tmp);
		return cot_seterr(eb, COT_ERR_IO,
		                  "could not write safetensors file \"%s\": %s "
		                  "failed: %s",
		                  path, what, strerror(e));
	}
	if (sync_parent(path) < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not sync the folder of \"%s\": %s", path,
		                  strerror(errno));
	return COT_OK;
}
