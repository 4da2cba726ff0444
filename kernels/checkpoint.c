/* cotrain kernels: model checkpoints (see checkpoint.h for the format). */
#include "kernels/checkpoint.h"

#include "kernels/gpu.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/safetensors.h"
#include "kernels/tokenizer.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints store little-endian floats; this host is big-endian"
#endif

#define MAX_VIEWS 4096 /* named tensors one model may have */

/* The three groups of tensors, each with the same views. */
static const char *const groups[3] = { "param.", "opt.m.", "opt.v." };

/* The config fields, by name, for the metadata. */
#define CONFIG_FIELDS(X) X(n_layer) X(n_shared) X(n_head) X(d_model) X(seq_len) X(vocab) X(d_ff)
/* The encoders' fields, written only when arch is not gpt (so a GPT's
 * checkpoint is the same as before they existed) and read when "arch" is
 * present. */
#define ENC_CONFIG_FIELDS(X) X(arch) X(d_embed) X(type_vocab) X(cls_id) X(sep_id) X(mask_id) X(pad_id)

static float *group_data(const kern_model *m, int g) { return g == 0 ? m->params : g == 1 ? m->m : m->v; }

/* The views of the valid config c into a new array (caller frees) and their
 * count. */
static cot_err get_views(const kern_config *c, kern_view **out, int *n, cot_errbuf *eb)
{
	int k = kern_param_views(c, NULL, 0);
	if (k <= 0 || k > MAX_VIEWS)
		return cot_seterr(eb, COT_ERR_INTERNAL, "model has %d named tensors, outside 1..%d", k,
		                  MAX_VIEWS);
	kern_view *v = malloc((size_t)k * sizeof *v);
	if (!v)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	kern_param_views(c, v, k);
	*out = v;
	*n = k;
	return COT_OK;
}

cot_err ckpt_save(const kern_model *m, const char *path, cot_errbuf *eb)
{
	kern_view *views;
	int nv;
	cot_err rc = get_views(&m->config, &views, &nv, eb);
	if (rc)
		return rc;
	st_writer *w;
	rc = st_writer_new(&w, eb);
	if (rc) {
		free(views);
		return rc;
	}
	char num[32], name[ST_NAME_MAX + 1];
	rc = st_writer_meta(w, "format", CKPT_FORMAT, eb);
	snprintf(num, sizeof num, "%d", CKPT_FORMAT_VERSION);
	if (!rc)
		rc = st_writer_meta(w, "format_version", num, eb);
	if (!rc)
		rc = st_writer_meta(w, "tokenizer", TOK_NAME, eb);
#define META(f) \
	if (!rc) { \
		snprintf(num, sizeof num, "%d", m->config.f); \
		rc = st_writer_meta(w, #f, num, eb); \
	}
	CONFIG_FIELDS(META)
	if (m->config.arch != KERN_ARCH_GPT) {
		ENC_CONFIG_FIELDS(META)
		META(unk_id)
		/* only when relative, so an absolute encoder's checkpoint is as
		 * before the option */
		if (m->config.position != KERN_POS_ABSOLUTE)
			META(position)
	}
#undef META
	snprintf(num, sizeof num, "%ld", (long)m->step);
	if (!rc)
		rc = st_writer_meta(w, "step", num, eb);

	for (int g = 0; !rc && g < 3; g++) {
		const float *base = group_data(m, g);
		for (int i = 0; !rc && i < nv; i++) {
			int64_t shape[4];
			const kern_view *v = &views[i];
			if (v->ndim < 0 || v->ndim > 4) {
				rc = cot_seterr(eb, COT_ERR_INTERNAL, "view \"%.64s\" has %d dimensions",
				                v->name, v->ndim);
				break;
			}
			for (int d = 0; d < v->ndim; d++)
				shape[d] = v->shape[d];
			snprintf(name, sizeof name, "%s%s", groups[g], v->name);
			rc = st_writer_add(w, name, ST_F32, v->ndim, shape, base + v->offset, eb);
		}
	}
	if (!rc) {
		cot_errbuf d;
		memset(&d, 0, sizeof d);
		rc = st_writer_write(w, path, &d);
		if (rc)
			cot_seterr(eb, rc, "could not save checkpoint \"%s\": %s", path, d.msg);
	}
	st_writer_free(w);
	free(views);
	return rc;
}

/* A metadata integer in [lo, hi] into *v. */
static cot_err meta_long(const st_file *f, const char *key, long lo, long hi, long *v, cot_errbuf *eb)
{
	const char *s = st_meta(f, key);
	if (!s)
		return cot_seterr(eb, COT_ERR_CORRUPT, "metadata \"%s\" is missing", key);
	char *end;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (errno || end == s || *end || x < lo || x > hi)
		return cot_seterr(eb, COT_ERR_CORRUPT,
		                  "metadata \"%s\" is \"%.32s\", not an integer from "
		                  "%ld to %ld",
		                  key, s, lo, hi);
	*v = x;
	return COT_OK;
}

/* Check the metadata of f and read its config and step. */
static cot_err read_header(const st_file *f, kern_config *c, long *step, cot_errbuf *eb)
{
	const char *s = st_meta(f, "format");
	if (!s || strcmp(s, CKPT_FORMAT) != 0)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "it is not a cotrain checkpoint (metadata \"format\" "
		                  "is %s%.32s%s, not \"" CKPT_FORMAT "\")",
		                  s ? "\"" : "", s ? s : "missing", s ? "\"" : "");
	long ver;
	cot_err rc = meta_long(f, "format_version", 0, INT_MAX, &ver, eb);
	if (rc)
		return rc;
	if (ver != CKPT_FORMAT_VERSION)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "its format version %ld is not %d, the one this "
		                  "build reads",
		                  ver, CKPT_FORMAT_VERSION);
	s = st_meta(f, "tokenizer");
	if (!s)
		return cot_seterr(eb, COT_ERR_CORRUPT, "metadata \"tokenizer\" is missing");
	if (strcmp(s, TOK_NAME) != 0)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED, "its tokenizer \"%.32s\" is not \"" TOK_NAME "\"",
		                  s);
	memset(c, 0, sizeof *c);
	long x;
