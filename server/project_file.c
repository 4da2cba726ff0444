/* cotrain: project files (see project_file.h and doc/project-file.md). */
#include "server/project_file.h"

#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kernels/config_changes.h"
#include "kernels/gpu.h"
#include "kernels/model_json.h"
#include "kernels/opt_json.h"
#include "shared/averaging/centered_clip.h"

const char *pf_opt_type_name(pf_opt_type t) { return t == PF_OPT_ADAMW ? "adamw" : "lamb"; }

const char *pf_decay_name(pf_decay d)
{
	switch (d) {
	case PF_DECAY_CONSTANT:
		return "constant";
	case PF_DECAY_LINEAR:
		return "linear";
	case PF_DECAY_COSINE:
		return "cosine";
	}
	return "cosine";
}

const char *pf_mode_name(pf_mode m) { return m == PF_MODE_LOCAL ? "local" : "sync"; }

int64_t pf_param_count(const pf_model *m)
{
	if (m->arch != KERN_ARCH_GPT)
		return (int64_t)kern_param_count(m);
	int64_t d = m->d_model, f = m->d_ff;
	int64_t block = 4 * d * d + 2 * d * f + 9 * d + f;
	return (int64_t)m->vocab * d + (int64_t)m->seq_len * d + m->n_shared * block + 2 * d;
}

/* ---- shape checking ---------------------------------------------------- */

/* An object being checked, and the dotted path of it ("optimizer.schedule")
 * for messages. */
typedef struct {
	const json_t *obj;
	const char *path;
	cot_errbuf *eb;
} scope;

static void field_name(const scope *s, const char *key, char *buf, size_t len)
{
	if (*s->path)
		snprintf(buf, len, "%s.%s", s->path, key);
	else
		snprintf(buf, len, "%s", key);
}

static cot_err bad(const scope *s, const char *key, const char *hint, const char *fmt, const char *what)
{
	char f[128];
	field_name(s, key, f, sizeof f);
	cot_seterr(s->eb, COT_ERR_INVALID, fmt, f, what);
	if (hint)
		cot_sethint(s->eb, "%s", hint);
	return COT_ERR_INVALID;
}

/* Every key of the object must be in the NULL-terminated list. */
static cot_err only_keys(const scope *s, const char *const *allowed)
{
	const char *key;
	const json_t *v;
	json_object_foreach((json_t *)s->obj, key, v)
	{
		bool found = false;
		for (const char *const *a = allowed; *a; a++)
			if (strcmp(*a, key) == 0)
				found = true;
		if (!found) {
			char f[128], list[512] = "";
			size_t n = 0;
			snprintf(f, sizeof f, "%s%s%.80s", s->path, *s->path ? "." : "", key);
			for (const char *const *a = allowed; *a && n < sizeof list - 40; a++)
				n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", *a);
			cot_seterr(s->eb, COT_ERR_INVALID, "unknown field \"%s\" in project file", f);
			cot_sethint(s->eb, "Known fields%s%s: %s.", *s->path ? " of " : "", s->path, list);
			return COT_ERR_INVALID;
		}
	}
	return COT_OK;
}

static const json_t *get(const scope *s, const char *key)
{
	const json_t *v = json_object_get(s->obj, key);
	return json_is_null(v) ? NULL : v;
}

static cot_err missing(const scope *s, const char *key)
{
	return bad(s, key, NULL, "missing field \"%s\" in project file%s", "");
}

static cot_err get_int(const scope *s, const char *key, bool required, long long min, long long max,
                       long long *out)
{
	const json_t *v = get(s, key);
	if (!v)
		return required ? missing(s, key) : COT_OK;
	char f[128], range[96];
	field_name(s, key, f, sizeof f);
	snprintf(range, sizeof range, "an integer between %lld and %lld", min, max);
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
		cot_seterr(s->eb, COT_ERR_INVALID, "field \"%s\" must be %s", f, range);
		if (json_is_integer(v))
			cot_sethint(s->eb, "It is %lld.", (long long)json_integer_value(v));
		else
			cot_sethint(s->eb, "It is a JSON %s.",
			            json_is_real(v)      ? "real number"
			            : json_is_string(v)  ? "string"
			            : json_is_boolean(v) ? "boolean"
			            : json_is_array(v)   ? "array"
			                                 : "object");
		return COT_ERR_INVALID;
	}
	*out = json_integer_value(v);
	return COT_OK;
}

