/* cotrain: turning text files into a dataset's shards and manifest (see
 * dataset_import.h). */
#include "server/dataset_import.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>
#include <zlib.h>

#include "kernels/spm.h"

#define READ_CHUNK (1u << 16)
#define DOC_NAME_MAX 1024 /* bytes of a document's name kept for messages */

typedef struct {
	const char *store;
	const char *name;
	uint64_t shard_tokens;
	cot_errbuf *eb;

	const ds_tokenizer *tok; /* NULL: the byte tokenizer */
	int width;               /* bytes a token in the shards: 1, 2 or 4 */
	unsigned char *buf;      /* the shard being filled: shard_tokens tokens */
	size_t fill;             /* tokens in buf */
	uint64_t total;          /* tokens emitted so far */
	uint64_t cut;            /* a shard ends at this stream position too (0: none) */
	ds_shard *shards;
	size_t n_shards, cap_shards;
	uint64_t n_docs, n_skipped;
	unsigned char *chunk; /* READ_CHUNK bytes for reading input */

	/* The current document. */
	char doc[DOC_NAME_MAX];
	char *text; /* with a subword tokenizer, its bytes so far (text_cap) */
	size_t text_len, text_cap;
	uint64_t doc_off;     /* bytes of it seen */
	int doc_started;      /* a byte of it has been emitted */
	int need;             /* UTF-8 continuation bytes still expected */
	unsigned char lo, hi; /* allowed range of the next continuation byte */
	uint64_t seq_start;   /* offset of the sequence being completed */
	unsigned char lead;   /* and its first byte */
} importer;

/* ---- the token stream -------------------------------------------------- */

static cot_err flush_shard(importer *im)
{
	if (im->fill == 0)
		return COT_OK;
	if (im->n_shards >= (size_t)INT32_MAX)
		return cot_seterr(im->eb, COT_ERR_TOO_LARGE, "dataset \"%s\" would need more than %d shards",
		                  im->name, INT32_MAX);
	if (im->n_shards == im->cap_shards) {
		size_t cap = im->cap_shards ? 2 * im->cap_shards : 16;
		ds_shard *s = realloc(im->shards, cap * sizeof *s);
		if (!s)
			return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
		im->shards = s;
		im->cap_shards = cap;
	}
	ds_shard *sh = &im->shards[im->n_shards];
	shard_meta meta = { .idx = (int32_t)im->n_shards,
		            .first_token = im->total - im->fill,
		            .width = im->width };
	snprintf(meta.dataset, sizeof meta.dataset, "%s", im->name);
	if (im->tok)
		snprintf(meta.tokenizer_sha256, sizeof meta.tokenizer_sha256, "%s", im->tok->sha256);
	cot_err rc = shard_write(im->store, &meta, im->buf, im->fill, sh->sha256, &sh->size, im->eb);
	if (rc)
		return rc;
	sh->idx = meta.idx;
	sh->first_token = meta.first_token;
	sh->n_tokens = meta.n_tokens;
	memcpy(sh->tokens_sha256, meta.tokens_sha256, sizeof sh->tokens_sha256);
	im->n_shards++;
	im->fill = 0;
	return COT_OK;
}

/* Append n tokens to the stream, writing shards as they fill: p holds them
 * as shards store them, n * im->width bytes. */
static cot_err emit(importer *im, const unsigned char *p, size_t n)
{
	if (n > DS_MAX_TOKENS - im->total)
		return cot_seterr(im->eb, COT_ERR_TOO_LARGE,
		                  "dataset \"%s\" would hold more than %llu tokens", im->name,
		                  (unsigned long long)DS_MAX_TOKENS);
	while (n) {
		size_t room = im->shard_tokens - im->fill;
		if (im->total < im->cut && im->cut - im->total < room)
			room = (size_t)(im->cut - im->total);
		size_t k = n < room ? n : room;
		memcpy(im->buf + im->fill * (size_t)im->width, p, k * (size_t)im->width);
		im->fill += k;
		im->total += k;
		p += k * (size_t)im->width;
		n -= k;
		if (im->fill == im->shard_tokens || (im->fill && im->total == im->cut)) {
			cot_err rc = flush_shard(im);
			if (rc)
				return rc;
		}
	}
	return COT_OK;
}

