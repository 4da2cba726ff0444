/* cotrain-server: the server's own optimizer step of a round. */
#include "server/round_step.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "shared/hash.h"

/* Gradients and hashes are little-endian fp32 on the wire and in memory. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the round step reads and hashes fp32 as little-endian bytes"
#endif

static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

/* A number field of obj into *out (left alone when absent). */
static cot_err num(const json_t *obj, const char *key, float *out, cot_errbuf *eb)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return COT_OK;
	if (!json_is_number(v))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"optimizer.%s\" of the project is not a number", key);
	*out = (float)json_number_value(v);
	return COT_OK;
}

cot_err round_step_opt_config(const char *config_json, kern_opt_config *o, cot_errbuf *eb)
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
			rc = cot_seterr(eb, COT_ERR_INVALID, "field \"optimizer.type\" of the project must be \"lamb\" or \"adamw\"");
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
			rc = cot_seterr(eb, COT_ERR_INVALID, "field \"optimizer.schedule\" of the project has a non-integer step count");
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
				rc = cot_seterr(eb, COT_ERR_INVALID, "field \"optimizer.schedule.decay\" of the project must be \"constant\", \"linear\" or \"cosine\"");
				goto out;
			}
		}
		if ((rc = num(s, "min_lr_ratio", &o->min_lr_ratio, eb)))
			goto out;
	}
	rc = kern_opt_validate(o, eb);
out:
	json_decref(cfg);
	return rc;
}

/* Save m into the store through a temporary file in <store>/tmp. */
static cot_err store_checkpoint(const char *store_dir, const kern_model *m,
                                char sha[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb)
{
	char tmpdir[4200], path[4300];
	snprintf(tmpdir, sizeof tmpdir, "%s/tmp", store_dir);
	snprintf(path, sizeof path, "%s/step-XXXXXX", tmpdir);
	if ((mkdir(store_dir, 0755) != 0 && errno != EEXIST) ||
	    (mkdir(tmpdir, 0755) != 0 && errno != EEXIST))
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", tmpdir, strerror(errno));
	int fd = mkstemp(path);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create file in \"%s\": %s", tmpdir, strerror(errno));
	close(fd);
	cot_err rc = ckpt_save(m, path, eb);
	if (!rc)
		rc = fs_put_file(store_dir, path, sha, size, eb);
	unlink(path);
	return rc;
}

cot_err round_step_compute(const char *store_dir, const char *ckpt_sha, const char *config_json,
                           long long version, const float *grad, size_t n,
                           char ckpt_out[FS_SHA_HEX_LEN + 1], uint64_t *size,
                           char params_out[FS_SHA_HEX_LEN + 1], cot_errbuf *eb)
{
	kern_opt_config o;
	cot_err rc = round_step_opt_config(config_json, &o, eb);
	if (rc)
		return rc;
	char path[4300];
	if ((rc = fs_path(store_dir, ckpt_sha, path, sizeof path, eb)))
		return rc;
	pthread_mutex_lock(&step_lock);
	kern_model *m = NULL;
	if ((rc = ckpt_load_new(path, 0, &m, eb)))
		goto out;
	if (m->n_params != n) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT, "the gradient has %zu values, the model %zu parameters",
		                n, m->n_params);
		goto out;
	}
	if (m->step != version) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT, "checkpoint of version %lld has taken %ld steps",
		                version, m->step);
		goto out;
	}
	memcpy(m->grads, grad, n * sizeof *grad);
	if ((rc = kern_opt_step(m, &o, NULL, eb)) ||
	    (rc = store_checkpoint(store_dir, m, ckpt_out, size, eb)))
		goto out;
	if (hash_sha256_hex(m->params, n * sizeof *m->params, params_out))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the parameters");
out:
	kern_model_free(m);
	pthread_mutex_unlock(&step_lock);
	return rc;
}