static cot_err get_num(const scope *s, const char *key, bool required, double min, double max, bool min_open,
                       double *out)
{
	const json_t *v = get(s, key);
	if (!v)
		return required ? missing(s, key) : COT_OK;
	char f[128];
	field_name(s, key, f, sizeof f);
	double x = json_is_number(v) ? json_number_value(v) : NAN;
	if (!json_is_number(v) || !isfinite(x) || x < min || x > max || (min_open && x == min)) {
		cot_seterr(s->eb, COT_ERR_INVALID, "field \"%s\" must be a number %s %g and at most %g", f,
		           min_open ? "above" : "of at least", min, max);
		if (json_is_number(v))
			cot_sethint(s->eb, "It is %g.", x);
		return COT_ERR_INVALID;
	}
	*out = x;
	return COT_OK;
}

/* A string of 1..maxlen bytes; written into buf (maxlen + 1 bytes) or, with
 * buf NULL, returned through *dup as a malloc'd copy. */
static cot_err get_str(const scope *s, const char *key, bool required, size_t minlen, size_t maxlen,
                       char *buf, char **dup)
{
	const json_t *v = get(s, key);
	if (!v)
		return required ? missing(s, key) : COT_OK;
	char f[128];
	field_name(s, key, f, sizeof f);
	if (!json_is_string(v) || json_string_length(v) < minlen || json_string_length(v) > maxlen ||
	    strlen(json_string_value(v)) != json_string_length(v)) {
		cot_seterr(s->eb, COT_ERR_INVALID, "field \"%s\" must be a string of %zu to %zu bytes", f,
		           minlen, maxlen);
		return COT_ERR_INVALID;
	}
	if (buf) {
		memcpy(buf, json_string_value(v), json_string_length(v) + 1);
		return COT_OK;
	}
	char *c = strdup(json_string_value(v));
	if (!c)
		return cot_seterr(s->eb, COT_ERR_NOMEM, "out of memory");
	free(*dup);
	*dup = c;
	return COT_OK;
}

/* One of the NULL-terminated names; its index goes to *out. */
static cot_err get_enum(const scope *s, const char *key, const char *const *names, int *out)
{
	const json_t *v = get(s, key);
	if (!v)
		return COT_OK;
	if (json_is_string(v))
		for (int i = 0; names[i]; i++)
			if (strcmp(json_string_value(v), names[i]) == 0) {
				*out = i;
				return COT_OK;
			}
	char f[128], list[128] = "";
	size_t n = 0;
	field_name(s, key, f, sizeof f);
	for (int i = 0; names[i]; i++)
		n += (size_t)snprintf(list + n, sizeof list - n, "%s\"%s\"", i ? ", " : "", names[i]);
	cot_seterr(s->eb, COT_ERR_INVALID, "field \"%s\" must be one of %s", f, list);
	return COT_ERR_INVALID;
}

/* A nested object; absent is allowed unless required (*out is then NULL). */
static cot_err get_obj(const scope *s, const char *key, bool required, const json_t **out)
{
	const json_t *v = get(s, key);
	*out = NULL;
	if (!v)
		return required ? missing(s, key) : COT_OK;
	if (!json_is_object(v))
		return bad(s, key, NULL, "field \"%s\" must be a JSON object%s", "");
	*out = v;
	return COT_OK;
}

static int name_ok(const char *s, bool project)
{
	size_t n = strlen(s);
	if (n < 1 || n > PF_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool lower = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
		bool upper = c >= 'A' && c <= 'Z';
		if (project ? !(lower || (i > 0 && c == '-'))
		            : !(lower || upper || (i > 0 && (c == '-' || c == '.' || c == '_'))))
			return 0;
	}
	return 1;
}