/* ---- documents --------------------------------------------------------- */

static void doc_begin(importer *im, const char *name)
{
	snprintf(im->doc, sizeof im->doc, "%s", name);
	im->doc_off = 0;
	im->doc_started = 0;
	im->need = 0;
}

/* Keep n more bytes of the document, to be encoded whole at its end. */
static cot_err doc_keep(importer *im, const unsigned char *p, size_t n)
{
	if (n > DS_DOC_MAX - im->text_len)
		return cot_seterr(im->eb, COT_ERR_TOO_LARGE,
		                  "file \"%s\" is larger than %llu bytes, the most a subword tokenizer "
		                  "encodes as one document",
		                  im->doc, (unsigned long long)DS_DOC_MAX);
	if (im->text_len + n > im->text_cap) {
		size_t cap = im->text_cap ? im->text_cap : READ_CHUNK;
		while (cap < im->text_len + n)
			cap *= 2;
		char *t = realloc(im->text, cap);
		if (!t)
			return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory for file \"%s\"", im->doc);
		im->text = t;
		im->text_cap = cap;
	}
	memcpy(im->text + im->text_len, p, n);
	im->text_len += n;
	return COT_OK;
}

/* Emit ids[0..n) in the shards' width (little-endian), in pieces. */
static cot_err emit_ids(importer *im, const int32_t *ids, size_t n)
{
	unsigned char packed[4096];
	size_t per = sizeof packed / (size_t)im->width;
	while (n) {
		size_t k = n < per ? n : per;
		for (size_t i = 0; i < k; i++) {
			uint32_t v = (uint32_t)ids[i];
			for (int b = 0; b < im->width; b++)
				packed[i * (size_t)im->width + (size_t)b] = (unsigned char)(v >> (8 * b));
		}
		cot_err rc = emit(im, packed, k);
		if (rc)
			return rc;
		ids += k;
		n -= k;
	}
	return COT_OK;
}

/* The end of a document with a subword tokenizer: encode its text whole
 * and emit the ids, after the separator when a document came before. */
static cot_err doc_encode(importer *im)
{
	if (im->text_len == 0)
		return COT_OK; /* empty documents are skipped */
	int32_t *ids = NULL;
	size_t n = 0;
	cot_errbuf e2 = { "", "" };
	cot_err rc = spm_encode(im->tok->model, im->text, im->text_len, &ids, &n, &e2);
	im->text_len = 0;
	if (rc)
		return cot_seterr(im->eb, rc, "could not encode file \"%s\": %s", im->doc, e2.msg);
	if (im->n_docs > 0)
		rc = emit_ids(im, im->tok->separator, 2);
	if (!rc)
		rc = emit_ids(im, ids, n);
	free(ids);
	im->n_docs++;
	return rc;
}

/* lead: the first byte of the sequence at offset off, or -1 when c is the
 * offending first byte itself. */
static cot_err utf8_error(importer *im, uint64_t off, int lead, unsigned char c)
{
	if (lead < 0)
		cot_seterr(im->eb, COT_ERR_INVALID,
		           "file \"%s\" is not valid UTF-8: byte 0x%02x at byte offset %llu cannot start a "
		           "character",
		           im->doc, c, (unsigned long long)off);
	else
		cot_seterr(im->eb, COT_ERR_INVALID,
		           "file \"%s\" is not valid UTF-8: invalid sequence at byte offset %llu (0x%02x "
		           "followed by 0x%02x)",
		           im->doc, (unsigned long long)off, lead, c);
	cot_sethint(im->eb, "Every file of a dataset must be UTF-8 text; convert it (iconv -t UTF-8) or "
	                    "leave it out.");
	return COT_ERR_INVALID;
}

/* Check n more bytes of the document against RFC 3629 (the table in its
 * section 4), keeping state across calls, then emit them. */
