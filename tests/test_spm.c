/* cotrain tests: the SentencePiece shim (kernels/spm.h), its model reader
 * (kernels/spm_proto.h) and the tokenizer.json writer
 * (kernels/hf_tokenizer.h), on real text: the repository's own doc/ pages.
 *
 * Training twice on the same text with the same options gives the same
 * model bytes; encode then decode gives the corpus back byte for byte; the
 * special pieces are found by name; hostile options, models and ids are
 * refused with an error, never a crash. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hf_tokenizer.h"
#include "kernels/spm.h"
#include "kernels/spm_proto.h"
#include "tests/tap.h"

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every doc/ page ending in .md, in name order, joined by blank lines,
 * SentencePiece's space mark replaced (below). */
static char *read_corpus(size_t *len)
{
	const char *src = getenv("top_srcdir");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/doc", src ? src : ".");
	DIR *d = opendir(dir);
	if (!d)
		bail_out("cannot open %s", dir);
	char *names[256];
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) && n < 256)
		if (strlen(de->d_name) > 3 && !strcmp(de->d_name + strlen(de->d_name) - 3, ".md"))
			names[n++] = strdup(de->d_name);
	closedir(d);
	qsort(names, (size_t)n, sizeof *names, cmp_name);
	char *text = NULL;
	*len = 0;
	for (int i = 0; i < n; i++) {
		char path[8192];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		FILE *f = fopen(path, "rb");
		if (!f)
			bail_out("cannot open %s", path);
		fseek(f, 0, SEEK_END);
		long sz = ftell(f);
		rewind(f);
		text = realloc(text, *len + (size_t)sz + 3);
		if (*len) {
			memcpy(text + *len, "\n\n", 2);
			*len += 2;
		}
		if (fread(text + *len, 1, (size_t)sz, f) != (size_t)sz)
			bail_out("cannot read %s", path);
		*len += (size_t)sz;
		fclose(f);
		free(names[i]);
	}
	text[*len] = '\0';
	/* SentencePiece's own space mark U+2581 (which doc/model.md quotes in
	 * pieces such as "\u2581the") decodes as a space by design, so no text
	 * holding it can round-trip: each becomes '_' (doc/dataset.md). */
	size_t w = 0;
	for (size_t r = 0; r < *len; r++) {
		if (r + 2 < *len && !memcmp(text + r, "\xe2\x96\x81", 3)) {
			text[w++] = '_';
			r += 2;
		} else {
			text[w++] = text[r];
		}
	}
	*len = w;
	text[w] = '\0';
	return text;
}

static const char *const SPECIAL[] = { "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]" };

static unsigned char *train(const char *text, size_t len, spm_type type, int vocab, unsigned norm,
                            size_t *out_len)
{
	spm_train_opts o = {
		.type = type, .vocab = vocab, .normalize = norm, .special = SPECIAL, .n_special = 5
	};
	unsigned char *m = NULL;
	cot_errbuf eb = { "", "" };
	cot_err rc = spm_train(text, len, &o, &m, out_len, &eb);
	if (rc)
		diag("spm_train: %s", eb.msg);
	return m;
}