/* ---- the sections ------------------------------------------------------ */

const char *const pf_special_keys[PF_SPECIAL_N] = { "cls_id", "sep_id", "mask_id", "pad_id", "unk_id" };

static cot_err parse_model(const scope *top, pf_model *m, unsigned *special_given)
{
	const json_t *o;
	cot_err rc = get_obj(top, "model", true, &o);
	if (rc)
		return rc;
	scope s = { o, "model", top->eb };
	if ((rc = only_keys(&s, (const char *const *)kern_model_json_keys)) ||
	    (rc = kern_model_config_from_json(o, "model", KERN_MODEL_JSON_DEFAULTS, m, s.eb)))
		return rc;
	*special_given = 0;
	for (int i = 0; i < PF_SPECIAL_N; i++)
		if (json_object_get(o, pf_special_keys[i]))
			*special_given |= 1u << i;
	int64_t np = pf_param_count(m);
	if (np > PF_MAX_PARAMS) {
		cot_seterr(s.eb, COT_ERR_INVALID,
		           "field \"model\" describes too large a model: %lld parameters", (long long)np);
		cot_sethint(s.eb,
		            "At most %lld parameters are supported; make model.d_model, model.n_shared or "
		            "model.vocab smaller.",
		            (long long)PF_MAX_PARAMS);
		return COT_ERR_INVALID;
	}
	return COT_OK;
}

static cot_err parse_optimizer(const scope *top, pf_optimizer *o)
{
	static const char *const keys[] = { "type",         "lr",        "beta1",    "beta2", "eps",
		                            "weight_decay", "clip_norm", "schedule", NULL };
	static const char *const skeys[] = { "warmup_steps", "total_steps", "decay", "min_lr_ratio", NULL };
	static const char *const types[] = { "lamb", "adamw", NULL };
	static const char *const decays[] = { "constant", "linear", "cosine", NULL };

	/* Defaults (doc/project-file.md). */
	o->type = PF_OPT_LAMB;
	o->lr = 1e-3;
	o->beta1 = 0.9;
	o->beta2 = 0.999;
	o->eps = 1e-6;
	o->weight_decay = 0.01;
	o->clip_norm = 1.0;
	o->warmup_steps = 0;
	o->total_steps = 10000;
	o->decay = PF_DECAY_COSINE;
	o->min_lr_ratio = 0.1;

	const json_t *obj, *sched;
	cot_err rc = get_obj(top, "optimizer", false, &obj);
	if (rc || !obj)
		return rc;
	scope s = { obj, "optimizer", top->eb };
	int type = (int)o->type, decay = (int)o->decay;
	if ((rc = only_keys(&s, keys)) || (rc = get_enum(&s, "type", types, &type)) ||
	    (rc = get_num(&s, "lr", false, 0, 10, true, &o->lr)) ||
	    (rc = get_num(&s, "beta1", false, 0, 0.999999, false, &o->beta1)) ||
	    (rc = get_num(&s, "beta2", false, 0, 0.99999999, false, &o->beta2)) ||
	    (rc = get_num(&s, "eps", false, 0, 1, true, &o->eps)) ||
	    (rc = get_num(&s, "weight_decay", false, 0, 10, false, &o->weight_decay)) ||
	    (rc = get_num(&s, "clip_norm", false, 0, 1e6, false, &o->clip_norm)) ||
	    (rc = get_obj(&s, "schedule", false, &sched)))
		return rc;
	o->type = (pf_opt_type)type;
	if (!sched)
		return COT_OK;
	scope ss = { sched, "optimizer.schedule", top->eb };
	long long warm = o->warmup_steps, total = o->total_steps;
	if ((rc = only_keys(&ss, skeys)) ||
	    (rc = get_int(&ss, "warmup_steps", false, 0, 1000000000, &warm)) ||
	    (rc = get_int(&ss, "total_steps", false, 1, 1000000000, &total)) ||
	    (rc = get_enum(&ss, "decay", decays, &decay)) ||
	    (rc = get_num(&ss, "min_lr_ratio", false, 0, 1, false, &o->min_lr_ratio)))
		return rc;
	if (warm > total) {
		cot_seterr(ss.eb, COT_ERR_INVALID,
		           "field \"optimizer.schedule.warmup_steps\" must not exceed "
		           "optimizer.schedule.total_steps (%lld)",
		           total);
		return COT_ERR_INVALID;
	}
	o->warmup_steps = warm;
	o->total_steps = total;
	o->decay = (pf_decay)decay;
	return COT_OK;
}

