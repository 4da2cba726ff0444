/* cotrain client: computing preferences (see prefs.h). */
#include "client/prefs.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { T_INT, T_BOOL, T_BYTES } ptype;

static const struct {
	const char *name;
	ptype type;
	int64_t min, max, def;
} desc[PREF_COUNT] = {
	[PREF_MAX_THREADS] = { "max_threads", T_INT, 0, 4096, 0 },
	[PREF_CPU_PERCENT] = { "cpu_percent", T_INT, 1, 100, 100 },
	[PREF_ONLY_WHEN_IDLE] = { "only_when_idle", T_BOOL, 0, 1, 0 },
	[PREF_IDLE_AFTER] = { "idle_after", T_INT, 0, 86400, 180 },
	[PREF_ONLY_ON_AC] = { "only_on_ac", T_BOOL, 0, 1, 1 },
	[PREF_DOWNLOAD_LIMIT] = { "download_limit", T_BYTES, 0, 1000000000000LL, 0 },
	[PREF_UPLOAD_LIMIT] = { "upload_limit", T_BYTES, 0, 1000000000000LL, 0 },
	[PREF_DISK_MAX] = { "disk_max", T_BYTES, 1LL << 20, 1LL << 50, 10LL << 30 },
	[PREF_MEMORY_MAX] = { "memory_max", T_BYTES, 0, 1LL << 50, 0 },
	[PREF_CPU_TIME_PERCENT] = { "cpu_time_percent", T_INT, 1, 100, 100 },
	[PREF_USE_GPU] = { "use_gpu", T_BOOL, 0, 1, 1 },
	[PREF_GPU_ONLY_WHEN_IDLE] = { "gpu_only_when_idle", T_BOOL, 0, 1, 0 },
	[PREF_GPU_DEVICE] = { "gpu_device", T_INT, 0, 63, 0 },
};

void cl_prefs_defaults(cl_prefs *p)
{
	for (int k = 0; k < PREF_COUNT; k++)
		p->v[k] = desc[k].def;
	p->set = (1u << PREF_COUNT) - 1;
}

int cl_prefs_key(const char *name)
{
	for (int k = 0; name && k < PREF_COUNT; k++)
		if (strcmp(name, desc[k].name) == 0)
			return k;
	return -1;
}

const char *cl_prefs_name(cl_pref_key k) { return (unsigned)k < PREF_COUNT ? desc[k].name : "?"; }

static cot_err out_of_bounds(cl_pref_key k, const char *shown, cot_errbuf *eb)
{
	if (desc[k].type == T_BOOL)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "invalid value \"%.64s\" for preference \"%s\": expected true or false",
		                  shown, desc[k].name);
	return cot_seterr(eb, COT_ERR_INVALID,
	                  "invalid value \"%.64s\" for preference \"%s\": expected %s between %lld and %lld",
	                  shown, desc[k].name, desc[k].type == T_BYTES ? "a byte count" : "an integer",
	                  (long long)desc[k].min, (long long)desc[k].max);
}

cot_err cl_prefs_set_text(cl_prefs *p, cl_pref_key k, const char *text, cot_errbuf *eb)
{
	if ((unsigned)k >= PREF_COUNT || !text)
		return cot_seterr(eb, COT_ERR_INVALID, "unknown preference");
	int64_t v;
	if (desc[k].type == T_BOOL) {
		static const char *yes[] = { "true", "yes", "on", "1" },
		                  *no[] = { "false", "no", "off", "0" };
		v = -1;
		for (int i = 0; i < 4; i++) {
			if (strcasecmp(text, yes[i]) == 0)
				v = 1;
			if (strcasecmp(text, no[i]) == 0)
				v = 0;
		}
		if (v < 0)
			return out_of_bounds(k, text, eb);
	} else {
		char *end;
		errno = 0;
		double d = strtod(text, &end);
		if (end == text || errno || !isfinite(d))
			return out_of_bounds(k, text, eb);
		if (desc[k].type == T_BYTES && *end) {
			const char *units = "kmgt";
			const char *u = strchr(units, (char)(*end | 0x20));
			if (!u || *end == '\0')
				return out_of_bounds(k, text, eb);
			d *= ldexp(1.0, 10 * (int)(u - units + 1));
			end++;
			if (*end == 'i' && end[1] == 'B') /* "MiB" */
				end += 2;
			else if (*end == 'B' || *end == 'b')
				end++;
		}
		if (*end || d != floor(d) || d < (double)desc[k].min || d > (double)desc[k].max)
			return out_of_bounds(k, text, eb);
		v = (int64_t)d;
	}
	p->v[k] = v;
	p->set |= 1u << k;
	return COT_OK;
}

cot_err cl_prefs_from_json(cl_prefs *p, const json_t *obj, cot_errbuf *eb)
{
	if (!json_is_object(obj))
		return cot_seterr(eb, COT_ERR_INVALID, "preferences must be a JSON object");
	cl_prefs tmp = *p;
	for (int k = 0; k < PREF_COUNT; k++) {
		json_t *j = json_object_get(obj, desc[k].name);
		if (!j || json_is_null(j))
			continue;
		if (desc[k].type == T_BOOL) {
			if (!json_is_boolean(j))
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "preference \"%s\" must be true or false", desc[k].name);
			tmp.v[k] = json_is_true(j);
		} else {
			if (!json_is_integer(j) || json_integer_value(j) < desc[k].min ||
			    json_integer_value(j) > desc[k].max)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "preference \"%s\" must be an integer between %lld and "
				                  "%lld",
				                  desc[k].name, (long long)desc[k].min,
				                  (long long)desc[k].max);
			tmp.v[k] = json_integer_value(j);
		}
		tmp.set |= 1u << k;
	}
	*p = tmp;
	return COT_OK;
}

json_t *cl_prefs_to_json(const cl_prefs *p)
{
	json_t *o = json_object();
	for (int k = 0; o && k < PREF_COUNT; k++) {
		if (!(p->set & (1u << k)))
			continue;
		json_t *v = desc[k].type == T_BOOL ? json_boolean(p->v[k]) : json_integer(p->v[k]);
		if (json_object_set_new(o, desc[k].name, v)) {
			json_decref(o);
			return NULL;
		}
	}
	return o;
}

void cl_prefs_overlay(cl_prefs *dst, const cl_prefs *src)
{
	for (int k = 0; k < PREF_COUNT; k++)
		if (src->set & (1u << k)) {
			dst->v[k] = src->v[k];
			dst->set |= 1u << k;
		}
}

int cl_prefs_threads(const cl_prefs *p, int ncores)
{
	if (ncores < 1)
		ncores = 1;
	int by_share = (int)((ncores * p->v[PREF_CPU_PERCENT] + 99) / 100);
	if (by_share < 1)
		by_share = 1;
	int n = by_share;
	if (p->v[PREF_MAX_THREADS] > 0 && p->v[PREF_MAX_THREADS] < n)
		n = (int)p->v[PREF_MAX_THREADS];
	return n;
}
