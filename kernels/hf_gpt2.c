/* cotrain kernels: the model in Hugging Face's GPT-2 layout (hf_gpt2.h). */
#include "kernels/hf_gpt2.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/checkpoint.h"
#include "kernels/hf_albert.h"
#include "kernels/layernorm.h"
#include "kernels/safetensors.h"
#include "kernels/tokenizer.h"
#include "shared/common/json.h"

/* Views per parameter set, in kern_param_views order (model.c). */
enum { SET_VIEWS = 12 };

/* ---- writing ------------------------------------------------------------ */

cot_err hf_write_file(const char *dir, const char *name, const void *buf, size_t len, cot_errbuf *eb)
{
	char tmp[4096], path[4096];
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
	    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= (int)sizeof tmp)
		return cot_seterr(eb, COT_ERR_INVALID, "path \"%s/%s\" is too long", dir, name);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create file \"%s\": %s", tmp, strerror(errno));
	const char *p = buf;
	size_t left = len;
	while (left > 0) {
		ssize_t k = write(fd, p, left);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		p += k;
		left -= (size_t)k;
	}
	int err = left > 0 || fsync(fd) != 0 ? errno : 0;
	if (close(fd) != 0 && !err)
		err = errno;
	if (!err && rename(tmp, path) != 0)
		err = errno;
	if (err) {
		unlink(tmp);
		return cot_seterr(eb, COT_ERR_IO, "could not write file \"%s\": %s", path,
		                  strerror(err ? err : EIO));
	}
	return COT_OK;
}

cot_err hf_write_json(const char *dir, const char *name, json_t *obj, cot_errbuf *eb)
{
	char *s = obj ? json_dumps(obj, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
	json_decref(obj);
	if (!s)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for \"%s\"", name);
	size_t n = strlen(s);
	char *t = realloc(s, n + 2);
	if (!t) {
		free(s);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for \"%s\"", name);
	}
	t[n] = '\n';
	t[n + 1] = '\0';
	cot_err rc = hf_write_file(dir, name, t, n + 1, eb);
	free(t);
	return rc;
}

static json_t *config_json(const kern_config *c)
{
	return json_pack("{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:b, s:f, s:f, "
	                 "s:f, s:b, s:b, s:i, s:i, s:b, s:s, s:f, s:s}",
	                 "model_type", "gpt2", "architectures", "GPT2LMHeadModel", "vocab_size", c->vocab,
	                 "n_positions", c->seq_len, "n_ctx", c->seq_len, "n_embd", c->d_model, "n_layer",
	                 c->n_layer, "n_head", c->n_head, "n_inner", c->d_ff, "cotrain_n_shared", c->n_shared,
	                 "layer_norm_epsilon", 1e-5, "activation_function", "gelu_new", "tie_word_embeddings",
	                 1, "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0, "scale_attn_weights", 1,
	                 "scale_attn_by_inverse_layer_idx", 0, "bos_token_id", HF_EOS_TOKEN, "eos_token_id",
	                 HF_EOS_TOKEN, "use_cache", 1, "torch_dtype", "float32", "initializer_range", 0.02,
	                 "cotrain_tokenizer", TOK_NAME);
}

/* GPT-2's bytes_to_unicode: the printable character standing for byte b in
 * a byte-level vocabulary, as UTF-8 into out (at least 3 bytes, NUL ended). */
static void byte_char(int b, char out[4])
{
	int cp;
	if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
		cp = b;
	} else { /* the others, in byte order, from U+0100 on */
		int n = 0;
		for (int x = 0; x < b; x++)
			if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = '\0';
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		out[2] = '\0';
	}
}

/* tokenizer.json: a BPE without merges over the 256 byte characters, with
 * ByteLevel pre-tokenizer and decoder, so that token id = byte value. */