/* "mode", and local mode's "inner_batch" and "outer"; the defaults are
 * the kernels' (opt_json.h, optimizer.h), which the client and the server's
 * step read from the normalized config. */
static cot_err parse_mode(const scope *top, pf_project *p)
{
	static const char *const modes[] = { "sync", "local", NULL };
	static const char *const okeys[] = { "lr", "momentum", "nesterov", NULL };
	p->local.inner_batch = KERN_INNER_BATCH_DEFAULT;
	p->local.lr = KERN_OUTER_LR_DEFAULT;
	p->local.momentum = KERN_OUTER_MOMENTUM_DEFAULT;
	p->local.nesterov = KERN_OUTER_NESTEROV_DEFAULT;
	int mode = PF_MODE_SYNC;
	cot_err rc = get_enum(top, "mode", modes, &mode);
	if (rc)
		return rc;
	p->mode = (pf_mode)mode;
	if (p->mode != PF_MODE_LOCAL) {
		static const char *const only_local[] = { "inner_batch", "outer", NULL };
		for (int i = 0; only_local[i]; i++)
			if (get(top, only_local[i]))
				return bad(top, only_local[i],
				           "Set \"mode\": \"local\" to train with inner steps, or remove the "
				           "field.",
				           "field \"%s\" is only used in local mode%s", "");
		return COT_OK;
	}
	long long ib = p->local.inner_batch;
	const json_t *o;
	if ((rc = get_int(top, "inner_batch", false, 1, KERN_INNER_BATCH_MAX, &ib)) ||
	    (rc = get_obj(top, "outer", false, &o)))
		return rc;
	p->local.inner_batch = (int)ib;
	if (!o)
		return COT_OK;
	scope s = { o, "outer", top->eb };
	if ((rc = only_keys(&s, okeys)) || (rc = get_num(&s, "lr", false, 0, 10, true, &p->local.lr)) ||
	    (rc = get_num(&s, "momentum", false, 0, 0.999999, false, &p->local.momentum)))
		return rc;
	const json_t *n = get(&s, "nesterov");
	if (n && !json_is_boolean(n))
		return bad(&s, "nesterov", NULL, "field \"%s\" must be true or false%s", "");
	if (n)
		p->local.nesterov = json_is_true(n);
	return COT_OK;
}

/* "precision": how a GPU host computes its matrix products (the
 * kernels' KERN_PREC_*, whose order the names follow). */
static cot_err parse_precision(const scope *top, pf_project *p)
{
	static const char *const precs[] = {
		[KERN_PREC_FP32] = "fp32", [KERN_PREC_TF32] = "tf32", [KERN_PREC_BF16] = "bf16", NULL
	};
	p->precision = KERN_PRECISION_DEFAULT;
	cot_err rc = get_enum(top, "precision", precs, &p->precision);
	if (rc)
		cot_sethint(top->eb, "It sets the matrix products of hosts that compute on a GPU: \"fp32\" "
		                     "(TF32 off), \"tf32\" or \"bf16\" (the default); CPU hosts ignore it.");
	return rc;
}

/* "aggregation" and, with "centered_clip", its "centered_clip" settings
 * (BTARD's defaults: tau 1, 20 iterations). */
