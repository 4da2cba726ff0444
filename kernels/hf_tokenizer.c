/* cotrain kernels: a subword tokenizer in Hugging Face's layout (see
 * hf_tokenizer.h). */
#include "kernels/hf_tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/hf_gpt2.h"
#include "kernels/spm_proto.h"
#include "shared/common/hash.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static bool is_special_name(const spm_proto_piece *p)
{
	return p->len >= 2 && p->piece[0] == '[' && p->piece[p->len - 1] == ']';
}

static json_t *added_tokens(const spm_proto *pr)
{
	json_t *a = json_array();
	for (int i = 0; a && i < pr->n_pieces; i++) {
		const spm_proto_piece *p = &pr->pieces[i];
		if (p->type != SPM_T_UNKNOWN && p->type != SPM_T_CONTROL && p->type != SPM_T_USER)
			continue;
		json_t *t = json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", p->piece,
		                      p->len, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
		                      "special", p->type != SPM_T_USER || is_special_name(p));
		if (!t || json_array_append_new(a, t) != 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static json_t *normalizer(const spm_proto *pr)
{
	if (pr->charsmap_len == 0)
		return json_null(); /* the identity rule */
	size_t cap = 4 * ((pr->charsmap_len + 2) / 3) + 1;
	char *b64 = malloc(cap);
	if (!b64 || hash_b64_encode(pr->charsmap, pr->charsmap_len, b64, cap) < 0) {
		free(b64);
		return NULL;
	}
	json_t *n = json_pack("{s:s, s:s}", "type", "Precompiled", "precompiled_charsmap", b64);
	free(b64);
	return n;
}

static json_t *metaspace(const spm_proto *pr)
{
	/* SentencePiece puts the dummy space before the text only, not after
	 * each added token: prepend_scheme "first". */
	return json_pack("{s:s, s:s, s:b, s:s}", "type", "Metaspace", "replacement", SPACE_MARK,
	                 "add_prefix_space", pr->add_dummy_prefix, "prepend_scheme",
	                 pr->add_dummy_prefix ? "first" : "never");
}

static json_t *special_ref(const char *name, int type_id)
{
	return json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", name, "type_id", type_id);
}

static json_t *seq_ref(const char *name, int type_id)
{
	return json_pack("{s:{s:s, s:i}}", "Sequence", "id", name, "type_id", type_id);
}

static json_t *post_processor(const spm_model *m)
{
	int cls = spm_piece_id(m, "[CLS]"), sep = spm_piece_id(m, "[SEP]");
	if (cls < 0 || sep < 0)
		return json_null();
	return json_pack("{s:s, s:[o,o,o], s:[o,o,o,o,o], s:{s:{s:s, s:[i], s:[s]}, s:{s:s, s:[i], s:[s]}}}",
	                 "type", "TemplateProcessing", "single", special_ref("[CLS]", 0), seq_ref("A", 0),
	                 special_ref("[SEP]", 0), "pair", special_ref("[CLS]", 0), seq_ref("A", 0),
	                 special_ref("[SEP]", 0), seq_ref("B", 1), special_ref("[SEP]", 1), "special_tokens",
	                 "[CLS]", "id", "[CLS]", "ids", cls, "tokens", "[CLS]", "[SEP]", "id", "[SEP]", "ids",
	                 sep, "tokens", "[SEP]");
}

static json_t *unigram_model(const spm_proto *pr)
{
	json_t *vocab = json_array();
	for (int i = 0; vocab && i < pr->n_pieces; i++) {
		const spm_proto_piece *p = &pr->pieces[i];
		json_t *e = json_pack("[s%, f]", p->piece, p->len, (double)p->score);
		if (!e || json_array_append_new(vocab, e) != 0) {
			json_decref(vocab);
			return NULL;
		}
	}
	return vocab ? json_pack("{s:s, s:i, s:o, s:b}", "type", "Unigram", "unk_id", pr->unk_id, "vocab",
	                         vocab, "byte_fallback", pr->byte_fallback)
	             : NULL;
}

typedef struct {
	int rank, left, right;
} merge;

static int cmp_merge(const void *a, const void *b)
{
	const merge *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->left != y->left)
		return x->left < y->left ? -1 : 1;
	return (x->right > y->right) - (x->right < y->right);
}

/* The merges of a SentencePiece BPE: every split of a normal piece into two
 * pieces of the vocabulary, ranked by the merged piece's id (then by the
 * parts' ids), as transformers' SentencePieceExtractor lists them. */
static json_t *bpe_merges(const spm_model *m, const spm_proto *pr)
{
	size_t cap = 1024, n = 0;
	merge *v = malloc(cap * sizeof *v);
	char buf[SPM_SPECIAL_LEN_MAX * 8 + 256];
	for (int i = 0; v && i < pr->n_pieces; i++) {
		const spm_proto_piece *p = &pr->pieces[i];
		if (p->type != SPM_T_NORMAL || p->len >= sizeof buf)
			continue;
		for (size_t k = 1; v && k < p->len; k++) {
			if (((unsigned char)p->piece[k] & 0xC0) == 0x80)
				continue; /* inside a character */
			memcpy(buf, p->piece, k);
			buf[k] = '\0';
			int l = spm_piece_id(m, buf);
			memcpy(buf, p->piece + k, p->len - k);
			buf[p->len - k] = '\0';
			int r = spm_piece_id(m, buf);
			if (l < 0 || r < 0 || pr->pieces[l].type != SPM_T_NORMAL ||
			    pr->pieces[r].type != SPM_T_NORMAL)
				continue;
			if (n == cap) {
				merge *w = realloc(v, 2 * cap * sizeof *v);
				if (!w) {
					free(v);
					v = NULL;
					break;
				}
				v = w;
				cap *= 2;
			}
			v[n++] = (merge){ i, l, r };
		}
	}
	if (!v)
		return NULL;
	qsort(v, n, sizeof *v, cmp_merge);
	json_t *a = json_array();
	for (size_t j = 0; a && j < n; j++) {
		const spm_proto_piece *l = &pr->pieces[v[j].left], *r = &pr->pieces[v[j].right];
		char *s = malloc(l->len + r->len + 2);
		if (!s) {
			json_decref(a);
			a = NULL;
			break;
		}
		memcpy(s, l->piece, l->len);
		s[l->len] = ' ';
		memcpy(s + l->len + 1, r->piece, r->len);
		s[l->len + 1 + r->len] = '\0';
		if (json_array_append_new(a, json_string(s)) != 0) {
			json_decref(a);
			a = NULL;
		}
		free(s);
	}
	free(v);
	return a;
}

static json_t *bpe_model(const spm_model *m, const spm_proto *pr)
{
	json_t *vocab = json_object();
	for (int i = 0; vocab && i < pr->n_pieces; i++) {
		char *s = strndup(pr->pieces[i].piece, pr->pieces[i].len);
		if (!s || json_object_set_new(vocab, s, json_integer(i)) != 0) {
			json_decref(vocab);
			vocab = NULL;
		}
		free(s);
	}
	json_t *merges = vocab ? bpe_merges(m, pr) : NULL;
	if (!merges) {
		json_decref(vocab);
		return NULL;
	}
	const spm_proto_piece *unk = &pr->pieces[pr->unk_id];
	return json_pack("{s:s, s:n, s:s%, s:n, s:n, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
	                 "unk_token", unk->piece, unk->len, "continuing_subword_prefix", "end_of_word_suffix",
	                 "fuse_unk", 1, "byte_fallback", pr->byte_fallback, "vocab", vocab, "merges", merges);
}

cot_err hf_tokenizer_json(const spm_model *m, json_t **out, cot_errbuf *eb)
{
	*out = NULL;
	size_t len;
	const unsigned char *bytes = spm_bytes(m, &len);
	spm_proto pr;
	cot_err rc = spm_proto_parse(bytes, len, &pr, eb);
	if (rc)
		return rc;
	if (pr.model_type != SPM_M_UNIGRAM && pr.model_type != SPM_M_BPE) {
		int type = pr.model_type;
		spm_proto_free(&pr);
		return cot_seterr(eb, COT_ERR_UNSUPPORTED, "tokenizer model type %d is not Unigram or BPE",
		                  type);
	}
	if (pr.unk_id < 0 || pr.unk_id >= pr.n_pieces) {
		spm_proto_free(&pr);
		return cot_seterr(eb, COT_ERR_CORRUPT, "tokenizer model has no unknown piece");
	}
	json_t *model = pr.model_type == SPM_M_BPE ? bpe_model(m, &pr) : unigram_model(&pr);
	json_t *t = json_pack("{s:s, s:n, s:n, s:o?, s:o?, s:o?, s:o?, s:o?, s:o?}", "version", "1.0",
	                      "truncation", "padding", "added_tokens", added_tokens(&pr), "normalizer",
	                      normalizer(&pr), "pre_tokenizer", metaspace(&pr), "post_processor",
	                      post_processor(m), "decoder", metaspace(&pr), "model", model);
	/* A part that could not be made (NULL, left out by "o?") is an
	 * allocation failure: the whole object is refused. */
	static const char *const parts[] = { "added_tokens",   "normalizer", "pre_tokenizer",
		                             "post_processor", "decoder",    "model" };
	for (size_t i = 0; t && i < sizeof parts / sizeof parts[0]; i++)
		if (!json_object_get(t, parts[i])) {
			json_decref(t);
			t = NULL;
		}
	spm_proto_free(&pr);
	if (!t)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for tokenizer.json");
	*out = t;
	return COT_OK;
}

static cot_err write_json(const char *dir, const char *name, json_t *obj, cot_errbuf *eb)
{
	char *s = obj ? json_dumps(obj, JSON_INDENT(1) | JSON_REAL_PRECISION(9) | JSON_ENSURE_ASCII) : NULL;
	json_decref(obj);
	if (!s)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for \"%s\"", name);
	cot_err rc = hf_write_file(dir, name, s, strlen(s), eb);
	free(s);
	return rc;
}