static json_t *tokenizer_json(void)
{
	json_t *vocab = json_object();
	for (int b = 0; vocab && b < 256; b++) {
		char ch[4];
		byte_char(b, ch);
		if (json_object_set_new(vocab, ch, json_integer(b)) != 0) {
			json_decref(vocab);
			return NULL;
		}
	}
	if (!vocab)
		return NULL;
	const char *bl = "{s:s, s:b, s:b, s:b}";
	return json_pack("{s:s, s:n, s:n, s:[], s:n, s:o, s:n, s:o, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, "
	                 "s:o, s:[]}}",
	                 "version", "1.0", "truncation", "padding", "added_tokens", "normalizer",
	                 "pre_tokenizer",
	                 json_pack(bl, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
	                           "use_regex", 0),
	                 "post_processor", "decoder",
	                 json_pack(bl, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
	                           "use_regex", 0),
	                 "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
	                 "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges");
}

static json_t *tokenizer_config_json(const kern_config *c)
{
	char eos[4];
	byte_char(HF_EOS_TOKEN, eos);
	return json_pack("{s:s, s:i, s:s, s:s, s:b, s:s}", "tokenizer_class", "PreTrainedTokenizerFast",
	                 "model_max_length", c->seq_len, "bos_token", eos, "eos_token", eos,
	                 "add_prefix_space", 0, "cotrain_tokenizer", "byte: token = byte value, 0..255");
}

cot_err hf_write(const kern_model *m, const char *dir, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	if (c->arch != KERN_ARCH_GPT)
		return hf_encoder_write(m, dir, eb);
	st_writer *w;
	cot_err rc = st_writer_new(&w, eb);
	if (rc)
		return rc;
	rc = st_writer_meta(w, "format", "pt", eb);
	char name[ST_NAME_MAX + 1];
	int64_t shape[2];
	const kern_view *v = m->views;
	for (int i = 0; !rc && i < m->n_views; i++) {
		if (i >= 2 && i < 2 + SET_VIEWS * c->n_shared)
			continue; /* the blocks, below */
		snprintf(name, sizeof name, "%s%s", v[i].name, i < 2 ? ".weight" : "");
		for (int d = 0; d < v[i].ndim; d++)
			shape[d] = v[i].shape[d];
		rc = st_writer_add(w, name, ST_F32, v[i].ndim, shape, m->params + v[i].offset, eb);
	}
	for (int l = 0; !rc && l < c->n_layer; l++) {
		int s = kern_layer_set(c, l);
		for (int k = 0; !rc && k < SET_VIEWS; k++) {
			const kern_view *sv = &v[2 + SET_VIEWS * s + k];
			const char *rest = strchr(strchr(sv->name, '.') + 1, '.') + 1; /* "h.<s>." */
			snprintf(name, sizeof name, "h.%d.%s", l, rest);
			for (int d = 0; d < sv->ndim; d++)
				shape[d] = sv->shape[d];
			rc = st_writer_add(w, name, ST_F32, sv->ndim, shape, m->params + sv->offset, eb);
		}
	}
	char path[4096];
	if (!rc && snprintf(path, sizeof path, "%s/" HF_WEIGHTS_FILE, dir) >= (int)sizeof path)
		rc = cot_seterr(eb, COT_ERR_INVALID, "folder name \"%s\" is too long", dir);
	if (!rc)
		rc = st_writer_write(w, path, eb);
	st_writer_free(w);
	if (!rc)
		rc = hf_write_json(dir, HF_CONFIG_FILE, config_json(c), eb);
	if (!rc)
		rc = hf_write_json(dir, "tokenizer.json", tokenizer_json(), eb);
	if (!rc)
		rc = hf_write_json(dir, "tokenizer_config.json", tokenizer_config_json(c), eb);
	if (!rc)
		rc = hf_sync_dir(dir, eb);
	return rc;
}