static cot_err parse_aggregation(const scope *top, pf_project *p)
{
	static const char *const aggs[] = { "mean", "centered_clip", NULL };
	static const char *const ckeys[] = { "tau", "iterations", NULL };
	int agg = PF_AGG_MEAN;
	cot_err rc = get_enum(top, "aggregation", aggs, &agg);
	if (rc)
		return rc;
	p->aggregation = (pf_aggregation)agg;
	p->clip_tau = CCLIP_TAU_DEFAULT;
	p->clip_iters = CCLIP_ITERS_DEFAULT;
	const json_t *o;
	if ((rc = get_obj(top, "centered_clip", false, &o)))
		return rc;
	if (!o)
		return COT_OK;
	if (p->aggregation != PF_AGG_CENTERED_CLIP)
		return bad(top, "centered_clip",
		           "Set \"aggregation\": \"centered_clip\", or remove the field.",
		           "field \"%s\" is only used with CenteredClip aggregation%s", "");
	scope s = { o, "centered_clip", top->eb };
	long long iters = p->clip_iters;
	if ((rc = only_keys(&s, ckeys)) || (rc = get_num(&s, "tau", false, 0, 1e6, true, &p->clip_tau)) ||
	    (rc = get_int(&s, "iterations", false, 1, CCLIP_ITERS_MAX, &iters)))
		return rc;
	p->clip_iters = (int)iters;
	return COT_OK;
}

/* "validation" (into p->validation; has_validation when present), the
 * spot-check policy of the project. */
static cot_err parse_validation(const scope *top, pf_project *p)
{
	static const char *const keys[] = { "trusted_after", "first_rate", "min_rate", "decay", NULL };
	p->validation =
	        (pf_validation){ .trusted_after = 1, .first_rate = 1, .min_rate = 0.01, .decay = 0.5 };
	const json_t *o;
	cot_err rc = get_obj(top, "validation", false, &o);
	if (rc || !o)
		return rc;
	scope s = { o, "validation", top->eb };
	if ((rc = only_keys(&s, keys)) ||
	    (rc = get_int(&s, "trusted_after", false, 0, 1000000000, &p->validation.trusted_after)) ||
	    (rc = get_num(&s, "first_rate", false, 0, 1, false, &p->validation.first_rate)) ||
	    (rc = get_num(&s, "min_rate", false, 0, 1, false, &p->validation.min_rate)) ||
	    (rc = get_num(&s, "decay", false, 0, 1, true, &p->validation.decay)))
		return rc;
	p->has_validation = 1;
	return COT_OK;
}

/* The shape of change i (0-based) of "changes": an object with "version",
 * an optional "at", and only the settings a run may change. */
static cot_err check_change(const scope *top, const json_t *c, size_t i)
{
	static const char *const keys[] = { "version",           "at",         "optimizer", "target_batch",
		                            "work_unit_seconds", "validation", NULL };
	static const char *const okeys[] = { "lr", "schedule", NULL };
	char path[64];
	snprintf(path, sizeof path, "changes[%zu]", i);
	if (!json_is_object(c)) {
		cot_seterr(top->eb, COT_ERR_INVALID, "field \"%s\" must be a JSON object", path);
		return COT_ERR_INVALID;
	}
	scope s = { c, path, top->eb };
	long long version = 0;
	char at[PF_AT_MAX + 1];
	const json_t *o;
	cot_err rc;
	if ((rc = only_keys(&s, keys)) || (rc = get_int(&s, "version", true, 0, INT32_MAX, &version)) ||
	    (rc = get_str(&s, "at", false, 1, PF_AT_MAX, at, NULL)) ||
	    (rc = get_obj(&s, "optimizer", false, &o)))
		return rc;
	if (json_object_size(c) == (size_t)1 + (json_object_get(c, "at") != NULL)) {
		cot_seterr(top->eb, COT_ERR_INVALID, "field \"%s\" changes nothing", path);
		cot_sethint(top->eb, "A change names at least one setting besides \"version\" and \"at\".");
		return COT_ERR_INVALID;
	}
	if (!o)
		return COT_OK;
	char opath[80];
	snprintf(opath, sizeof opath, "%s.optimizer", path);
	scope so = { o, opath, top->eb };
	if ((rc = only_keys(&so, okeys)) || (rc = get_obj(&so, "schedule", false, &o)))
		return rc;
	return COT_OK;
}