static cot_err doc_data(importer *im, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = p[i];
		uint64_t off = im->doc_off + i;
		if (im->need) {
			if (c < im->lo || c > im->hi)
				return utf8_error(im, im->seq_start, im->lead, c);
			im->lo = 0x80;
			im->hi = 0xBF;
			im->need--;
			continue;
		}
		if (c < 0x80)
			continue;
		im->seq_start = off;
		im->lead = c;
		im->lo = 0x80;
		im->hi = 0xBF;
		if (c >= 0xC2 && c <= 0xDF) {
			im->need = 1;
		} else if (c == 0xE0) {
			im->need = 2;
			im->lo = 0xA0;
		} else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
			im->need = 2;
		} else if (c == 0xED) {
			im->need = 2;
			im->hi = 0x9F; /* no surrogates */
		} else if (c == 0xF0) {
			im->need = 3;
			im->lo = 0x90;
		} else if (c >= 0xF1 && c <= 0xF3) {
			im->need = 3;
		} else if (c == 0xF4) {
			im->need = 3;
			im->hi = 0x8F; /* nothing above U+10FFFF */
		} else {
			return utf8_error(im, off, -1, c);
		}
	}
	im->doc_off += n;
	if (im->tok)
		return doc_keep(im, p, n);
	if (n && !im->doc_started) {
		im->doc_started = 1;
		if (im->n_docs > 0) {
			cot_err rc = emit(im, (const unsigned char *)DS_SEPARATOR, sizeof DS_SEPARATOR - 1);
			if (rc)
				return rc;
		}
		im->n_docs++;
	}
	return emit(im, p, n);
}

static cot_err doc_end(importer *im)
{
	if (im->need) {
		cot_seterr(im->eb, COT_ERR_INVALID,
		           "file \"%s\" is not valid UTF-8: truncated sequence at byte offset %llu", im->doc,
		           (unsigned long long)im->seq_start);
		cot_sethint(im->eb, "Every file of a dataset must be UTF-8 text; convert it (iconv -t UTF-8) "
		                    "or leave it out.");
		return COT_ERR_INVALID;
	}
	return im->tok ? doc_encode(im) : COT_OK;
}

/* ---- inputs ------------------------------------------------------------ */

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n > m && strcasecmp(s + n - m, suf) == 0;
}

