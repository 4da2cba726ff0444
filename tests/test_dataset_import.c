/* cotrain tests: dataset import without a database: the token stream from
 * a folder, a .tar, a .tar.gz, a .zip (written here with libarchive, and
 * with the tar and zip commands when present) is the same, shard for shard;
 * bad UTF-8 and corrupt archives are refused with a clear message. */
#include "server/dataset_import.h"
#include "shared/common/filestore.h"
#include "shared/common/microbatch.h"
#include "shared/common/shard.h"
#include "tests/tap.h"

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char root[64], src[128], store[128];

/* The documents of the test corpus, by relative path, in sorted order. */
#define N_DOCS 4
static const char *doc_path[N_DOCS] = { "a.txt", "b/c.txt", "b/d.txt", "e-z.txt" };
static char *doc_text[N_DOCS];
static size_t doc_len[N_DOCS];

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
		bail_out("could not write %s", path);
}

static void make_corpus(void)
{
	doc_text[0] = strdup("Hello, world.\n");
	doc_text[1] = strdup("Grüße aus Köln, 世界, \xf0\x9f\x8c\x8d and \xf4\x8f\xbf\xbf.\n");
	/* About 200 KB with multi-byte characters, so that UTF-8 sequences
	 * straddle the 64 KiB read chunks and shards hold many documents. */
	size_t cap = 220000, n = 0;
	doc_text[2] = malloc(cap);
	if (!doc_text[2])
		bail_out("out of memory");
	for (int i = 0; n + 64 < cap; i++)
		n += (size_t)snprintf(doc_text[2] + n, cap - n, "Line %d: naïve café — ünïcödé ✓\n", i);
	doc_text[3] = strdup("last document, no trailing newline");
	for (int i = 0; i < N_DOCS; i++)
		doc_len[i] = i == 2 ? n : strlen(doc_text[i]);

	char p[PATH_MAX];
	snprintf(p, sizeof p, "%s/b", src);
	mkdir(p, 0755);
	for (int i = 0; i < N_DOCS; i++) {
		snprintf(p, sizeof p, "%s/%s", src, doc_path[i]);
		write_file(p, doc_text[i], doc_len[i]);
	}
	/* Skipped: empty files, hidden files and folders, symbolic links. */
	snprintf(p, sizeof p, "%s/b/empty.txt", src);
	write_file(p, "", 0);
	snprintf(p, sizeof p, "%s/.hidden", src);
	write_file(p, "\xff\xfe not text", 10);
	snprintf(p, sizeof p, "%s/.git", src);
	mkdir(p, 0755);
	snprintf(p, sizeof p, "%s/.git/config", src);
	write_file(p, "\xff", 1);
	snprintf(p, sizeof p, "%s/link.txt", src);
	if (symlink("a.txt", p) != 0)
		diag("could not create a symbolic link");
}

/* The expected stream: documents joined by DS_SEPARATOR. */
static unsigned char *expected_stream(size_t *len)
{
	size_t n = 0;
	for (int i = 0; i < N_DOCS; i++)
		n += doc_len[i] + (i ? strlen(DS_SEPARATOR) : 0);
	unsigned char *s = malloc(n), *p = s;
	if (!s)
		bail_out("out of memory");
	for (int i = 0; i < N_DOCS; i++) {
		if (i) {
			memcpy(p, DS_SEPARATOR, strlen(DS_SEPARATOR));
			p += strlen(DS_SEPARATOR);
		}
		memcpy(p, doc_text[i], doc_len[i]);
		p += doc_len[i];
	}
	*len = n;
	return s;
}

/* Write the corpus (plus a folder entry and an empty file) as an archive
 * with libarchive. */