/* "changes": the shape of each entry, then the settings in force at each
 * entry's version, checked as a project file of their own (every check of
 * the file's own settings holds for every version).  root is the whole
 * file. */
static cot_err parse_changes(const scope *top, const json_t *root, pf_project *p)
{
	const json_t *a = get(top, "changes");
	if (!a)
		return COT_OK;
	if (!json_is_array(a) || json_array_size(a) > PF_CHANGES_MAX)
		return bad(top, "changes", NULL, "field \"%s\" must be an array of at most 256 changes%s",
		           "");
	for (size_t i = 0; i < json_array_size(a); i++) {
		cot_err rc = check_change(top, json_array_get(a, i), i);
		if (rc)
			return rc;
	}
	char *text = json_dumps(root, JSON_COMPACT);
	if (!text)
		return cot_seterr(top->eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = COT_OK;
	for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
		long long v = json_integer_value(json_object_get(json_array_get(a, i), "version"));
		char *at = NULL;
		pf_project q;
		if ((rc = kern_config_at(text, v, &at, top->eb)))
			break;
		rc = pf_parse(at, strlen(at), &q, NULL, top->eb);
		free(at);
		if (rc) {
			char msg[sizeof top->eb->msg];
			snprintf(msg, sizeof msg, "%s", top->eb->msg);
			cot_seterr(top->eb, rc, "with change %zu (version %lld): %s", i + 1, v, msg);
		} else {
			pf_free(&q);
		}
	}
	free(text);
	if (!rc)
		p->n_changes = (int)json_array_size(a);
	return rc;
}

/* A licence identifier: letters, digits, '.', '-', '+' (SPDX ids and the
 * short names of model hubs), safe in a model card's YAML header. */
static bool license_ok(const char *s)
{
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
		      *s == '.' || *s == '-' || *s == '+'))
			return false;
	return true;
}

/* The normalized text of p (defaults filled, fixed key order) with the
 * file's "changes" array (p->changes, NULL: none) as given, in ascending
 * version. */
