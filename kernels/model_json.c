/* cotrain kernels: the model's shape as JSON (see model_json.h). */
#include "kernels/model_json.h"

#include <stdbool.h>
#include <string.h>

const char *const kern_model_json_keys[] = { "n_layer",  "n_shared", "n_head",  "d_model", "d_ff",
	                                     "seq_len",  "vocab",    "arch",    "d_embed", "type_vocab",
	                                     "cls_id",   "sep_id",   "mask_id", "pad_id",  "unk_id",
	                                     "position", NULL };

/* The encoder fields after "arch", in kern_model_json_keys' order. */
enum { GPT_KEYS = 7, ENC_INT_KEYS = 7, ENC_UNK = 6 /* unk_id: -1 allowed, absent is -1 */ };

/* The i-th encoder field of c (i < ENC_INT_KEYS). */
static int *enc_field(kern_config *c, int i)
{
	int *f[ENC_INT_KEYS] = { &c->d_embed, &c->type_vocab, &c->cls_id, &c->sep_id,
		                 &c->mask_id, &c->pad_id,     &c->unk_id };
	return f[i];
}

json_t *kern_model_config_to_json(const kern_config *c)
{
	json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "n_layer", c->n_layer, "n_shared",
	                      c->n_shared, "n_head", c->n_head, "d_model", c->d_model, "d_ff", c->d_ff,
	                      "seq_len", c->seq_len, "vocab", c->vocab);
	if (!j || c->arch == KERN_ARCH_GPT)
		return j; /* a GPT's object is what it was before the encoders */
	const char *name = kern_arch_name(c->arch);
	int bad = json_object_set_new(j, "arch", json_string(name ? name : "unknown"));
	kern_config copy = *c; /* enc_field points into a config it may change */
	for (int i = 0; i < ENC_INT_KEYS; i++)
		bad |= json_object_set_new(j, kern_model_json_keys[GPT_KEYS + 1 + i],
		                           json_integer(*enc_field(&copy, i)));
	/* absolute is written as nothing, so an absolute encoder's object is
	 * what it was before the option */
	const char *pos = kern_position_name(c->position);
	if (c->position != KERN_POS_ABSOLUTE)
		bad |= json_object_set_new(j, "position", json_string(pos ? pos : "unknown"));
	if (bad) {
		json_decref(j);
		return NULL;
	}
	return j;
}

/* Field "arch" of model into *arch: absent is gpt. */
static cot_err get_arch(const json_t *model, const char *path, int *arch, cot_errbuf *eb)
{
	const json_t *v = json_object_get(model, "arch");
	*arch = KERN_ARCH_GPT;
	if (!v)
		return COT_OK;
	*arch = json_is_string(v) ? kern_arch_parse(json_string_value(v)) : -1;
	if (*arch < 0) {
		cot_seterr(eb, COT_ERR_INVALID, "field \"%s.arch\" must be \"gpt\", \"albert\" or \"bert\"",
		           path);
		if (json_is_string(v))
			cot_sethint(eb, "It is \"%.64s\".", json_string_value(v));
		return COT_ERR_INVALID;
	}
	return COT_OK;
}

/* Field "position" of model into *position: absent is absolute, else one
 * of kern_position_name's strings. */