static int is_archive_name(const char *path)
{
	static const char *const sufs[] = {
		".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".zip",
	};
	for (size_t i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
		if (has_suffix(path, sufs[i]))
			return 1;
	return 0;
}

/* True when a component of a relative path starts with '.' (and is not
 * "." itself): hidden files and folders are left out. */
static int is_hidden(const char *rel)
{
	const char *p = rel;
	while (*p) {
		const char *end = strchr(p, '/');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len > 0 && p[0] == '.' && !(len == 1))
			return 1;
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

static cot_err import_file(importer *im, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(im->eb, COT_ERR_IO, "could not open file \"%s\": %s", path,
		                  strerror(errno));
	doc_begin(im, path);
	cot_err rc = COT_OK;
	for (;;) {
		ssize_t n = read(fd, im->chunk, READ_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cot_seterr(im->eb, COT_ERR_IO, "could not read file \"%s\": %s", path,
			                strerror(errno));
			break;
		}
		if (n == 0) {
			rc = doc_end(im);
			break;
		}
		rc = doc_data(im, im->chunk, (size_t)n);
		if (rc)
			break;
	}
	close(fd);
	return rc;
}

static const char *arch_msg(struct archive *a)
{
	const char *s = archive_error_string(a);
	return s ? s : "unknown error";
}

/* Check that a compressed archive's stream is whole and undamaged to its
 * very end.  libarchive decompresses only as far as the archive's entries
 * need and never checks a gzip member's CRC-32 and length, so a damaged
 * byte could decode to other text without an error: every gzip member is
 * read to its end with zlib, which checks both; another compression (bzip2,
 * xz) is read to its end through libarchive's raw format, where its own
 * checks run.  COT_OK for an uncompressed archive. */
static cot_err check_stream(importer *im, const char *path)
{
	unsigned char magic[2] = { 0, 0 };
	FILE *f = fopen(path, "rb");
	size_t got = f ? fread(magic, 1, 2, f) : 0;
	if (f)
		fclose(f);
	cot_err rc = COT_OK;
	if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
		gzFile g = gzopen(path, "rb");
		if (!g)
			return cot_seterr(im->eb, COT_ERR_IO, "could not open archive \"%s\"", path);
		int n, err = Z_OK;
		while ((n = gzread(g, im->chunk, READ_CHUNK)) > 0)
			;
		const char *why = gzerror(g, &err);
		if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
			rc = cot_seterr(im->eb, COT_ERR_CORRUPT, "archive \"%s\" is damaged: gzip: %s", path,
			                why && why[0] ? why : "bad data");
		gzclose_r(g);
		return rc;
	}
	struct archive *a = archive_read_new();
	if (!a)
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	archive_read_support_filter_all(a);
	archive_read_support_format_raw(a);
	struct archive_entry *e;
	if (archive_read_open_filename(a, path, READ_CHUNK) != ARCHIVE_OK ||
	    archive_read_next_header(a, &e) != ARCHIVE_OK) {
		rc = cot_seterr(im->eb, COT_ERR_CORRUPT, "could not read archive \"%s\": %s", path,
		                arch_msg(a));
	} else if (archive_filter_count(a) > 1) { /* compressed: the raw stream to its end */
		la_ssize_t n;
		while ((n = archive_read_data(a, im->chunk, READ_CHUNK)) > 0)
			;
		if (n < 0)
			rc = cot_seterr(im->eb, COT_ERR_CORRUPT, "archive \"%s\" is damaged: %s", path,
			                arch_msg(a));
	}
	archive_read_free(a);
	return rc;
}

static cot_err import_archive(importer *im, const char *path)
{
	struct archive *a = archive_read_new();
	if (!a)
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	archive_read_support_filter_all(a);
	archive_read_support_format_tar(a);
	archive_read_support_format_zip(a);
	cot_err rc = COT_OK;
	if (archive_read_open_filename(a, path, READ_CHUNK) != ARCHIVE_OK) {
		rc = cot_seterr(im->eb, COT_ERR_CORRUPT, "could not read archive \"%s\": %s", path,
		                arch_msg(a));
		goto out;
	}
	for (;;) {
		struct archive_entry *e;
		int r = archive_read_next_header(a, &e);
		if (r == ARCHIVE_EOF)
			break;
		if (r != ARCHIVE_OK) {
			rc = cot_seterr(im->eb, COT_ERR_CORRUPT, "could not read archive \"%s\": %s", path,
			                arch_msg(a));
			break;
		}
		const char *ename = archive_entry_pathname(e);
		if (!ename || archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e) ||
		    is_hidden(ename)) {
			im->n_skipped++;
			continue;
		}
		char name[DOC_NAME_MAX];
		snprintf(name, sizeof name, "%.500s:%.500s", path, ename);
		doc_begin(im, name);
		for (;;) {
			la_ssize_t n = archive_read_data(a, im->chunk, READ_CHUNK);
			if (n < 0) {
				rc = cot_seterr(im->eb, COT_ERR_CORRUPT,
				                "could not read \"%.500s\" in archive \"%s\": %s", ename,
				                path, arch_msg(a));
				break;
			}
			if (n == 0) {
				rc = doc_end(im);
				break;
			}
			rc = doc_data(im, im->chunk, (size_t)n);
			if (rc)
				break;
		}
		if (rc)
			break;
	}
	if (!rc)
		rc = check_stream(im, path);
	if (rc == COT_ERR_CORRUPT)
		cot_sethint(im->eb, "Check the archive (for example with tar -tvf or unzip -t); nothing was "
		                    "imported.");
out:
	archive_read_free(a);
	return rc;
}

/* A growing list of relative paths found in a folder. */
typedef struct {
	char **v;
	size_t n, cap;
} path_list;

