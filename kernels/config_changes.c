/* cotrain kernels: a project config at a model version (see config_changes.h). */
#include "kernels/config_changes.h"

#include <stdlib.h>

#include <jansson.h>

/* Merge src over dst: objects key by key (recursively), any other value
 * replaces.  0 or -1 (out of memory). */
static int merge(json_t *dst, const json_t *src)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)src, key, v)
	{
		json_t *d = json_object_get(dst, key);
		if (json_is_object(d) && json_is_object(v)) {
			if (merge(d, v))
				return -1;
		} else if (json_object_set_new(dst, key, json_deep_copy(v))) {
			return -1;
		}
	}
	return 0;
}

cot_err kern_config_at(const char *config_json, long long version, char **out, cot_errbuf *eb)
{
	*out = NULL;
	json_t *cfg = json_loads(config_json ? config_json : "{}", 0, NULL);
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return cot_seterr(eb, COT_ERR_INVALID, "the project's config is not a JSON object");
	}
	cot_err rc = COT_OK;
	json_t *changes = json_incref(json_object_get(cfg, "changes"));
	json_t **order = NULL;
	json_object_del(cfg, "changes");
	size_t n = json_array_size(changes);
	if (changes && !json_is_array(changes)) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "field \"changes\" of the project is not an array");
		goto out;
	}
	if (n && !(order = malloc(n * sizeof *order))) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *c = json_array_get(changes, i), *v = json_object_get(c, "version");
		if (!json_is_object(c) || !json_is_integer(v) || json_integer_value(v) < 0) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "change %zu of the project has no integer \"version\" of at least 0",
			                i + 1);
			goto out;
		}
		order[i] = c;
	}
	/* Ascending version, file order among equal ones: an insertion sort
	 * (stable; a project holds few changes). */
	for (size_t i = 1; i < n; i++)
		for (size_t k = i; k > 0; k--) {
			json_t *a = order[k - 1], *b = order[k];
			if (json_integer_value(json_object_get(a, "version")) <=
			    json_integer_value(json_object_get(b, "version")))
				break;
			order[k - 1] = b;
			order[k] = a;
		}
	for (size_t i = 0; i < n; i++) {
		if (json_integer_value(json_object_get(order[i], "version")) > version)
			break;
		json_t *c = json_deep_copy(order[i]);
		if (c) {
			json_object_del(c, "version");
			json_object_del(c, "at");
		}
		int bad = !c || merge(cfg, c);
		json_decref(c);
		if (bad) {
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
			goto out;
		}
	}
	if (!(*out = json_dumps(cfg, JSON_COMPACT | JSON_REAL_PRECISION(17))))
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
out:
	free(order);
	json_decref(changes);
	json_decref(cfg);
	return rc;
}