cot_err hf_sync_dir(const char *dir, cot_errbuf *eb)
{
	cot_err rc = COT_OK;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0)
		rc = cot_seterr(eb, COT_ERR_IO, "could not sync folder \"%s\": %s", dir, strerror(errno));
	if (fd >= 0)
		close(fd);
	return rc;
}

/* ---- reading ------------------------------------------------------------ */

/* dir/config.json, parsed, into *out (caller decrefs). */
static cot_err read_config(const char *dir, json_t **out, cot_errbuf *eb)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/" HF_CONFIG_FILE, dir) >= (int)sizeof path)
		return cot_seterr(eb, COT_ERR_INVALID, "folder name \"%s\" is too long", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open \"%s\": %s", path, strerror(errno));
	char *buf = malloc(HF_CONFIG_MAX + 1);
	size_t n = 0;
	cot_err rc = buf ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	while (!rc && n <= HF_CONFIG_MAX) {
		ssize_t k = read(fd, buf + n, HF_CONFIG_MAX + 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			rc = cot_seterr(eb, COT_ERR_IO, "could not read \"%s\": %s", path, strerror(errno));
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	if (!rc && n > HF_CONFIG_MAX)
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "\"%s\" is larger than %u bytes", path, HF_CONFIG_MAX);
	if (!rc) {
		cot_errbuf d = { "", "" };
		if (cot_json_parse_object(buf, n, out, &d))
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "cannot read \"%s\": %s", path, d.msg);
	}
	free(buf);
	return rc;
}

/* The kern_config of a GPT-2 config.json, refusing what this model does not
 * compute exactly. */
static cot_err parse_config(const json_t *j, kern_config *c, cot_errbuf *eb)
{
	const char *s = NULL;
	cot_err rc = cot_json_str(j, "model_type", true, 1, 64, &s, eb);
	if (rc)
		return rc;
	if (strcmp(s, "gpt2") != 0)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED, "its model_type is \"%s\", not \"gpt2\"", s);
	long long x;
#define INT(key, field, lo, hi, req) \
	if ((rc = cot_json_int(j, key, req, lo, hi, &x, eb))) \
		return rc; \
	c->field = (int)x;
	x = 0;
	INT("n_layer", n_layer, 1, KERN_MAX_LAYERS, true)
	INT("n_head", n_head, 1, KERN_MAX_DIM, true)
	INT("n_embd", d_model, 1, KERN_MAX_DIM, true)
	INT("n_positions", seq_len, 1, KERN_MAX_SEQ, true)
	INT("vocab_size", vocab, 2, KERN_MAX_VOCAB, true)
	x = 4LL * c->d_model;
	if (json_is_null(json_object_get(j, "n_inner")))
		c->d_ff = (int)x;
	else {
		INT("n_inner", d_ff, 1, KERN_MAX_DIM, true)
	}
	x = c->n_layer;
	INT("cotrain_n_shared", n_shared, 1, c->n_layer, false)
#undef INT
	s = "gelu_new";
	if ((rc = cot_json_str(j, "activation_function", false, 1, 64, &s, eb)))
		return rc;
	if (strcmp(s, "gelu_new") != 0 && strcmp(s, "gelu_pytorch_tanh") != 0)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "its activation_function is \"%s\"; this model computes \"gelu_new\" "
		                  "(tanh GELU)",
		                  s);
	double eps = KERN_LN_EPS;
	if ((rc = cot_json_num(j, "layer_norm_epsilon", false, 0, 1, &eps, eb)))
		return rc;
	if (fabs(eps - (double)KERN_LN_EPS) > 1e-6 * (double)KERN_LN_EPS)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "its layer_norm_epsilon is %g; this model computes with %g", eps,
		                  (double)KERN_LN_EPS);
	static const struct {
		const char *key;
		bool want;
	} flags[] = { { "tie_word_embeddings", true },
		      { "scale_attn_weights", true },
		      { "scale_attn_by_inverse_layer_idx", false },
		      { "reorder_and_upcast_attn", false },
		      { "add_cross_attention", false } };
	for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
		bool b = flags[i].want;
		if ((rc = cot_json_bool(j, flags[i].key, false, &b, eb)))
			return rc;
		if (b != flags[i].want)
			return cot_seterr(eb, COT_ERR_UNSUPPORTED,
			                  "its %s is %s; this model computes only with %s", flags[i].key,
			                  b ? "true" : "false", flags[i].want ? "true" : "false");
	}
	cot_errbuf d = { "", "" };
	if (kern_config_validate(c, &d))
		return cot_seterr(eb, COT_ERR_CORRUPT, "its shape is invalid: %s", d.msg);
	return COT_OK;
}

