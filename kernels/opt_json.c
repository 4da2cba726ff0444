/* cotrain kernels: the optimizer settings of a project file (see opt_json.h). */
#include "kernels/opt_json.h"

#include <string.h>

#include <jansson.h>

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