char *pf_normalize(const pf_project *p)
{
	const pf_model *m = &p->model;
	const pf_optimizer *o = &p->opt;
	json_t *j = json_pack("{s:s, s:s, s:s, s:s,"
	                      " s:o,"
	                      " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:{s:I, s:I, s:s, s:f}},"
	                      " s:i, s:i, s:I, s:i, s:f, s:i, s:i}",
	                      "name", p->name, "title", p->title, "description",
	                      p->description ? p->description : "", "dataset", p->dataset, "model",
	                      kern_model_config_to_json(m), "optimizer", "type", pf_opt_type_name(o->type),
	                      "lr", o->lr, "beta1", o->beta1, "beta2", o->beta2, "eps", o->eps,
	                      "weight_decay", o->weight_decay, "clip_norm", o->clip_norm, "schedule",
	                      "warmup_steps", (json_int_t)o->warmup_steps, "total_steps",
	                      (json_int_t)o->total_steps, "decay", pf_decay_name(o->decay), "min_lr_ratio",
	                      o->min_lr_ratio, "target_batch", p->target_batch, "microbatch_size",
	                      p->microbatch_size, "seed", (json_int_t)p->seed, "work_unit_seconds",
	                      p->work_unit_seconds, "min_batch_fraction", p->min_batch_fraction, "eval_every",
	                      p->eval_every, "eval_sequences", p->eval_sequences);
	if (j && json_object_set_new(j, "precision", json_string(kern_precision_name(p->precision)))) {
		json_decref(j);
		return NULL;
	}
	if (j && p->subword && json_object_set_new(j, "tokenizer", json_string("dataset"))) {
		json_decref(j);
		return NULL;
	}
	if (j && p->license[0] && json_object_set_new(j, "license", json_string(p->license))) {
		json_decref(j);
		return NULL;
	}
	if (j && p->aggregation == PF_AGG_CENTERED_CLIP &&
	    (json_object_set_new(j, "aggregation", json_string("centered_clip")) ||
	     json_object_set_new(j, "centered_clip",
	                         json_pack("{s:f, s:i}", "tau", p->clip_tau, "iterations", p->clip_iters)))) {
		json_decref(j);
		return NULL;
	}
	if (j && p->mode == PF_MODE_LOCAL &&
	    (json_object_set_new(j, "mode", json_string(pf_mode_name(p->mode))) ||
	     json_object_set_new(j, "inner_batch", json_integer(p->local.inner_batch)) ||
	     json_object_set_new(j, "outer",
	                         json_pack("{s:f, s:f, s:b}", "lr", p->local.lr, "momentum",
	                                   p->local.momentum, "nesterov", p->local.nesterov)))) {
		json_decref(j);
		return NULL;
	}
	if (j && p->has_validation &&
	    json_object_set_new(j, "validation",
	                        json_pack("{s:I, s:f, s:f, s:f}", "trusted_after",
	                                  (json_int_t)p->validation.trusted_after, "first_rate",
	                                  p->validation.first_rate, "min_rate", p->validation.min_rate,
	                                  "decay", p->validation.decay))) {
		json_decref(j);
		return NULL;
	}
	const json_t *changes = p->changes;
	if (j && changes && json_array_size(changes)) {
		/* A stable insertion sort by version, as kern_config_at applies them. */
		json_t *sorted = json_array();
		for (size_t i = 0; sorted && i < json_array_size(changes); i++) {
			json_t *c = json_array_get(changes, i);
			json_int_t v = json_integer_value(json_object_get(c, "version"));
			size_t k = json_array_size(sorted);
			while (k > 0 && json_integer_value(json_object_get(json_array_get(sorted, k - 1),
			                                                   "version")) > v)
				k--;
			if (json_array_insert(sorted, k, c)) {
				json_decref(sorted);
				sorted = NULL;
			}
		}
		if (!sorted || json_object_set_new(j, "changes", sorted)) {
			json_decref(j);
			return NULL;
		}
	}
	char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
	json_decref(j);
	return text;
}