/* The tensor name, or "transformer." name (transformers' save_pretrained). */
static const st_tensor *find(const st_file *f, const char *name)
{
	const st_tensor *t = st_find(f, name);
	if (!t) {
		char p[ST_NAME_MAX + 1];
		snprintf(p, sizeof p, "transformer.%s", name);
		t = st_find(f, p);
	}
	return t;
}

/* Check tensor name of f against view v: present, F32, v's shape, finite. */
static cot_err check_tensor(const st_file *f, const char *name, const kern_view *v, const st_tensor **out,
                            cot_errbuf *eb)
{
	const st_tensor *t = find(f, name);
	if (!t)
		return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" is missing", name);
	int same = t->dtype == ST_F32 && t->ndim == v->ndim && t->numel == v->numel;
	for (int d = 0; same && d < v->ndim; d++)
		same = t->shape[d] == v->shape[d];
	if (!same)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "tensor \"%s\" is %s with %d dimensions and %zu elements; expected F32 "
		                  "[%d%s%.0d]",
		                  name, st_dtype_name(t->dtype), t->ndim, t->numel, v->shape[0],
		                  v->ndim == 2 ? ", " : "", v->ndim == 2 ? v->shape[1] : 0);
	const unsigned char *p = t->data;
	for (size_t k = 0; k < t->numel; k++) {
		float x;
		memcpy(&x, p + 4 * k, 4);
		if (!isfinite(x))
			return cot_seterr(eb, COT_ERR_CORRUPT,
			                  "tensor \"%s\" holds a non-finite value at index %zu", name, k);
	}
	*out = t;
	return COT_OK;
}