static void check_model(const char *tag, const char *text, size_t len, spm_type type)
{
	size_t n1 = 0, n2 = 0;
	unsigned char *a = train(text, len, type, 2000, 0, &n1);
	unsigned char *b = train(text, len, type, 2000, 0, &n2);
	ok(a && b && n1 > 1000 && n1 == n2 && memcmp(a, b, n1) == 0,
	   "%s: two trainings on the same text give the same %zu model bytes", tag, n1);
	size_t n3 = 0;
	unsigned char *c = train(text, len, type, 2000, SPM_NORM_NFKC | SPM_NORM_LOWERCASE, &n3);
	ok(c && (n3 != n1 || memcmp(a, c, n1) != 0), "%s: another normalisation gives another model", tag);
	free(b);
	free(c);

	spm_model *m = NULL;
	cot_errbuf eb = { "", "" };
	if (!ok(a && spm_load(a, n1, &m, &eb) == COT_OK, "%s: the model loads (%s)", tag, eb.msg))
		bail_out("cannot go on without a model");
	is_int(spm_vocab_size(m), 2000, "%s: vocabulary size", tag);
	int ids[5];
	bool distinct = true;
	for (int i = 0; i < 5; i++) {
		ids[i] = spm_piece_id(m, SPECIAL[i]);
		for (int j = 0; j < i; j++)
			distinct = distinct && ids[i] != ids[j];
		if (!(ids[i] >= 0 && spm_piece(m, ids[i]) && !strcmp(spm_piece(m, ids[i]), SPECIAL[i])))
			distinct = false;
	}
	ok(distinct, "%s: [CLS] %d, [SEP] %d, [MASK] %d, [PAD] %d, [UNK] %d: distinct ids with their names",
	   tag, ids[0], ids[1], ids[2], ids[3], ids[4]);
	is_int(spm_piece_id(m, "[NOPE]"), -1, "%s: an unknown piece has no id", tag);
	ok(spm_piece(m, -1) == NULL && spm_piece(m, 2000) == NULL, "%s: no piece outside the vocabulary",
	   tag);

	int32_t *tok = NULL;
	size_t nt = 0;
	cot_err rc = spm_encode(m, text, len, &tok, &nt, &eb);
	ok(rc == COT_OK && nt > 0 && nt < len / 2,
	   "%s: the corpus of %zu bytes encodes to %zu tokens (%.2f bytes a token)", tag, len, nt,
	   nt ? (double)len / (double)nt : 0.0);
	char *back = NULL;
	size_t nb = 0;
	rc = tok ? spm_decode(m, tok, nt, &back, &nb, &eb) : COT_ERR_INVALID;
	size_t same = 0;
	while (back && same < nb && same < len && back[same] == text[same])
		same++;
	if (!ok(rc == COT_OK && nb == len && same == len,
	        "%s: decoding gives the corpus back byte for byte (%zu of %zu bytes)", tag, nb, len))
		diag("first difference at byte %zu: \"%.40s\" where the corpus has \"%.40s\"", same,
		     back ? back + same : "", text + same);
	free(back);
	free(tok);

	tok = NULL;
	const char *masked = "the [MASK] of the project";
	bool has_mask = false;
	if (spm_encode(m, masked, strlen(masked), &tok, &nt, &eb) == COT_OK)
		for (size_t i = 0; i < nt; i++)
			has_mask = has_mask || tok[i] == ids[2];
	ok(has_mask, "%s: \"[MASK]\" typed in text encodes to the mask id %d", tag, ids[2]);
	free(tok);

	int32_t bad[2] = { 5, 2000 };
	back = NULL;
	ok(spm_decode(m, bad, 2, &back, &nb, &eb) == COT_ERR_INVALID && strstr(eb.msg, "position 1") && !back,
	   "%s: decoding an id out of range is refused: %s", tag, eb.msg);

	json_t *t = NULL;
	eb.msg[0] = '\0';
	ok(hf_tokenizer_json(m, &t, &eb) == COT_OK && t, "%s: tokenizer.json is made (%s)", tag, eb.msg);
	json_t *model = json_object_get(t, "model");
	if (type == SPM_UNIGRAM) {
		json_t *v = json_object_get(model, "vocab");
		bool in_order = json_array_size(v) == 2000;
		for (int i = 0; in_order && i < 2000; i++)
			in_order = !strcmp(json_string_value(json_array_get(json_array_get(v, (size_t)i), 0)),
			                   spm_piece(m, i));
		ok(in_order, "%s: tokenizer.json's Unigram vocab lists the 2000 pieces in id order", tag);
	} else {
		json_t *v = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
		bool good = json_object_size(v) == 2000 && json_array_size(merges) > 100;
		for (size_t i = 0; good && i < json_array_size(merges); i++) {
			char buf[512];
			snprintf(buf, sizeof buf, "%s", json_string_value(json_array_get(merges, i)));
			char *sp = strchr(buf, ' ');
			if (!sp)
				good = false;
			else
				memmove(sp, sp + 1, strlen(sp));
			good = good && spm_piece_id(m, buf) >= 0;
		}
		ok(good, "%s: tokenizer.json's BPE has 2000 pieces and %zu merges, each making a piece", tag,
		   json_array_size(merges));
	}
	json_t *st = json_object_get(json_object_get(t, "post_processor"), "special_tokens");
	is_int(json_integer_value(json_array_get(json_object_get(json_object_get(st, "[SEP]"), "ids"), 0)),
	       ids[1], "%s: the post-processor's [SEP] is id %d", tag, ids[1]);
	json_decref(t);

	spm_proto pr;
	ok(spm_proto_parse(a, n1 / 2, &pr, &eb) == COT_ERR_CORRUPT, "%s: half a model is refused: %s", tag,
	   eb.msg);
	spm_free(m);
	free(a);
}