#define FIELD(fl) \
	rc = meta_long(f, #fl, INT_MIN, INT_MAX, &x, eb); \
	if (rc) \
		return rc; \
	c->fl = (int)x;
	CONFIG_FIELDS(FIELD)
	if (st_meta(f, "arch")) {
		ENC_CONFIG_FIELDS(FIELD)
		c->unk_id = -1; /* absent from the encoders' first checkpoints: none */
		if (st_meta(f, "unk_id")) {
			FIELD(unk_id)
		}
		if (st_meta(f, "position")) { /* absent: absolute */
			FIELD(position)
		}
	}
#undef FIELD
	rc = meta_long(f, "step", 0, LONG_MAX, step, eb);
	if (rc)
		return rc;
	cot_errbuf d;
	memset(&d, 0, sizeof d);
	rc = kern_config_validate(c, &d);
	if (rc)
		return cot_seterr(eb, COT_ERR_CORRUPT, "its config is invalid: %s", d.msg);
	return COT_OK;
}

/* The first config field where a and b differ, or NULL. */
static const char *config_diff(const kern_config *a, const kern_config *b, int *va, int *vb)
{
#define DIFF(f) \
	if (a->f != b->f) { \
		*va = a->f; \
		*vb = b->f; \
		return #f; \
	}
	CONFIG_FIELDS(DIFF)
	ENC_CONFIG_FIELDS(DIFF)
	DIFF(unk_id)
	DIFF(position)
#undef DIFF
	return NULL;
}