/* Copy the tensors of f into m (made for f's config). */
static cot_err load_tensors(const st_file *f, kern_model *m, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	const kern_view *v = m->views;
	const st_tensor *t;
	char name[ST_NAME_MAX + 1];
	cot_err rc;
	for (int i = 0; i < m->n_views; i++) {
		if (i >= 2 && i < 2 + SET_VIEWS * c->n_shared)
			continue;
		snprintf(name, sizeof name, "%s%s", v[i].name, i < 2 ? ".weight" : "");
		if ((rc = check_tensor(f, name, &v[i], &t, eb)))
			return rc;
		memcpy(m->params + v[i].offset, t->data, t->nbytes);
	}
	for (int l = 0; l < c->n_layer; l++) {
		int s = kern_layer_set(c, l);
		int first = l == 0 || kern_layer_set(c, l - 1) != s;
		for (int k = 0; k < SET_VIEWS; k++) {
			const kern_view *sv = &v[2 + SET_VIEWS * s + k];
			const char *rest = strchr(strchr(sv->name, '.') + 1, '.') + 1;
			snprintf(name, sizeof name, "h.%d.%s", l, rest);
			if ((rc = check_tensor(f, name, sv, &t, eb)))
				return rc;
			if (first)
				memcpy(m->params + sv->offset, t->data, t->nbytes);
			else if (memcmp(m->params + sv->offset, t->data, t->nbytes) != 0)
				return cot_seterr(eb, COT_ERR_CORRUPT,
				                  "tensor \"%s\" differs from the same tensor of the layer "
				                  "before, "
				                  "which shares its parameter set (cotrain_n_shared %d)",
				                  name, c->n_shared);
		}
	}
	/* an untied head is another model */
	if ((t = find(f, "lm_head.weight"))) {
		if (t->dtype != ST_F32 || t->nbytes != v[0].numel * sizeof(float) ||
		    memcmp(t->data, m->params + v[0].offset, t->nbytes) != 0)
			return cot_seterr(eb, COT_ERR_UNSUPPORTED,
			                  "tensor \"lm_head.weight\" differs from \"wte.weight\"; this "
			                  "model's "
			                  "head is tied to the token embedding");
	}
	/* nothing else, except transformers' causal-mask buffers */
	for (size_t i = 0; i < st_count(f); i++) {
		const char *tn = st_tensor_at(f, i)->name, *b = tn;
		if (strncmp(b, "transformer.", 12) == 0)
			b += 12;
		size_t n = strlen(b);
		int known = strcmp(b, "lm_head.weight") == 0 || strcmp(b, "wte.weight") == 0 ||
		            strcmp(b, "wpe.weight") == 0 || strncmp(b, "ln_f.", 5) == 0;
		if (!known && strncmp(b, "h.", 2) == 0) {
			char *end;
			long l = strtol(b + 2, &end, 10);
			known = end != b + 2 && *end == '.' && l >= 0 && l < c->n_layer;
			if (known && ((n >= 10 && strcmp(b + n - 10, ".attn.bias") == 0) ||
			              (n >= 17 && strcmp(b + n - 17, ".attn.masked_bias") == 0)))
				continue; /* a buffer, not a parameter */
			if (known) {
				known = 0;
				for (int k = 0; k < SET_VIEWS && !known; k++)
					known = strcmp(end + 1, strchr(v[2 + k].name + 2, '.') + 1) == 0;
			}
		}
		if (!known)
			return cot_seterr(eb, COT_ERR_CORRUPT,
			                  "it holds tensor \"%.64s\", which GPT-2 of this config does not "
			                  "have",
			                  tn);
	}
	return COT_OK;
}

cot_err hf_load_new(const char *dir, int max_batch, kern_model **out, cot_errbuf *eb)
{
	*out = NULL;
	json_t *j = NULL;
	cot_errbuf d = { "", "" };
	cot_err rc = read_config(dir, &j, eb);
	if (rc)
		return rc;
	kern_config c;
	memset(&c, 0, sizeof c);
	rc = parse_config(j, &c, &d);
	json_decref(j);
	if (rc)
		return cot_seterr(eb, rc, "cannot load model \"%s\": %s", dir, d.msg);
	char path[4096];
	if (snprintf(path, sizeof path, "%s/" HF_WEIGHTS_FILE, dir) >= (int)sizeof path)
		return cot_seterr(eb, COT_ERR_INVALID, "folder name \"%s\" is too long", dir);
	st_file *f;
	if ((rc = st_open(path, &f, eb)))
		return rc;
	/* every parameter is in the file before a model of its size is made */
	if (st_count(f) < (size_t)(4 + SET_VIEWS * c.n_layer)) {
		st_close(f);
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "cannot load model \"%s\": \"%s\" holds %zu tensors, fewer than the %d "
		                  "of its config",
		                  dir, path, st_count(f), 4 + SET_VIEWS * c.n_layer);
	}
	kern_model *m;
	rc = kern_model_create(&c, max_batch, &m, eb);
	if (!rc && (rc = load_tensors(f, m, &d))) {
		cot_seterr(eb, rc, "cannot load model \"%s\": %s", dir, d.msg);
		kern_model_free(m);
	}
	st_close(f);
	if (!rc)
		*out = m;
	return rc;
}

cot_err hf_or_ckpt_load_new(const char *path, int max_batch, kern_model **out, cot_errbuf *eb)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return hf_load_new(path, max_batch, out, eb);
	return ckpt_load_new(path, max_batch, out, eb);
}