static void path_list_free(path_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Collect the regular files under root/rel (rel "" for root itself). */
static cot_err walk(importer *im, const char *root, const char *rel, int depth, path_list *out)
{
	if (depth > DS_MAX_DEPTH)
		return cot_seterr(im->eb, COT_ERR_TOO_LARGE, "folder \"%s/%s\" is nested more than %d deep",
		                  root, rel, DS_MAX_DEPTH);
	char dir[PATH_MAX];
	int dn = snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
	if (dn < 0 || (size_t)dn >= sizeof dir)
		return cot_seterr(im->eb, COT_ERR_TOO_LARGE, "path under \"%s\" is too long", root);
	DIR *d = opendir(dir);
	if (!d)
		return cot_seterr(im->eb, COT_ERR_IO, "could not open folder \"%s\": %s", dir,
		                  strerror(errno));
	cot_err rc = COT_OK;
	struct dirent *de;
	errno = 0;
	while (!rc && (de = readdir(d))) {
		if (de->d_name[0] == '.') { /* ".", "..", and hidden names */
			if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
				im->n_skipped++;
			continue;
		}
		char child_rel[PATH_MAX], child[PATH_MAX];
		int n1 = snprintf(child_rel, sizeof child_rel, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
		int n2 = snprintf(child, sizeof child, "%s/%s", dir, de->d_name);
		if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof child_rel || (size_t)n2 >= sizeof child) {
			rc = cot_seterr(im->eb, COT_ERR_TOO_LARGE, "path under \"%s\" is too long", dir);
			break;
		}
		struct stat st;
		if (lstat(child, &st) != 0) {
			rc = cot_seterr(im->eb, COT_ERR_IO, "could not stat file \"%s\": %s", child,
			                strerror(errno));
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			rc = walk(im, root, child_rel, depth + 1, out);
		} else if (S_ISREG(st.st_mode)) {
			if (out->n >= DS_MAX_FILES) {
				rc = cot_seterr(im->eb, COT_ERR_TOO_LARGE,
				                "folder \"%s\" holds more than %d files", root, DS_MAX_FILES);
				break;
			}
			if (out->n == out->cap) {
				size_t cap = out->cap ? 2 * out->cap : 64;
				char **v = realloc(out->v, cap * sizeof *v);
				if (!v) {
					rc = cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
					break;
				}
				out->v = v;
				out->cap = cap;
			}
			if (!(out->v[out->n] = strdup(child_rel))) {
				rc = cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
				break;
			}
			out->n++;
		} else {
			im->n_skipped++; /* links, devices, sockets, fifos */
		}
		errno = 0;
	}
	if (!rc && errno)
		rc = cot_seterr(im->eb, COT_ERR_IO, "could not read folder \"%s\": %s", dir, strerror(errno));
	closedir(d);
	return rc;
}

static cot_err import_folder(importer *im, const char *root)
{
	path_list l = { 0 };
	cot_err rc = walk(im, root, "", 0, &l);
	if (!rc)
		qsort(l.v, l.n, sizeof *l.v, cmp_str);
	for (size_t i = 0; !rc && i < l.n; i++) {
		char path[PATH_MAX];
		int n = snprintf(path, sizeof path, "%s/%s", root, l.v[i]);
		if (n < 0 || (size_t)n >= sizeof path)
			rc = cot_seterr(im->eb, COT_ERR_TOO_LARGE, "path under \"%s\" is too long", root);
		else if (is_archive_name(path))
			rc = import_archive(im, path);
		else
			rc = import_file(im, path);
	}
	path_list_free(&l);
	return rc;
}

static cot_err import_input(importer *im, const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return cot_seterr(im->eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not stat file \"%s\": %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return import_folder(im, path);
	if (!S_ISREG(st.st_mode))
		return cot_seterr(im->eb, COT_ERR_INVALID,
		                  "cannot import \"%s\": not a regular file or folder", path);
	return is_archive_name(path) ? import_archive(im, path) : import_file(im, path);
}

/* ---- the manifest ------------------------------------------------------ */

static cot_err write_manifest(importer *im, ds_result *r)
{
	json_t *shards = json_array();
	const char *dtype = im->width == 1 ? "u8" : im->width == 2 ? "u16" : "u32";
	json_t *m = shards ? json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:o}",
	                               "format", "cotrain-dataset", "version", 1, "dataset", im->name,
	                               "tokenizer", im->tok ? im->tok->type : "byte", "dtype", dtype, "vocab",
	                               im->tok ? spm_vocab_size(im->tok->model) : 256, "separator",
	                               DS_SEPARATOR, "n_tokens", (json_int_t)im->total, "heldout_tokens",
	                               (json_int_t)r->heldout_tokens, "n_documents", (json_int_t)im->n_docs,
	                               "shard_tokens", (json_int_t)im->shard_tokens, "shards", shards)
	                   : NULL;
	if (m && im->tok &&
	    (json_object_set_new(m, "tokenizer_sha256", json_string(im->tok->sha256)) ||
	     json_object_set_new(m, "separator_ids",
	                         json_pack("[i, i]", (int)im->tok->separator[0],
	                                   (int)im->tok->separator[1])))) {
		json_decref(m);
		m = NULL;
	}
	if (!m) /* json_pack released shards ("o" steals it, even on failure) */
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < im->n_shards; i++) {
		const ds_shard *s = &im->shards[i];
		json_t *o =
		        json_pack("{s:i, s:I, s:I, s:s, s:I, s:s}", "idx", (int)s->idx, "first_token",
		                  (json_int_t)s->first_token, "n_tokens", (json_int_t)s->n_tokens, "sha256",
		                  s->sha256, "size", (json_int_t)s->size, "tokens_sha256", s->tokens_sha256);
		if (!o || json_array_append_new(shards, o) != 0) {
			json_decref(m);
			return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
		}
	}
	char *text = json_dumps(m, JSON_INDENT(1));
	json_decref(m);
	if (!text)
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	size_t len = strlen(text);
	char *t2 = realloc(text, len + 2);
	if (!t2) {
		free(text);
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	}
	t2[len++] = '\n';
	t2[len] = '\0';
	cot_err rc = fs_put_buffer(im->store, t2, len, r->manifest_sha256, &r->manifest_size, im->eb);
	free(t2);
	return rc;
}