static void write_archive(const char *path, int zip, int gz)
{
	struct archive *a = archive_write_new();
	if (zip)
		archive_write_set_format_zip(a);
	else
		archive_write_set_format_pax_restricted(a);
	if (gz)
		archive_write_add_filter_gzip(a);
	if (archive_write_open_filename(a, path) != ARCHIVE_OK)
		bail_out("could not write %s: %s", path, archive_error_string(a));
	struct archive_entry *e = archive_entry_new();
	archive_entry_set_pathname(e, "b/");
	archive_entry_set_filetype(e, AE_IFDIR);
	archive_entry_set_perm(e, 0755);
	archive_write_header(a, e);
	for (int i = 0; i < N_DOCS; i++) {
		archive_entry_clear(e);
		archive_entry_set_pathname(e, doc_path[i]);
		archive_entry_set_filetype(e, AE_IFREG);
		archive_entry_set_perm(e, 0644);
		archive_entry_set_size(e, (la_int64_t)doc_len[i]);
		if (archive_write_header(a, e) != ARCHIVE_OK ||
		    archive_write_data(a, doc_text[i], doc_len[i]) != (la_ssize_t)doc_len[i])
			bail_out("could not write %s: %s", path, archive_error_string(a));
		if (i == 1) { /* an empty file between documents */
			archive_entry_clear(e);
			archive_entry_set_pathname(e, "b/empty.txt");
			archive_entry_set_filetype(e, AE_IFREG);
			archive_entry_set_perm(e, 0644);
			archive_entry_set_size(e, 0);
			archive_write_header(a, e);
		}
	}
	archive_entry_free(e);
	if (archive_write_close(a) != ARCHIVE_OK)
		bail_out("could not close %s: %s", path, archive_error_string(a));
	archive_write_free(a);
}

/* Read back every shard of r, check the layout, and return the stream. */
static unsigned char *read_stream(const ds_result *r, size_t *len)
{
	unsigned char *s = malloc(r->n_tokens ? r->n_tokens : 1);
	size_t n = 0;
	int good = 1;
	for (size_t i = 0; i < r->n_shards; i++) {
		char path[PATH_MAX];
		cot_errbuf eb = { "", "" };
		shard_meta m;
		unsigned char *tok;
		fs_path(store, r->shards[i].sha256, path, sizeof path, &eb);
		if (fs_verify(store, r->shards[i].sha256, NULL, &eb) != COT_OK ||
		    shard_read(path, SHARD_TOKENS_MAX, &m, &tok, &eb) != COT_OK) {
			diag("shard %zu: %s", i, eb.msg);
			good = 0;
			continue;
		}
		if (m.idx != (int32_t)i || m.first_token != n || m.n_tokens != r->shards[i].n_tokens ||
		    strcmp(m.tokens_sha256, r->shards[i].tokens_sha256) != 0 ||
		    n + m.n_tokens > r->n_tokens) {
			diag("shard %zu: layout differs", i);
			good = 0;
		} else {
			memcpy(s + n, tok, m.n_tokens);
			n += m.n_tokens;
		}
		free(tok);
	}
	*len = good ? n : 0;
	return s;
}

static int same_shards(const ds_result *a, const ds_result *b)
{
	if (a->n_shards != b->n_shards || a->n_tokens != b->n_tokens)
		return 0;
	for (size_t i = 0; i < a->n_shards; i++)
		if (strcmp(a->shards[i].sha256, b->shards[i].sha256) != 0)
			return 0;
	return strcmp(a->manifest_sha256, b->manifest_sha256) == 0;
}

static int count_files(const char *dir)
{
	char cmd[PATH_MAX];
	snprintf(cmd, sizeof cmd, "find '%s' -type f | wc -l", dir);
	FILE *p = popen(cmd, "r");
	int n = -1;
	if (p) {
		if (fscanf(p, "%d", &n) != 1)
			n = -1;
		pclose(p);
	}
	return n;
}

static int run(const char *cmd)
{
	int rc = system(cmd);
	if (rc != 0)
		diag("command failed (%d): %s", rc, cmd);
	return rc == 0;
}