static cot_err get_position(const json_t *model, const char *path, int *position, cot_errbuf *eb)
{
	const json_t *v = json_object_get(model, "position");
	*position = KERN_POS_ABSOLUTE;
	if (!v)
		return COT_OK;
	*position = json_is_string(v) ? kern_position_parse(json_string_value(v)) : -1;
	if (*position < 0) {
		cot_seterr(eb, COT_ERR_INVALID,
		           "field \"%s.position\" must be \"absolute\", \"relative_key\" or "
		           "\"relative_key_query\"",
		           path);
		if (json_is_string(v))
			cot_sethint(eb, "It is \"%.64s\".", json_string_value(v));
		else
			cot_sethint(eb, "It is not a string.");
		return COT_ERR_INVALID;
	}
	return COT_OK;
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

/* The encoder fields of m (arch, n_*, d_*, seq_len and vocab read): each
 * absent one (allowed unless all) takes its default, d_embed min(128,
 * d_model) for ALBERT and d_model for BERT, type_vocab 2, and the special
 * ids the last four of the vocabulary ([CLS], [SEP], [MASK], [PAD]: 256..259
 * with the byte tokenizer; a subword project's are its tokenizer's, set by
 * cotrain-admin), unk_id -1 (none); then the whole config is checked. */
static cot_err encoder_fields(const json_t *model, const char *path, bool all, kern_config *m, cot_errbuf *eb)
{
	m->d_embed = m->arch == KERN_ARCH_ALBERT && m->d_model > 128 ? 128 : m->d_model;
	m->type_vocab = 2;
	m->cls_id = m->vocab - 4;
	m->sep_id = m->vocab - 3;
	m->mask_id = m->vocab - 2;
	m->pad_id = m->vocab - 1;
	m->unk_id = -1;
	cot_err rc = get_position(model, path, &m->position, eb);
	if (rc)
		return rc;
	for (int i = 0; i < ENC_INT_KEYS; i++) {
		long long hi = i == 0 ? KERN_MAX_DIM : i == 1 ? 16 : m->vocab - 1;
		long long lo = i == ENC_UNK ? -1 : i == 1 ? 2 : i == 0;
		if ((rc = get_int(model, path, kern_model_json_keys[GPT_KEYS + 1 + i], all && i != ENC_UNK,
		                  lo, hi, enc_field(m, i), eb)))
			return rc;
	}
	cot_errbuf d = { "", "" };
	if (kern_config_validate(m, &d)) {
		cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" is not a usable %s model", path,
		           kern_arch_name(m->arch));
		cot_sethint(eb, "The %s.", d.msg);
		return COT_ERR_INVALID;
	}
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
		memset(&m, 0, sizeof m);
		for (int i = 0; i < GPT_KEYS; i++)
			if ((rc = get_int(model, path, kern_model_json_keys[i], true, 0, 1 << 20, dims[i],
			                  eb)))
				return rc;
		if ((rc = get_arch(model, path, &m.arch, eb)))
			return rc;
		/* an encoder saved before unk_id existed has none; a GPT has no
		 * encoder fields at all (0, as kern_config_validate wants) */
		if (m.arch != KERN_ARCH_GPT)
			m.unk_id = -1;
		for (int i = 0; m.arch != KERN_ARCH_GPT && i < ENC_INT_KEYS; i++)
			if ((rc = get_int(model, path, kern_model_json_keys[GPT_KEYS + 1 + i], i != ENC_UNK,
			                  i == ENC_UNK ? -1 : 0, 1 << 20, enc_field(&m, i), eb)))
				return rc;
		if (m.arch != KERN_ARCH_GPT && (rc = get_position(model, path, &m.position, eb)))
			return rc;
		*c = m;
		return COT_OK;
	}
	bool all = !(flags & KERN_MODEL_JSON_DEFAULTS);
	kern_config m = { .n_shared = -1, .d_ff = -1, .vocab = 256 };
	if ((rc = get_arch(model, path, &m.arch, eb)))
		return rc;
	if (m.arch != KERN_ARCH_GPT)
		m.vocab = 256 + 4; /* the byte tokenizer and the four special tokens */
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
	if (m.arch == KERN_ARCH_GPT) {
		for (int i = GPT_KEYS + 1; kern_model_json_keys[i]; i++)
			if (json_object_get(model, kern_model_json_keys[i])) {
				cot_seterr(eb, COT_ERR_INVALID, "field \"%s.%s\" applies to encoders only",
				           path, kern_model_json_keys[i]);
				cot_sethint(eb, "Set \"%s.arch\" to \"albert\" or \"bert\", or remove it.",
				            path);
				return COT_ERR_INVALID;
			}
	} else if ((rc = encoder_fields(model, path, all, &m, eb))) {
		return rc;
	}
	*c = m;
	return COT_OK;
}