uint64_t ds_heldout_tokens(uint64_t n_tokens, double heldout_fraction)
{
	if (!(heldout_fraction > 0))
		return 0;
	double h = ceil(heldout_fraction * (double)n_tokens);
	uint64_t held = h >= (double)n_tokens ? n_tokens : (uint64_t)h;
	return held < DS_HELDOUT_MIN_TOKENS ? DS_HELDOUT_MIN_TOKENS : held;
}

/* Cut the stream at b = total - heldout: rewrite the shards from the one
 * holding token b on, reading them back from the store, so that a shard
 * ends at b; the old shards' files no longer listed are removed from the
 * store (they were written by this import).  Costs the held-out part and
 * one shard read and written again. */
static cot_err cut_heldout(importer *im, uint64_t heldout)
{
	uint64_t b = im->total - heldout;
	size_t k = 0;
	while (k < im->n_shards && im->shards[k].first_token + im->shards[k].n_tokens <= b)
		k++;
	if (k == im->n_shards || im->shards[k].first_token == b)
		return COT_OK; /* b is already a shard boundary */
	size_t n_old = im->n_shards - k;
	ds_shard *old = malloc(n_old * sizeof *old);
	if (!old)
		return cot_seterr(im->eb, COT_ERR_NOMEM, "out of memory");
	memcpy(old, im->shards + k, n_old * sizeof *old);
	im->n_shards = k;
	im->total = old[0].first_token;
	im->fill = 0;
	im->cut = b;
	cot_err rc = COT_OK;
	for (size_t j = 0; j < n_old && !rc; j++) {
		char path[PATH_MAX];
		shard_meta meta;
		unsigned char *tok = NULL;
		if ((rc = fs_path(im->store, old[j].sha256, path, sizeof path, im->eb)) ||
		    (rc = shard_read(path, im->shard_tokens, &meta, &tok, im->eb)))
			break;
		rc = emit(im, tok, (size_t)meta.n_tokens);
		free(tok);
	}
	if (!rc)
		rc = flush_shard(im);
	for (size_t j = 0; j < n_old && !rc; j++) {
		bool kept = false;
		for (size_t i = k; i < im->n_shards && !kept; i++)
			kept = strcmp(im->shards[i].sha256, old[j].sha256) == 0;
		char path[PATH_MAX];
		if (!kept && fs_path(im->store, old[j].sha256, path, sizeof path, im->eb) == COT_OK)
			unlink(path);
	}
	free(old);
	return rc;
}