static void check_manifest(const ds_result *r)
{
	char path[PATH_MAX];
	cot_errbuf eb = { "", "" };
	fs_path(store, r->manifest_sha256, path, sizeof path, &eb);
	json_error_t je;
	json_t *m = json_load_file(path, 0, &je);
	ok(m != NULL, "the manifest is JSON");
	const char *format = "", *dataset = "", *sep = "";
	json_int_t ntok = -1, ndocs = -1;
	json_t *shards = NULL;
	json_unpack(m, "{s:s, s:s, s:s, s:I, s:I, s:o}", "format", &format, "dataset", &dataset, "separator",
	            &sep, "n_tokens", &ntok, "n_documents", &ndocs, "shards", &shards);
	is_str(format, "cotrain-dataset", "manifest format");
	is_str(dataset, "tiny", "manifest names the dataset");
	is_str(sep, DS_SEPARATOR, "manifest names the separator");
	is_int(ntok, (long long)r->n_tokens, "manifest counts the tokens");
	is_int(ndocs, N_DOCS, "manifest counts %d documents", N_DOCS);
	is_int((long long)json_array_size(shards), (long long)r->n_shards, "manifest lists every shard");
	int good = 1;
	for (size_t i = 0; i < json_array_size(shards); i++) {
		const char *sha = "";
		json_int_t ft = -1, nt = -1, sz = -1;
		json_unpack(json_array_get(shards, i), "{s:s, s:I, s:I, s:I}", "sha256", &sha, "first_token",
		            &ft, "n_tokens", &nt, "size", &sz);
		good &= strcmp(sha, r->shards[i].sha256) == 0 && (uint64_t)ft == r->shards[i].first_token &&
		        (uint64_t)nt == r->shards[i].n_tokens && (uint64_t)sz == r->shards[i].size;
	}
	ok(good, "manifest entries match the shards");
	json_decref(m);
}

/* The held-out part (doc/dataset.md): the last tokens of the stream, in
 * shards of their own, recorded in the manifest; an epoch cut from the rest
 * (mb_per_epoch of the training tokens) reads none of them, whatever the
 * geometry. */
/* Shards of subword ids: u16 and u32, little-endian, read back and mapped
 * to microbatches; a width without its tokenizer, or the reverse, is
 * refused. */
