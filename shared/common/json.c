/* cotrain: shape validation for JSON over Jansson. */
#include "shared/common/json.h"

#include <math.h>

cot_err cot_json_parse_object(const char *buf, size_t len, json_t **out, cot_errbuf *eb)
{
	json_error_t jerr;
	*out = NULL;
	json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!v)
		return cot_seterr(eb, COT_ERR_INVALID, "malformed JSON at line %d, column %d: %s", jerr.line,
		                  jerr.column, jerr.text);
	if (!json_is_object(v)) {
		json_decref(v);
		return cot_seterr(eb, COT_ERR_INVALID, "request body must be a JSON object");
	}
	*out = v;
	return COT_OK;
}

/* The field, or NULL when absent or null; sets the error for a missing
 * required field. */
static const json_t *field(const json_t *obj, const char *key, bool required, cot_err *rc, cot_errbuf *eb)
{
	const json_t *v = json_object_get(obj, key);
	*rc = COT_OK;
	if (v && !json_is_null(v))
		return v;
	if (required)
		*rc = cot_seterr(eb, COT_ERR_INVALID, "missing field \"%s\"", key);
	return NULL;
}

cot_err cot_json_str(const json_t *obj, const char *key, bool required, size_t minlen, size_t maxlen,
                     const char **out, cot_errbuf *eb)
{
	cot_err rc;
	const json_t *v = field(obj, key, required, &rc, eb);
	if (!v)
		return rc;
	if (!json_is_string(v))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be a string", key);
	size_t n = json_string_length(v);
	if (n < minlen || n > maxlen)
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be %zu to %zu bytes long", key,
		                  minlen, maxlen);
	*out = json_string_value(v);
	return COT_OK;
}

cot_err cot_json_int(const json_t *obj, const char *key, bool required, long long min, long long max,
                     long long *out, cot_errbuf *eb)
{
	cot_err rc;
	const json_t *v = field(obj, key, required, &rc, eb);
	if (!v)
		return rc;
	if (!json_is_integer(v))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be an integer", key);
	long long x = json_integer_value(v);
	if (x < min || x > max)
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be between %lld and %lld", key, min,
		                  max);
	*out = x;
	return COT_OK;
}

cot_err cot_json_num(const json_t *obj, const char *key, bool required, double min, double max, double *out,
                     cot_errbuf *eb)
{
	cot_err rc;
	const json_t *v = field(obj, key, required, &rc, eb);
	if (!v)
		return rc;
	if (!json_is_number(v))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be a number", key);
	double x = json_number_value(v);
	if (!isfinite(x) || x < min || x > max)
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be between %g and %g", key, min,
		                  max);
	*out = x;
	return COT_OK;
}

cot_err cot_json_bool(const json_t *obj, const char *key, bool required, bool *out, cot_errbuf *eb)
{
	cot_err rc;
	const json_t *v = field(obj, key, required, &rc, eb);
	if (!v)
		return rc;
	if (!json_is_boolean(v))
		return cot_seterr(eb, COT_ERR_INVALID, "field \"%s\" must be true or false", key);
	*out = json_is_true(v);
	return COT_OK;
}
