/* cotrain kernels: the optimizer settings of a project file (see opt_json.h). */
#include "kernels/opt_json.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kernels/config_changes.h"
#include "kernels/gpu.h"

/* A number field of obj into *out (left alone when absent). */
static cot_err num(const json_t *obj, const char *key, float *out, cot_errbuf *eb)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return COT_OK;
	if (!json_is_number(v))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "field \"optimizer.%s\" of the project is not a number", key);
	*out = (float)json_number_value(v);
	return COT_OK;
}

cot_err kern_opt_config_from_json(const char *config_json, kern_opt_config *o, cot_errbuf *eb)
{
	/* The defaults of doc/project-file.md (server/project_file.c). */
	kern_opt_default(o, KERN_OPT_LAMB);
	o->lr = 1e-3f;
	o->beta1 = 0.9f;
	o->beta2 = 0.999f;
	o->eps = 1e-6f;
	o->weight_decay = 0.01f;
	o->clip_norm = 1.0f;
	o->warmup_steps = 0;
	o->total_steps = 10000;
	o->decay = KERN_DECAY_COSINE;
	o->min_lr_ratio = 0.1f;
	json_t *cfg = json_loads(config_json ? config_json : "{}", 0, NULL);
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return cot_seterr(eb, COT_ERR_INVALID, "the project's config is not a JSON object");
	}
	cot_err rc = COT_OK;
	json_t *opt = json_object_get(cfg, "optimizer");
	if (opt && !json_is_object(opt)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"optimizer\" of the project is not an object");
		goto out;
	}
	json_t *type = json_object_get(opt, "type");
	if (type) {
		const char *t = json_string_value(type);
		if (t && strcmp(t, "lamb") == 0)
			o->kind = KERN_OPT_LAMB;
		else if (t && strcmp(t, "adamw") == 0)
			o->kind = KERN_OPT_ADAMW;
		else {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "field \"optimizer.type\" of the project must be \"lamb\" or "
			                "\"adamw\"");
			goto out;
		}
	}
	if ((rc = num(opt, "lr", &o->lr, eb)) || (rc = num(opt, "beta1", &o->beta1, eb)) ||
	    (rc = num(opt, "beta2", &o->beta2, eb)) || (rc = num(opt, "eps", &o->eps, eb)) ||
	    (rc = num(opt, "weight_decay", &o->weight_decay, eb)) ||
	    (rc = num(opt, "clip_norm", &o->clip_norm, eb)))
		goto out;
	json_t *s = json_object_get(opt, "schedule");
	if (s) {
		json_t *w = json_object_get(s, "warmup_steps"), *t = json_object_get(s, "total_steps");
		json_t *d = json_object_get(s, "decay");
		if ((w && !json_is_integer(w)) || (t && !json_is_integer(t))) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "field \"optimizer.schedule\" of the project has a non-integer step "
			                "count");
			goto out;
		}
		if (w)
			o->warmup_steps = (long)json_integer_value(w);
		if (t)
			o->total_steps = (long)json_integer_value(t);
		if (d) {
			const char *ds = json_string_value(d);
			if (ds && strcmp(ds, "constant") == 0)
				o->decay = KERN_DECAY_NONE;
			else if (ds && strcmp(ds, "linear") == 0)
				o->decay = KERN_DECAY_LINEAR;
			else if (ds && strcmp(ds, "cosine") == 0)
				o->decay = KERN_DECAY_COSINE;
			else {
				rc = cot_seterr(eb, COT_ERR_INVALID,
				                "field \"optimizer.schedule.decay\" of the project must be "
				                "\"constant\", \"linear\" or \"cosine\"");
				goto out;
			}
		}
		rc = num(s, "min_lr_ratio", &o->min_lr_ratio, eb);
		if (rc)
			goto out;
	}
	rc = kern_opt_validate(o, eb);
out:
	json_decref(cfg);
	return rc;
}

cot_err kern_mode_config_from_json(const char *config_json, kern_mode_config *mc, cot_errbuf *eb)
{
	mc->mode = KERN_MODE_SYNC;
	mc->inner_batch = KERN_INNER_BATCH_DEFAULT;
	mc->precision = KERN_PRECISION_DEFAULT;
	kern_outer_default(&mc->outer);
	json_t *cfg = json_loads(config_json ? config_json : "{}", 0, NULL);
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return cot_seterr(eb, COT_ERR_INVALID, "the project's config is not a JSON object");
	}
	cot_err rc = COT_OK;
	json_t *mode = json_object_get(cfg, "mode"), *ib = json_object_get(cfg, "inner_batch");
	json_t *outer = json_object_get(cfg, "outer"), *prec = json_object_get(cfg, "precision");
	if (prec) {
		int p = kern_precision_parse(json_string_value(prec));
		if (p < 0) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "field \"precision\" of the project must be \"fp32\", \"tf32\" or "
			                "\"bf16\"");
			goto out;
		}
		mc->precision = p;
	}
	if (mode) {
		const char *t = json_string_value(mode);
		if (t && strcmp(t, "sync") == 0)
			mc->mode = KERN_MODE_SYNC;
		else if (t && strcmp(t, "local") == 0)
			mc->mode = KERN_MODE_LOCAL;
		else {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "field \"mode\" of the project must be \"sync\" or \"local\"");
			goto out;
		}
	}
	if (ib) {
		if (!json_is_integer(ib) || json_integer_value(ib) < 1 ||
		    json_integer_value(ib) > KERN_INNER_BATCH_MAX) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "field \"inner_batch\" of the project must be an integer between 1 "
			                "and %d",
			                KERN_INNER_BATCH_MAX);
			goto out;
		}
		mc->inner_batch = (int)json_integer_value(ib);
	}
	if (outer && !json_is_object(outer)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"outer\" of the project is not an object");
		goto out;
	}
	json_t *nest = json_object_get(outer, "nesterov");
	if (nest && !json_is_boolean(nest)) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "field \"outer.nesterov\" of the project is not a boolean");
		goto out;
	}
	if (nest)
		mc->outer.nesterov = json_is_true(nest);
	json_t *lr = json_object_get(outer, "lr"), *mu = json_object_get(outer, "momentum");
	if ((lr && !json_is_number(lr)) || (mu && !json_is_number(mu))) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"outer.%s\" of the project is not a number",
		                lr && !json_is_number(lr) ? "lr" : "momentum");
		goto out;
	}
	if (lr)
		mc->outer.lr = (float)json_number_value(lr);
	if (mu)
		mc->outer.momentum = (float)json_number_value(mu);
	rc = kern_outer_validate(&mc->outer, eb);
out:
	json_decref(cfg);
	return rc;
}

cot_err kern_opt_config_at(const char *config_json, long long version, kern_opt_config *o, cot_errbuf *eb)
{
	char *at = NULL;
	cot_err rc = kern_config_at(config_json, version, &at, eb);
	if (!rc)
		rc = kern_opt_config_from_json(at, o, eb);
	free(at);
	return rc;
}
