/* cotrain kernels: the model's shape as JSON (see model_json.h). */
#include "kernels/model_json.h"

#include <stdbool.h>

const char *const kern_model_json_keys[] = { "n_layer", "n_shared", "n_head", "d_model",
	                                     "d_ff",    "seq_len",  "vocab",  NULL };

json_t *kern_model_config_to_json(const kern_config *c)
{
	return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "n_layer", c->n_layer, "n_shared",
	                 c->n_shared, "n_head", c->n_head, "d_model", c->d_model, "d_ff", c->d_ff, "seq_len",
	                 c->seq_len, "vocab", c->vocab);
}

/* Field key of model into *out: absent leaves *out (an error when
 * required), else an integer in [min, max]. */
static cot_err get_int(const json_t *model, const char *path, const char *key, bool required, long long min,
                       long long max, int *out, cot_errbuf *eb)
{
	const json_t *v = json_object_get(model, key);
	if (!v) {
		if (required)
			return cot_seterr(eb, COT_ERR_INVALID, "missing field \"%s.%s\"", path, key);
		return COT_OK;
	}
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
		cot_seterr(eb, COT_ERR_INVALID, "field \"%s.%s\" must be an integer between %lld and %lld",
		           path, key, min, max);
		if (json_is_integer(v))
			cot_sethint(eb, "It is %lld.", (long long)json_integer_value(v));
		else
			cot_sethint(eb, "It is a JSON %s.",
			            json_is_real(v)      ? "real number"
			            : json_is_string(v)  ? "string"
			            : json_is_boolean(v) ? "boolean"
			            : json_is_array(v)   ? "array"
			            : json_is_null(v)    ? "null"
			                                 : "object");
		return COT_ERR_INVALID;
	}
	*out = (int)json_integer_value(v);
	return COT_OK;
}

cot_err kern_model_config_from_json(const json_t *model, const char *path, unsigned flags, kern_config *c,
                                    cot_errbuf *eb)
{
	if (!json_is_object(model))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be a JSON object", path);
	cot_err rc;
	if (flags & KERN_MODEL_JSON_STORED) {
		kern_config m;
		int *dims[] = {
			&m.n_layer, &m.n_shared, &m.n_head, &m.d_model, &m.d_ff, &m.seq_len, &m.vocab
		};
		for (int i = 0; kern_model_json_keys[i]; i++)
			if ((rc = get_int(model, path, kern_model_json_keys[i], true, 0, 1 << 20, dims[i],
			                  eb)))
				return rc;
		*c = m;
		return COT_OK;
	}
	bool all = !(flags & KERN_MODEL_JSON_DEFAULTS);
	kern_config m = { .n_shared = -1, .d_ff = -1, .vocab = 256 };
	if ((rc = get_int(model, path, "n_layer", true, 1, KERN_MAX_LAYERS, &m.n_layer, eb)) ||
	    (rc = get_int(model, path, "n_shared", all, 1, KERN_MAX_LAYERS, &m.n_shared, eb)) ||
	    (rc = get_int(model, path, "n_head", true, 1, 256, &m.n_head, eb)) ||
	    (rc = get_int(model, path, "d_model", true, 1, KERN_MAX_DIM, &m.d_model, eb)) ||
	    (rc = get_int(model, path, "d_ff", all, 1, KERN_MAX_DIM, &m.d_ff, eb)) ||
	    (rc = get_int(model, path, "seq_len", true, 2, KERN_MAX_SEQ, &m.seq_len, eb)) ||
	    (rc = get_int(model, path, "vocab", all, 2, KERN_MAX_VOCAB, &m.vocab, eb)))
		return rc;
	if (m.n_shared < 0)
		m.n_shared = m.n_layer;
	if (m.d_ff < 0)
		m.d_ff = 4 * m.d_model;
	if (m.n_shared > m.n_layer) {
		cot_seterr(eb, COT_ERR_INVALID, "field \"%s.n_shared\" must not exceed %s.n_layer (%d)", path,
		           path, m.n_layer);
		cot_sethint(eb, "Block l uses parameter set l * n_shared / n_layer; "
		                "n_shared = n_layer means no sharing, 1 shares one set among all blocks.");
		return COT_ERR_INVALID;
	}
	if (m.d_model % m.n_head != 0) {
		cot_seterr(eb, COT_ERR_INVALID, "field \"%s.d_model\" must be a multiple of %s.n_head (%d)",
		           path, path, m.n_head);
		cot_sethint(eb, "It is %d; every attention head gets d_model / n_head dimensions.",
		            m.d_model);
		return COT_ERR_INVALID;
	}
	*c = m;
	return COT_OK;
}