cot_err pf_parse(const char *text, size_t len, pf_project *out, char **normalized, cot_errbuf *eb)
{
	static const char *const keys[] = {
		"name",          "title",          "description",     "dataset",   "model",
		"optimizer",     "target_batch",   "microbatch_size", "seed",      "work_unit_seconds",
		"mode",          "inner_batch",    "outer",           "precision", "min_batch_fraction",
		"eval_every",    "eval_sequences", "license",         "tokenizer", "aggregation",
		"centered_clip", "validation",     "changes",         NULL
	};
	memset(out, 0, sizeof *out);
	if (normalized)
		*normalized = NULL;
	if (len > PF_MAX_BYTES)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "project file is too large: %zu bytes, at most %u allowed", len,
		                  PF_MAX_BYTES);
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		cot_seterr(eb, COT_ERR_INVALID, "project file is not valid JSON: %s at line %d, column %d",
		           je.text, je.line, je.column);
		return COT_ERR_INVALID;
	}
	cot_err rc = COT_OK;
	if (!json_is_object(root)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "project file must be a JSON object");
		goto out;
	}
	scope s = { root, "", eb };
	long long tb = 0, mb = 8, seed = 0, wus = 180;
	long long eval_every = PF_EVAL_EVERY_DEFAULT, eval_seq = PF_EVAL_SEQUENCES_DEFAULT;
	if ((rc = only_keys(&s, keys)) || (rc = get_str(&s, "name", true, 1, PF_NAME_MAX, out->name, NULL)))
		goto out;
	if (!name_ok(out->name, true)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"name\" is not a valid project name: \"%s\"",
		                out->name);
		cot_sethint(eb, "Use 1 to 64 lowercase letters, digits and '-', starting with a letter or "
		                "digit.");
		goto out;
	}
	snprintf(out->title, sizeof out->title, "%s", out->name); /* the default title */
	if ((rc = get_str(&s, "title", false, 1, PF_TITLE_MAX, out->title, NULL)) ||
	    (rc = get_str(&s, "description", false, 0, PF_DESCRIPTION_MAX, NULL, &out->description)) ||
	    (rc = get_str(&s, "dataset", true, 1, PF_NAME_MAX, out->dataset, NULL)))
		goto out;
	if (!name_ok(out->dataset, false)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"dataset\" is not a valid dataset name: \"%s\"",
		                out->dataset);
		goto out;
	}
	char tokenizer[16] = "byte";
	if ((rc = get_str(&s, "tokenizer", false, 1, sizeof tokenizer - 1, tokenizer, NULL)))
		goto out;
	if (strcmp(tokenizer, "byte") != 0 && strcmp(tokenizer, "dataset") != 0) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "field \"tokenizer\" must be \"byte\" or \"dataset\", not \"%s\"", tokenizer);
		cot_sethint(eb, "\"dataset\" is the subword tokenizer the dataset was imported with "
		                "(cotrain-admin dataset import --tokenizer).");
		goto out;
	}
	out->subword = strcmp(tokenizer, "dataset") == 0;
	if ((rc = get_str(&s, "license", false, 1, PF_LICENSE_MAX, out->license, NULL)))
		goto out;
	if (out->license[0] && !license_ok(out->license)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"license\" is not a licence identifier: \"%s\"",
		                out->license);
		cot_sethint(eb,
		            "Use letters, digits, '.', '-' and '+', e.g. \"apache-2.0\" or \"CC-BY-4.0\".");
		goto out;
	}
	if ((rc = parse_model(&s, &out->model, &out->special_given)) ||
	    (rc = parse_optimizer(&s, &out->opt)) ||
	    (rc = get_int(&s, "target_batch", true, 1, 10000000, &tb)) ||
	    (rc = get_int(&s, "microbatch_size", false, 1, 4096, &mb)) ||
	    (rc = get_int(&s, "seed", false, 0, 9007199254740991ll, &seed)) ||
	    (rc = get_int(&s, "work_unit_seconds", false, 1, 86400, &wus)) ||
	    (rc = get_num(&s, "min_batch_fraction", false, 0, 1, false, &out->min_batch_fraction)) ||
	    (rc = get_int(&s, "eval_every", false, 0, PF_EVAL_EVERY_MAX, &eval_every)) ||
	    (rc = get_int(&s, "eval_sequences", false, 1, PF_EVAL_SEQUENCES_MAX, &eval_seq)) ||
	    (rc = parse_mode(&s, out)) || (rc = parse_precision(&s, out)) ||
	    (rc = parse_aggregation(&s, out)) || (rc = parse_validation(&s, out)))
		goto out;
	if (tb < mb) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "field \"target_batch\" must be at least microbatch_size (%lld)", mb);
		cot_sethint(eb, "It is %lld; a round steps on whole microbatches of %lld samples.", tb, mb);
		goto out;
	}
	if (tb % mb != 0) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "field \"target_batch\" must be a multiple of microbatch_size (%lld)", mb);
		cot_sethint(eb, "It is %lld; a round closes after whole microbatches.", tb);
		goto out;
	}
	out->target_batch = (int)tb;
	out->microbatch_size = (int)mb;
	out->seed = seed;
	out->work_unit_seconds = (int)wus;
	out->eval_every = (int)eval_every;
	out->eval_sequences = (int)eval_seq;
	if ((rc = parse_changes(&s, root, out)))
		goto out;
	if (out->n_changes)
		out->changes = json_incref((json_t *)get(&s, "changes"));
	if (normalized && !(*normalized = pf_normalize(out)))
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
out:
	json_decref(root);
	if (rc)
		pf_free(out);
	return rc;
}

void pf_free(pf_project *p)
{
	if (!p)
		return;
	free(p->description);
	json_decref(p->changes);
	memset(p, 0, sizeof *p);
}