cot_err ds_import_heldout(const char *store_dir, const char *name, uint64_t shard_tokens,
                          double heldout_fraction, const char *const *inputs, size_t n_inputs, ds_result *out,
                          cot_errbuf *eb)
{
	return ds_import_tokenized(store_dir, name, shard_tokens, heldout_fraction, NULL, inputs, n_inputs,
	                           out, eb);
}

cot_err ds_import_tokenized(const char *store_dir, const char *name, uint64_t shard_tokens,
                            double heldout_fraction, const ds_tokenizer *tok, const char *const *inputs,
                            size_t n_inputs, ds_result *out, cot_errbuf *eb)
{
	memset(out, 0, sizeof *out);
	if (!shard_name_valid(name))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "invalid dataset name \"%.80s\": use 1 to 64 letters, digits, '.', '_' or "
		                  "'-', starting with a letter or digit",
		                  name ? name : "");
	if (shard_tokens < DS_SHARD_TOKENS_MIN || shard_tokens > DS_SHARD_TOKENS_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "shard size %llu is out of range: use %u to %u tokens",
		                  (unsigned long long)shard_tokens, DS_SHARD_TOKENS_MIN, DS_SHARD_TOKENS_MAX);
	if (!(heldout_fraction >= 0 && heldout_fraction <= DS_HELDOUT_FRACTION_MAX))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "held-out fraction %g is out of range: use a number from 0 to %g",
		                  heldout_fraction, DS_HELDOUT_FRACTION_MAX);
	if (n_inputs == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "no input files given");

	if (tok && (!tok->model || !fs_sha_valid(tok->sha256) || spm_piece_id(tok->model, "\n") < 0))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "tokenizer %.64s cannot encode a dataset: it has no newline piece",
		                  tok->sha256);
	importer im = { .store = store_dir, .name = name, .shard_tokens = shard_tokens, .eb = eb, .tok = tok };
	im.width = !tok ? 1 : spm_vocab_size(tok->model) <= 65536 ? 2 : 4;
	im.buf = malloc(shard_tokens * (size_t)im.width);
	im.chunk = malloc(READ_CHUNK);
	cot_err rc = COT_OK;
	if (!im.buf || !im.chunk)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; !rc && i < n_inputs; i++)
		rc = import_input(&im, inputs[i]);
	if (!rc)
		rc = flush_shard(&im);
	if (!rc && im.total == 0) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "dataset \"%s\" would hold no tokens", name);
		cot_sethint(eb, "The inputs hold no non-empty text files.");
	}
	uint64_t heldout = rc ? 0 : ds_heldout_tokens(im.total, heldout_fraction);
	if (!rc && heldout > im.total / 2) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "dataset \"%s\" is too small for a held-out part: %llu of its %llu tokens "
		                "would be held out",
		                name, (unsigned long long)heldout, (unsigned long long)im.total);
		cot_sethint(eb,
		            "A held-out part holds at least %u tokens and at most half the dataset; import "
		            "more text, or give --heldout-fraction 0 (no held-out evaluation).",
		            DS_HELDOUT_MIN_TOKENS);
	}
	if (!rc && heldout)
		rc = cut_heldout(&im, heldout);
	out->heldout_tokens = heldout;
	if (!rc)
		rc = write_manifest(&im, out);
	free(im.buf);
	free(im.chunk);
	free(im.text);
	if (rc) {
		free(im.shards);
		memset(out, 0, sizeof *out);
		return rc;
	}
	out->n_tokens = im.total;
	out->n_documents = im.n_docs;
	out->n_skipped = im.n_skipped;
	out->n_shards = im.n_shards;
	out->shards = im.shards;
	out->width = im.width;
	return COT_OK;
}

cot_err ds_import(const char *store_dir, const char *name, uint64_t shard_tokens, const char *const *inputs,
                  size_t n_inputs, ds_result *out, cot_errbuf *eb)
{
	return ds_import_heldout(store_dir, name, shard_tokens, 0, inputs, n_inputs, out, eb);
}

void ds_result_free(ds_result *r)
{
	if (!r)
		return;
	free(r->shards);
	memset(r, 0, sizeof *r);
}