static void check_hostile(const char *text, size_t len)
{
	cot_errbuf eb = { "", "" };
	unsigned char *m = NULL;
	size_t n = 0;
	spm_train_opts o = { .type = SPM_UNIGRAM, .vocab = 100000, .special = SPECIAL, .n_special = 5 };
	ok(spm_train(text, len < 4000 ? len : 4000, &o, &m, &n, &eb) == COT_ERR_INVALID && !m &&
	           strstr(eb.msg, "cannot train") && strstr(eb.msg, "too high") && eb.hint[0],
	   "a vocabulary larger than the text allows is refused: %s (%s)", eb.msg, eb.hint);
	o.vocab = 3;
	ok(spm_train(text, len, &o, &m, &n, &eb) == COT_ERR_INVALID && !m, "vocabulary 3 is refused: %s",
	   eb.msg);
	o.vocab = 100;
	ok(spm_train("\n\n\n", 3, &o, &m, &n, &eb) == COT_ERR_INVALID && !m, "no text at all is refused: %s",
	   eb.msg);
	spm_model *sm = NULL;
	ok(spm_load("not a model", 11, &sm, &eb) == COT_ERR_CORRUPT && !sm, "bytes that are no model: %s",
	   eb.msg);

	char buf[256];
	const char *sp[SPM_SPECIAL_MAX];
	int ns;
	static const char *const bad_special[] = { "[CLS],,[SEP]", "[CLS],[CLS]", "[A B]", "[\xc3\xa9]",
		                                   "[ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789]" };
	for (size_t i = 0; i < sizeof bad_special / sizeof *bad_special; i++)
		ok(spm_parse_special(bad_special[i], buf, sp, &ns, &eb) == COT_ERR_INVALID,
		   "special tokens \"%s\" are refused: %s", bad_special[i], eb.msg);
	ok(spm_parse_special("[CLS],[SEP],[MASK]", buf, sp, &ns, &eb) == COT_OK && ns == 3 &&
	           !strcmp(sp[2], "[MASK]"),
	   "three special tokens parse");
	unsigned fl;
	ok(spm_parse_normalize("nfkc,upper", &fl, &eb) == COT_ERR_INVALID, "unknown normalisation: %s",
	   eb.msg);
	ok(spm_parse_normalize("lowercase", &fl, &eb) == COT_ERR_INVALID, "lowercase without nfkc: %s",
	   eb.msg);
	ok(spm_parse_normalize("keep-accents,nfkc,lowercase", &fl, &eb) == COT_OK &&
	           fl == (SPM_NORM_NFKC | SPM_NORM_LOWERCASE | SPM_NORM_KEEP_ACCENTS),
	   "all three normalisations parse");
}

int main(void)
{
	plan_lazy();
	size_t len;
	char *text = read_corpus(&len);
	diag("corpus: doc/*.md, %zu bytes", len);
	check_model("unigram", text, len, SPM_UNIGRAM);
	check_model("bpe", text, len, SPM_BPE);
	check_hostile(text, len);
	free(text);
	done_testing();
	return exit_status();
}