static void check_wide_shards(void)
{
	static const char tok_sha[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
	cot_errbuf eb = { "", "" };
	enum { N = 300 };
	for (int width = 2; width <= 4; width += 2) {
		unsigned char raw[N * 4];
		for (uint32_t i = 0; i < N; i++) {
			uint32_t v = width == 2 ? (i * 211u) % 65536u : i * 70001u; /* ids above 65535 too */
			for (int b = 0; b < width; b++)
				raw[i * (uint32_t)width + (uint32_t)b] = (unsigned char)(v >> (8 * b));
		}
		shard_meta meta = { .idx = 0, .first_token = 0, .width = width };
		snprintf(meta.dataset, sizeof meta.dataset, "wide");
		memcpy(meta.tokenizer_sha256, tok_sha, sizeof tok_sha);
		char sha[FS_SHA_HEX_LEN + 1], path[PATH_MAX];
		ok(shard_write(store, &meta, raw, N, sha, NULL, &eb) == COT_OK,
		   "write a shard of %d u%d ids (%s)", N, 8 * width, eb.msg);
		shard_meta back;
		unsigned char *tok = NULL;
		fs_path(store, sha, path, sizeof path, &eb);
		ok(shard_read(path, SHARD_TOKENS_MAX, &back, &tok, &eb) == COT_OK && back.width == width &&
		           back.n_tokens == N && !strcmp(back.tokenizer_sha256, tok_sha) &&
		           !memcmp(tok, raw, N * (size_t)width),
		   "read it back: width %d, its tokenizer, the same bytes (%s)", back.width, eb.msg);
		mb_span sp = { 0, N, tok, back.width };
		mb_shape sh = { mb_per_epoch(N, 7, 3), 3, 7 };
		int32_t in[21], tgt[21];
		bool same = mb_fill(&sh, &sp, 1, 5, in, tgt, &eb) == COT_OK;
		uint64_t base = mb_first_token(&sh, 5);
		for (int i = 0; same && i < 21; i++)
			same = in[i] == (int32_t)(width == 2 ? ((base + (uint64_t)i) * 211u) % 65536u
			                                     : (uint32_t)(base + (uint64_t)i) * 70001u) &&
			       tgt[i] == mb_token_at(&sp, 1, base + (uint64_t)i + 1);
		ok(same, "microbatch 5 of 3 samples of 7 tokens reads the u%d ids", 8 * width);
		free(tok);
	}
	shard_meta bad = { .idx = 0, .first_token = 0, .width = 2 };
	snprintf(bad.dataset, sizeof bad.dataset, "wide");
	unsigned char two[4] = { 1, 0, 2, 0 };
	char sha[FS_SHA_HEX_LEN + 1];
	is_int(shard_write(store, &bad, two, 2, sha, NULL, &eb), COT_ERR_INVALID,
	       "a shard of u16 ids without its tokenizer is refused: %s", eb.msg);
	bad.width = 1;
	memcpy(bad.tokenizer_sha256, tok_sha, sizeof tok_sha);
	is_int(shard_write(store, &bad, two, 2, sha, NULL, &eb), COT_ERR_INVALID,
	       "a shard of bytes naming a tokenizer is refused: %s", eb.msg);
	bad.width = 3;
	is_int(shard_write(store, &bad, two, 1, sha, NULL, &eb), COT_ERR_INVALID,
	       "tokens of 3 bytes are refused: %s", eb.msg);
}

static void check_heldout(const unsigned char *want, size_t want_len)
{
	const char *in[1] = { src };
	cot_errbuf eb = { "", "" };
	ds_result h;
	if (!is_int(ds_import_heldout(store, "held", 4096, 0.05, in, 1, &h, &eb), COT_OK,
	            "import with a held-out fraction of 0.05")) {
		diag("%s", eb.msg);
		return;
	}
	/* ceil(0.05 n), at least DS_HELDOUT_MIN_TOKENS */
	uint64_t expect = (uint64_t)ceil(0.05 * (double)want_len);
	if (expect < DS_HELDOUT_MIN_TOKENS)
		expect = DS_HELDOUT_MIN_TOKENS;
	is_int((long long)h.heldout_tokens, (long long)expect, "the last 5%% of %zu tokens are held out",
	       want_len);
	uint64_t b = h.n_tokens - h.heldout_tokens;
	int starts = 0, straddles = 0;
	for (size_t i = 0; i < h.n_shards; i++) {
		starts += h.shards[i].first_token == b;
		straddles +=
		        h.shards[i].first_token < b && h.shards[i].first_token + h.shards[i].n_tokens > b;
	}
	ok(starts == 1 && straddles == 0,
	   "a shard starts at the held-out part's first token %llu, none straddles it",
	   (unsigned long long)b);
	size_t got_len;
	unsigned char *got = read_stream(&h, &got_len);
	ok(got_len == want_len && memcmp(got, want, want_len) == 0,
	   "the shards still hold the whole stream, in order");
	free(got);
	char path[PATH_MAX];
	fs_path(store, h.manifest_sha256, path, sizeof path, &eb);
	json_t *m = json_load_file(path, 0, NULL);
	json_int_t mh = -1;
	json_unpack(m, "{s:I}", "heldout_tokens", &mh);
	is_int(mh, (long long)expect, "the manifest records heldout_tokens");
	json_decref(m);

	/* By construction: every microbatch of an epoch of the training part
	 * reads tokens below b only, and is filled from the training shards. */
	static const int64_t Ts[] = { 1, 16, 64, 127, 512 }, Bs[] = { 1, 2, 3, 8 };
	mb_span spans[64];
	int ns = 0;
	unsigned char *owned[64];
	for (size_t i = 0; i < h.n_shards && ns < 64; i++) {
		if (h.shards[i].first_token >= b)
			continue;
		shard_meta meta;
		fs_path(store, h.shards[i].sha256, path, sizeof path, &eb);
		if (shard_read(path, SHARD_TOKENS_MAX, &meta, &owned[ns], &eb))
			break;
		spans[ns] = (mb_span){ meta.first_token, meta.n_tokens, owned[ns] };
		ns++;
	}
	int bad = 0, epochs = 0;
	for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
		for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++) {
			mb_shape sh = { mb_per_epoch(b, Ts[ti], Bs[bi]), Bs[bi], Ts[ti] };
			if (sh.mb_per_epoch < 1)
				continue;
			epochs++;
			for (int64_t g = 0; g < 2 * sh.mb_per_epoch; g++)
				if (mb_first_token(&sh, g) + (uint64_t)(sh.B * sh.T) + 1 > b ||
				    mb_fill(&sh, spans, ns, g, NULL, NULL, &eb))
					bad++;
			/* and the stream's epoch would have read held-out tokens */
			mb_shape whole = { mb_per_epoch(h.n_tokens, Ts[ti], Bs[bi]), Bs[bi], Ts[ti] };
			bad += whole.mb_per_epoch <= sh.mb_per_epoch && Ts[ti] * Bs[bi] < 4096;
		}
	ok(epochs >= 15 && bad == 0,
	   "every microbatch of two epochs of %d geometries reads training tokens only, from training shards "
	   "(%d bad)",
	   epochs, bad);
	for (int i = 0; i < ns; i++)
		free(owned[i]);
	ds_result_free(&h); /* each refused import below clears h */

	is_int(ds_import_heldout(store, "held2", 4096, 0.6, in, 1, &h, &eb), COT_ERR_INVALID,
	       "a held-out fraction above 0.5 is refused: %s", eb.msg);
	is_int(ds_import_heldout(store, "held2", 4096, NAN, in, 1, &h, &eb), COT_ERR_INVALID,
	       "a NaN fraction is refused");
	is_int(ds_import_heldout(store, "held2", 4096, -0.01, in, 1, &h, &eb), COT_ERR_INVALID,
	       "a negative fraction is refused");
	is_int((long long)ds_heldout_tokens(1000, 0), 0, "a fraction of 0 holds nothing out");
	is_int((long long)ds_heldout_tokens(1000000, 0.02), 20000, "0.02 of 1e6 tokens is 20000");
	is_int((long long)ds_heldout_tokens(1000, 0.02), DS_HELDOUT_MIN_TOKENS, "but never fewer than %u",
	       DS_HELDOUT_MIN_TOKENS);
	ds_result_free(&h);
}