/* tokenizer_config.json: transformers' AlbertTokenizer reads spiece.model
 * with these settings (SentencePiece itself lowercases under nfkc_cf, so
 * the Python side must not lowercase again; accents are always kept). */
static json_t *config_json(const spm_model *m, int model_max_length)
{
	json_t *c = json_pack("{s:s, s:i, s:b, s:b, s:b}", "tokenizer_class", "AlbertTokenizer",
	                      "model_max_length", model_max_length, "do_lower_case", 0, "remove_space", 0,
	                      "keep_accents", 1);
	static const char *const roles[][2] = { { "unk_token", "[UNK]" },
		                                { "pad_token", "[PAD]" },
		                                { "cls_token", "[CLS]" },
		                                { "sep_token", "[SEP]" },
		                                { "mask_token", "[MASK]" } };
	for (size_t i = 0; c && i < sizeof roles / sizeof roles[0]; i++)
		if (spm_piece_id(m, roles[i][1]) >= 0 &&
		    json_object_set_new(c, roles[i][0], json_string(roles[i][1])))
			return json_decref(c), NULL;
	return c;
}

/* special_tokens_map.json: the same roles, for the loaders that read the
 * special tokens from it rather than from tokenizer_config.json. */
static json_t *special_map_json(const spm_model *m)
{
	json_t *c = config_json(m, 0), *map = json_object();
	static const char *const keep[] = { "unk_token", "pad_token", "cls_token", "sep_token",
		                            "mask_token" };
	for (size_t i = 0; c && map && i < sizeof keep / sizeof keep[0]; i++) {
		json_t *v = json_object_get(c, keep[i]);
		if (v && json_object_set(map, keep[i], v)) {
			json_decref(map);
			map = NULL;
		}
	}
	json_decref(c);
	if (!c) {
		json_decref(map);
		return NULL;
	}
	return map;
}

cot_err hf_tokenizer_write(const spm_model *m, const char *dir, int model_max_length, cot_errbuf *eb)
{
	json_t *t;
	cot_err rc = hf_tokenizer_json(m, &t, eb);
	if (rc)
		return rc;
	rc = write_json(dir, "tokenizer.json", t, eb);
	if (!rc)
		rc = write_json(dir, "tokenizer_config.json", config_json(m, model_max_length), eb);
	if (!rc)
		rc = write_json(dir, "special_tokens_map.json", special_map_json(m), eb);
	size_t len;
	const unsigned char *bytes = spm_bytes(m, &len);
	if (!rc)
		rc = hf_write_file(dir, "spiece.model", bytes, len, eb);
	return rc;
}