/* Check that f holds exactly the tensors of config c, with finite values. */
static cot_err check_tensors(const st_file *f, const kern_view *views, int nv, cot_errbuf *eb)
{
	char name[ST_NAME_MAX + 1];
	if (st_count(f) != (size_t)nv * 3) {
		/* Find the odd one out for a useful detail. */
		for (size_t i = 0; i < st_count(f); i++) {
			const char *tn = st_tensor_at(f, i)->name;
			int known = 0;
			for (int g = 0; g < 3 && !known; g++) {
				size_t gl = strlen(groups[g]);
				for (int j = 0; j < nv && !known; j++)
					known = strncmp(tn, groups[g], gl) == 0 &&
					        strcmp(tn + gl, views[j].name) == 0;
			}
			if (!known)
				return cot_seterr(eb, COT_ERR_CORRUPT,
				                  "it holds tensor \"%.64s\", which this "
				                  "model does not have",
				                  tn);
		}
	}
	for (int g = 0; g < 3; g++) {
		for (int i = 0; i < nv; i++) {
			const kern_view *v = &views[i];
			snprintf(name, sizeof name, "%s%s", groups[g], v->name);
			const st_tensor *t = st_find(f, name);
			if (!t)
				return cot_seterr(eb, COT_ERR_CORRUPT, "tensor \"%s\" is missing", name);
			int same = t->dtype == ST_F32 && t->ndim == v->ndim && t->numel == v->numel;
			for (int d = 0; same && d < v->ndim; d++)
				same = t->shape[d] == v->shape[d];
			if (!same) {
				char want[64] = "", got[64] = "";
				for (int d = 0; d < v->ndim; d++)
					snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d",
					         d ? ", " : "", v->shape[d]);
				for (int d = 0; d < t->ndim; d++)
					snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
					         d ? ", " : "", (long long)t->shape[d]);
				return cot_seterr(eb, COT_ERR_CORRUPT,
				                  "tensor \"%s\" is %s [%s], expected F32 "
				                  "[%s]",
				                  name, st_dtype_name(t->dtype), got, want);
			}
			const unsigned char *p = t->data;
			for (size_t k = 0; k < t->numel; k++) {
				float x;
				memcpy(&x, p + 4 * k, 4);
				if (!isfinite(x))
					return cot_seterr(eb, COT_ERR_CORRUPT,
					                  "tensor \"%s\" holds a non-finite "
					                  "value at index %zu",
					                  name, k);
				if (g == 2 && x < 0) /* a second moment is a mean square */
					return cot_seterr(eb, COT_ERR_CORRUPT,
					                  "tensor \"%s\" holds a negative "
					                  "second moment at index %zu",
					                  name, k);
			}
		}
	}
	return COT_OK;
}

/* Validate all of f: header, config, tensors.  On success the caller owns
 * *views.  Errors name the file. */
static cot_err validate(const st_file *f, const char *path, kern_config *c, long *step, kern_view **views,
                        int *nv, cot_errbuf *eb)
{
	cot_errbuf d;
	memset(&d, 0, sizeof d);
	cot_err rc = read_header(f, c, step, &d);
	if (rc)
		return cot_seterr(eb, rc, "cannot load checkpoint \"%s\": %s", path, d.msg);
	rc = get_views(c, views, nv, eb);
	if (rc)
		return rc;
	rc = check_tensors(f, *views, *nv, &d);
	if (rc) {
		free(*views);
		*views = NULL;
		return cot_seterr(eb, rc, "cannot load checkpoint \"%s\": %s", path, d.msg);
	}
	return COT_OK;
}

/* Copy the validated tensors of f into m. */
static void copy_in(kern_model *m, const st_file *f, const kern_view *views, int nv, long step)
{
	char name[ST_NAME_MAX + 1];
	for (int g = 0; g < 3; g++) {
		float *base = group_data(m, g);
		for (int i = 0; i < nv; i++) {
			snprintf(name, sizeof name, "%s%s", groups[g], views[i].name);
			const st_tensor *t = st_find(f, name);
			memcpy(base + views[i].offset, t->data, t->nbytes);
		}
	}
	m->step = step;
}

cot_err ckpt_load(kern_model *m, const char *path, cot_errbuf *eb)
{
	st_file *f;
	cot_err rc = st_open(path, &f, eb);
	if (rc)
		return rc;
	kern_config c;
	long step;
	kern_view *views;
	int nv;
	rc = validate(f, path, &c, &step, &views, &nv, eb);
	if (!rc) {
		int va, vb;
		const char *field = config_diff(&c, &m->config, &va, &vb);
		if (field) {
			rc = cot_seterr(eb, COT_ERR_CONFLICT,
			                "cannot load checkpoint \"%s\": its %s is %d, "
			                "the model's is %d",
			                path, field, va, vb);
			cot_sethint(eb, "Load it into a model made with the "
			                "checkpoint's config.");
		} else {
			copy_in(m, f, views, nv, step);
			kern_gpu_params_changed(m);
		}
		free(views);
	}
	st_close(f);
	return rc;
}

cot_err ckpt_load_new(const char *path, int max_batch, kern_model **out, cot_errbuf *eb)
{
	*out = NULL;
	st_file *f;
	cot_err rc = st_open(path, &f, eb);
	if (rc)
		return rc;
	kern_config c;
	long step;
	kern_view *views;
	int nv;
	/* Validating first also proves that the file holds every parameter,
	 * so a small file cannot make us allocate a huge model. */
	rc = validate(f, path, &c, &step, &views, &nv, eb);
	if (!rc) {
		kern_model *m;
		rc = kern_model_create(&c, max_batch, &m, eb);
		if (!rc) {
			copy_in(m, f, views, nv, step);
			*out = m;
		}
		free(views);
	}
	st_close(f);
	return rc;
}