int main(void)
{
	cot_errbuf eb = { "", "" };
	char p[PATH_MAX], p2[PATH_MAX], cmd[4 * PATH_MAX];
	ds_result folder, r;

	plan_lazy();
	snprintf(root, sizeof root, "/tmp/cot-ds-XXXXXX");
	if (!mkdtemp(root))
		bail_out("mkdtemp failed");
	snprintf(src, sizeof src, "%s/src", root);
	snprintf(store, sizeof store, "%s/files", root);
	mkdir(src, 0755);
	make_corpus();
	size_t want_len;
	unsigned char *want = expected_stream(&want_len);

	/* A folder. */
	const char *in[2] = { src, NULL };
	if (!is_int(ds_import(store, "tiny", 4096, in, 1, &folder, &eb), COT_OK, "import a folder"))
		bail_out("%s", eb.msg);
	is_int((long long)folder.n_tokens, (long long)want_len,
	       "the stream holds the documents and separators");
	is_int((long long)folder.n_documents, N_DOCS, "empty, hidden and linked files are not documents");
	ok(folder.n_skipped >= 3, "skipped entries are counted (%llu)", (unsigned long long)folder.n_skipped);
	is_int((long long)folder.n_shards, (long long)((want_len + 4095) / 4096), "shards of 4096 tokens");
	size_t got_len;
	unsigned char *got = read_stream(&folder, &got_len);
	ok(got_len == want_len && memcmp(got, want, want_len) == 0,
	   "the shards hold the documents in sorted path order, joined by the separator");
	free(got);
	check_manifest(&folder);

	/* The same import again is deterministic and stores nothing new. */
	int files_before = count_files(store);
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_OK, "import the folder again");
	ok(same_shards(&folder, &r), "the same shards and manifest, byte for byte");
	is_int(count_files(store), files_before, "no new file in the store");
	ds_result_free(&r);

	/* The plain files listed one by one give the same stream. */
	const char *files[N_DOCS];
	char fbuf[N_DOCS][PATH_MAX];
	for (int i = 0; i < N_DOCS; i++) {
		snprintf(fbuf[i], sizeof fbuf[i], "%s/%s", src, doc_path[i]);
		files[i] = fbuf[i];
	}
	is_int(ds_import(store, "tiny", 4096, files, N_DOCS, &r, &eb), COT_OK, "import the plain files");
	ok(same_shards(&folder, &r), "same shards as the folder");
	ds_result_free(&r);

	/* Archives written by libarchive. */
	static const struct {
		const char *name;
		int zip, gz;
	} arch[] = {
		{ "corpus.tar", 0, 0 },
		{ "corpus.tar.gz", 0, 1 },
		{ "corpus.zip", 1, 0 },
	};
	for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++) {
		snprintf(p, sizeof p, "%s/%s", root, arch[i].name);
		write_archive(p, arch[i].zip, arch[i].gz);
		in[0] = p;
		cot_err rc = ds_import(store, "tiny", 4096, in, 1, &r, &eb);
		if (!is_int(rc, COT_OK, "import %s", arch[i].name))
			diag("%s", eb.msg);
		ok(rc == COT_OK && same_shards(&folder, &r), "%s gives the folder's shards and manifest",
		   arch[i].name);
		ds_result_free(&r);
	}

	/* Archives written by the tar and zip commands. */
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && tar -czf ../cli.tgz a.txt b/c.txt b/d.txt e-z.txt && "
	         "tar -cf ../cli.tar a.txt b/c.txt b/d.txt e-z.txt",
	         src);
	if (system("command -v tar >/dev/null 2>&1") == 0) {
		ok(run(cmd), "tar writes the archives: %s", cmd);
		snprintf(p, sizeof p, "%s/cli.tgz", root);
		in[0] = p;
		ok(ds_import(store, "tiny", 4096, in, 1, &r, &eb) == COT_OK && same_shards(&folder, &r),
		   "a .tgz from tar gives the folder's shards");
		ds_result_free(&r);
		snprintf(p, sizeof p, "%s/cli.tar", root);
		ok(ds_import(store, "tiny", 4096, in, 1, &r, &eb) == COT_OK && same_shards(&folder, &r),
		   "a .tar from tar gives the folder's shards");
		ds_result_free(&r);
	} else {
		skip(3, "no tar command (Debian package tar)");
	}
	if (system("command -v zip >/dev/null 2>&1") == 0) {
		snprintf(cmd, sizeof cmd, "cd '%s' && zip -q ../cli.zip a.txt b/c.txt b/d.txt e-z.txt", src);
		snprintf(p, sizeof p, "%s/cli.zip", root);
		in[0] = p;
		ok(run(cmd) && ds_import(store, "tiny", 4096, in, 1, &r, &eb) == COT_OK &&
		           same_shards(&folder, &r),
		   "a .zip from zip gives the folder's shards");
		ds_result_free(&r);
	} else {
		skip(1, "no zip command (Debian package zip)");
	}

	/* An archive inside a folder is expanded in place. */
	snprintf(p, sizeof p, "%s/nested", root);
	mkdir(p, 0755);
	snprintf(p2, sizeof p2, "%s/nested/corpus.tar.gz", root);
	write_archive(p2, 0, 1);
	in[0] = p;
	ok(ds_import(store, "tiny", 4096, in, 1, &r, &eb) == COT_OK && same_shards(&folder, &r),
	   "a folder holding the .tar.gz gives the same shards");
	ds_result_free(&r);

	/* ---- bad input ---- */
	files_before = count_files(store);
	snprintf(p, sizeof p, "%s/bad", root);
	mkdir(p, 0755);
	struct {
		const char *bytes;
		size_t len;
		const char *what;
		long off;
	} bad[] = {
		{ "abcdefg\xff rest", 12, "an 0xff byte", 7 },
		{ "ok \xc0\x80", 5, "an overlong NUL", 3 },
		{ "x\xed\xa0\x80", 4, "a UTF-16 surrogate", 1 },
		{ "ab\xf4\x90\x80\x80", 6, "a code point above U+10FFFF", 2 },
		{ "latin-1 caf\xe9 ", 13, "Latin-1 text", 11 },
		{ "cut \xe2\x82", 6, "a truncated sequence at the end", 4 },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(p2, sizeof p2, "%s/bad/x%zu.txt", root, i);
		write_file(p2, bad[i].bytes, bad[i].len);
		const char *two[2] = { src, p2 };
		is_int(ds_import(store, "tiny", 4096, two, 2, &r, &eb), COT_ERR_INVALID, "refuse %s",
		       bad[i].what);
		char want_off[64];
		snprintf(want_off, sizeof want_off, "byte offset %ld", bad[i].off);
		ok(strstr(eb.msg, p2) && strstr(eb.msg, "not valid UTF-8") && strstr(eb.msg, want_off),
		   "the message names the file and the offset: %s", eb.msg);
		unlink(p2);
	}
	ok(strstr(eb.hint, "iconv") != NULL, "with a hint: %s", eb.hint);
	/* Bad UTF-8 inside an archive names the entry. */
	snprintf(p2, sizeof p2, "%s/bad/in.txt", root);
	write_file(p2, "fine\nthen \x80", 11);
	snprintf(cmd, sizeof cmd, "cd '%s/bad' && tar -czf ../bad.tar.gz in.txt", root);
	snprintf(p, sizeof p, "%s/bad.tar.gz", root);
	in[0] = p;
	if (system("command -v tar >/dev/null 2>&1") == 0) {
		ok(run(cmd), "tar writes the archive holding bad UTF-8");
		is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_INVALID,
		       "refuse an archive holding bad UTF-8");
		ok(strstr(eb.msg, "bad.tar.gz:in.txt") && strstr(eb.msg, "offset 10"),
		   "naming archive and entry: %s", eb.msg);
	} else {
		skip(3, "no tar command (Debian package tar)");
	}

	/* Corrupt archives. */
	snprintf(p, sizeof p, "%s/corpus.tar.gz", root);
	FILE *f = fopen(p, "rb");
	static unsigned char abuf[1 << 20];
	size_t alen = f ? fread(abuf, 1, sizeof abuf, f) : 0;
	if (f)
		fclose(f);
	snprintf(p2, sizeof p2, "%s/truncated.tar.gz", root);
	write_file(p2, abuf, alen / 2);
	in[0] = p2;
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_CORRUPT, "refuse a truncated .tar.gz");
	ok(strstr(eb.msg, "truncated.tar.gz") != NULL, "naming it: %s", eb.msg);
	ok(strstr(eb.hint, "nothing was imported") != NULL, "with a hint: %s", eb.hint);
	abuf[alen / 2] ^= 0x55;
	abuf[alen / 2 + 1] ^= 0x55;
	snprintf(p2, sizeof p2, "%s/flipped.tar.gz", root);
	write_file(p2, abuf, alen);
	/* Damaged deflate data fails either on decompression, on the gzip CRC,
	 * or as bytes that are not UTF-8, whichever comes first. */
	cot_err rc = ds_import(store, "tiny", 4096, in, 1, &r, &eb);
	ok(rc == COT_ERR_CORRUPT || rc == COT_ERR_INVALID, "refuse a .tar.gz with damaged bytes");
	ok(strstr(eb.msg, "flipped.tar.gz") != NULL, "naming it: %s", eb.msg);
	snprintf(p2, sizeof p2, "%s/garbage.zip", root);
	write_file(p2, "this is not a zip file at all, just text\n", 41);
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_CORRUPT,
	       "refuse a .zip that is not one");
	ok(strstr(eb.msg, "garbage.zip") != NULL, "naming it: %s", eb.msg);
	snprintf(p, sizeof p, "%s/corpus.tar", root);
	f = fopen(p, "rb");
	alen = f ? fread(abuf, 1, sizeof abuf, f) : 0;
	if (f)
		fclose(f);
	/* One letter changed inside a .tar.gz whose deflate blocks are stored
	 * (level 0): every block still decodes, to other text; only the gzip
	 * CRC-32, at the end of the stream, tells. */
	snprintf(p2, sizeof p2, "%s/stored.tar.gz", root);
	gzFile gz = gzopen(p2, "wb0");
	ok(gz && gzwrite(gz, abuf, (unsigned)alen) == (int)alen && gzclose(gz) == Z_OK,
	   "a .tar.gz with stored deflate blocks");
	static unsigned char sbuf[1 << 20];
	f = fopen(p2, "rb");
	size_t slen = f ? fread(sbuf, 1, sizeof sbuf, f) : 0;
	if (f)
		fclose(f);
	size_t at = slen / 2;
	while (at < slen && !(sbuf[at] >= 'a' && sbuf[at] <= 'y'))
		at++;
	ok(at < slen, "a letter in the middle of its stored text (offset %zu of %zu)", at, slen);
	if (at < slen)
		sbuf[at]++; /* still a letter, still valid UTF-8 */
	snprintf(p2, sizeof p2, "%s/letter.tar.gz", root);
	write_file(p2, sbuf, slen);
	in[0] = p2;
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_CORRUPT,
	       "refuse a .tar.gz whose text differs from its CRC-32");
	ok(strstr(eb.msg, "letter.tar.gz") && strstr(eb.msg, "gzip"), "naming it and the check: %s", eb.msg);
	memset(abuf + 512 + 148, 'Z', 8); /* the checksum of the first file's header */
	snprintf(p2, sizeof p2, "%s/badsum.tar", root);
	write_file(p2, abuf, alen);
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_CORRUPT,
	       "refuse a .tar with a damaged header");
	diag("%s", eb.msg);
	snprintf(p, sizeof p, "%s/corpus.zip", root);
	f = fopen(p, "rb");
	alen = f ? fread(abuf, 1, sizeof abuf, f) : 0;
	if (f)
		fclose(f);
	snprintf(p2, sizeof p2, "%s/truncated.zip", root);
	write_file(p2, abuf, alen * 2 / 3);
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_CORRUPT, "refuse a truncated .zip");
	diag("%s", eb.msg);
	ok(count_files(store) >= files_before, "refused imports reference nothing (store files may stay)");

	/* Other refusals. */
	snprintf(p, sizeof p, "%s/bad/empty", root);
	mkdir(p, 0755);
	snprintf(p2, sizeof p2, "%s/bad/empty/nothing.txt", root);
	write_file(p2, "", 0);
	in[0] = p;
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_INVALID,
	       "refuse a dataset without tokens");
	ok(strstr(eb.msg, "no tokens") != NULL, "message: %s", eb.msg);
	in[0] = src;
	is_int(ds_import(store, "bad name!", 4096, in, 1, &r, &eb), COT_ERR_INVALID,
	       "refuse a bad dataset name");
	is_int(ds_import(store, "tiny", 10, in, 1, &r, &eb), COT_ERR_INVALID, "refuse a tiny shard size");
	ok(strstr(eb.msg, "shard size") != NULL, "message: %s", eb.msg);
	snprintf(p, sizeof p, "%s/does-not-exist", root);
	in[0] = p;
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_NOT_FOUND, "refuse a missing input");
	ok(strstr(eb.msg, "does-not-exist") != NULL, "message: %s", eb.msg);
	in[0] = "/dev/null";
	is_int(ds_import(store, "tiny", 4096, in, 1, &r, &eb), COT_ERR_INVALID, "refuse a device");

	/* A damaged shard is caught by the reader. */
	char shard_path[PATH_MAX];
	fs_path(store, folder.shards[0].sha256, shard_path, sizeof shard_path, &eb);
	f = fopen(shard_path, "rb");
	alen = f ? fread(abuf, 1, sizeof abuf, f) : 0;
	if (f)
		fclose(f);
	abuf[alen / 2] ^= 1;
	snprintf(p2, sizeof p2, "%s/damaged-shard", root);
	write_file(p2, abuf, alen);
	shard_meta m;
	unsigned char *tok;
	ok(shard_read(p2, SHARD_TOKENS_MAX, &m, &tok, &eb) == COT_ERR_CORRUPT && tok == NULL,
	   "shard_read refuses a damaged shard: %s", eb.msg);
	is_int(shard_read(shard_path, 100, &m, &tok, &eb), COT_ERR_TOO_LARGE,
	       "shard_read bounds the tokens it accepts");

	check_heldout(want, want_len);
	check_wide_shards();
	ds_result_free(&folder);
	free(want);
	for (int i = 0; i < N_DOCS; i++)
		free(doc_text[i]);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	run(cmd);
	done_testing();
	return exit_status();
}
