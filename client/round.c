/* cotrain client: round plans and arithmetic (see round.h). */
#include "client/round.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/api.h"
#include "shared/averaging/centered_clip.h"
#include "shared/averaging/compress.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"

cot_err cl_parse_endpoint(const char *s, char addr[DIALER_ADDR_MAX], uint16_t *port, cot_errbuf *eb)
{
	const char *colon;
	size_t alen;
	const char *a = s;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':')
			return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" is not [address]:port", s);
		a = s + 1;
		alen = (size_t)(close - a);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || strchr(s, ':') != colon)
			return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" is not address:port", s);
		alen = (size_t)(colon - s);
	}
	if (alen == 0 || alen >= DIALER_ADDR_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" has no usable address", s);
	char tmp[DIALER_ADDR_MAX];
	memcpy(tmp, a, alen);
	tmp[alen] = '\0';
	unsigned char buf[16];
	if (inet_pton(s[0] == '[' ? AF_INET6 : AF_INET, tmp, buf) != 1)
		return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" has no numeric address", s);
	char *end;
	const char *ps = colon + 1;
	if (*ps < '0' || *ps > '9')
		return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" has no port", s);
	unsigned long pv = strtoul(ps, &end, 10);
	if (*end != '\0' || pv < 1 || pv > 65535)
		return cot_seterr(eb, COT_ERR_INVALID, "endpoint \"%.80s\" has a bad port", s);
	memcpy(addr, tmp, alen + 1);
	*port = (uint16_t)pv;
	return COT_OK;
}

static cot_err bad(cot_errbuf *eb, const cot_errbuf *why)
{
	return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid averaging plan: %s", why->msg);
}

static uint64_t me_lo(const cl_plan *p) { return p->members[p->self].lo; }

static uint64_t me_hi(const cl_plan *p) { return p->members[p->self].hi; }

void cl_plan_free(cl_plan *p)
{
	free(p->cross);
	free(p->cross_holders);
	p->cross = NULL;
	p->cross_holders = NULL;
	p->n_cross = 0;
}

/* The "cross" field: slices tiling [lo, hi), ascending, each with its
 * holders (ascending host ids, ourselves once, their parts tiling the
 * slice), into out->cross.  COT_ERR_INVALID with why in e otherwise (what
 * was allocated stays in out for cl_plan_free). */
static cot_err parse_cross(const json_t *cr, int64_t host_id, uint64_t lo, uint64_t hi, cl_plan *out,
                           cot_errbuf *e)
{
	size_t ns = json_array_size(cr), total = 0;
	if (!json_is_array(cr) || ns < 1 || ns > CROSS_MAX_SLICES)
		return cot_seterr(e, COT_ERR_INVALID, "field \"cross\" must be an array of 1 to %d slices",
		                  CROSS_MAX_SLICES);
	for (size_t i = 0; i < ns; i++) {
		size_t nh = json_array_size(json_object_get(json_array_get(cr, i), "holders"));
		if (nh < 1 || nh > ALLREDUCE_MAX_MEMBERS || (total += nh) > CL_PLAN_MAX_HOLDERS)
			return cot_seterr(e, COT_ERR_INVALID, "cross[%zu] must hold 1 to %d holders", i,
			                  ALLREDUCE_MAX_MEMBERS);
	}
	out->cross = calloc(ns, sizeof *out->cross);
	out->cross_holders = calloc(total, sizeof *out->cross_holders);
	if (!out->cross || !out->cross_holders)
		return cot_seterr(e, COT_ERR_INVALID, "out of memory for the slices across groups");
	uint64_t at = lo;
	cross_holder *h = out->cross_holders;
	for (size_t i = 0; i < ns; i++) {
		const json_t *s = json_array_get(cr, i);
		const json_t *hs = json_object_get(s, "holders");
		long long idx = 0, slo = 0, shi = 0;
		if (cot_json_int(s, "index", true, 0, 1LL << 30, &idx, e) ||
		    cot_json_int(s, "lo", true, 0, 1LL << 40, &slo, e) ||
		    cot_json_int(s, "hi", true, slo + 1, 1LL << 40, &shi, e))
			return COT_ERR_INVALID;
		if ((uint64_t)slo != at || (uint64_t)shi > hi)
			return cot_seterr(e, COT_ERR_INVALID,
			                  "the slices across groups do not tile our range");
		cross_slice *cs = &out->cross[i];
		*cs = (cross_slice){ .index = idx, .lo = (uint64_t)slo, .hi = (uint64_t)shi, .holders = h };
		uint64_t next = (uint64_t)slo;
		int self = 0;
		for (size_t k = 0; k < json_array_size(hs); k++, h++) {
			const json_t *x = json_array_get(hs, k);
			long long id = 0, g = 0, hlo = 0, hhi = 0;
			const char *ep = NULL;
			if (!json_is_object(x) || cot_json_int(x, "host_id", true, 1, 1LL << 62, &id, e) ||
			    cot_json_int(x, "group", true, 0, 1LL << 20, &g, e) ||
			    cot_json_int(x, "lo", true, slo, shi, &hlo, e) ||
			    cot_json_int(x, "hi", true, hlo, shi, &hhi, e) ||
			    cot_json_str(x, "endpoint", true, 3, 79, &ep, e))
				return e->msg[0]
				               ? COT_ERR_INVALID
				               : cot_seterr(e, COT_ERR_INVALID,
				                            "cross[%zu].holders[%zu] is not an object", i, k);
			if ((k > 0 && id <= h[-1].host_id) || (uint64_t)hlo != next)
				return cot_seterr(e, COT_ERR_INVALID,
				                  "the holders of cross[%zu] are not in ascending host id "
				                  "order tiling the slice",
				                  i);
			if (cl_parse_endpoint(ep, h->addr, &h->port, e))
				return COT_ERR_INVALID;
			h->host_id = id;
			h->lo = (uint64_t)hlo;
			h->hi = (uint64_t)hhi;
			next = (uint64_t)hhi;
			if (id == host_id) {
				cs->self = k;
				self++;
			}
			cs->n++;
		}
		if (next != (uint64_t)shi || self != 1)
			return cot_seterr(e, COT_ERR_INVALID,
			                  "cross[%zu] does not name us once or is not tiled", i);
		at = (uint64_t)shi;
	}
	if (at != hi)
		return cot_seterr(e, COT_ERR_INVALID, "the slices across groups do not cover our range");
	out->n_cross = ns;
	return COT_OK;
}

cot_err cl_plan_parse(const json_t *j, int64_t host_id, int64_t version, int64_t expect_params, cl_plan *out,
                      cot_errbuf *eb)
{
	cot_errbuf e = { "", "" };
	long long ver = 0, att = 0, grp = 0, ng = 0, rs = 0, pc = 0, hid = 0;
	const char *deadline = NULL, *comp = "none";
	memset(out, 0, sizeof *out);
	if (cot_json_int(j, "version", true, 0, 1LL << 31, &ver, &e) ||
	    cot_json_int(j, "attempt", true, 1, 1LL << 31, &att, &e) ||
	    cot_json_int(j, "host_id", true, 1, 1LL << 62, &hid, &e) ||
	    cot_json_int(j, "group", true, 0, 1LL << 20, &grp, &e) ||
	    cot_json_int(j, "n_groups", true, 1, 1LL << 20, &ng, &e) ||
	    cot_json_int(j, "round_samples", true, 1, 1LL << 50, &rs, &e) ||
	    cot_json_int(j, "param_count", true, 1, 1LL << 40, &pc, &e) ||
	    cot_json_str(j, "deadline", true, 10, 64, &deadline, &e) ||
	    cot_json_str(j, "compression", false, 1, 16, &comp, &e))
		return bad(eb, &e);
	if (ver != version || hid != host_id || grp >= ng)
		return bad(eb, &(cot_errbuf){ "it is for another round, host or group", "" });
	if (pc != expect_params) {
		cot_seterr(&e, COT_ERR_INVALID, "param_count %lld is not the model's %lld", pc,
		           (long long)expect_params);
		return bad(eb, &e);
	}
	if ((out->deadline = cl_api_parse_timestamp(deadline)) < 0)
		return bad(eb, &(cot_errbuf){ "field \"deadline\" is not a timestamp", "" });
	comp_policy pol;
	if (strcmp(comp, "none") == 0)
		pol = COMP_POLICY_NONE;
	else if (strcmp(comp, "fp16") == 0)
		pol = COMP_POLICY_FP16;
	else if (strcmp(comp, "block8") == 0 || strcmp(comp, "8bit") == 0)
		pol = COMP_POLICY_BLOCK8;
	else if (strcmp(comp, "auto") == 0)
		pol = COMP_POLICY_AUTO;
	else
		return bad(eb, &(cot_errbuf){ "unknown compression", "" });
	out->comp = comp_choose((size_t)pc, pol);
	const char *agg = "mean";
	if (cot_json_str(j, "aggregation", false, 1, 16, &agg, &e))
		return bad(eb, &e);
	out->clip_tau = CCLIP_TAU_DEFAULT;
	out->clip_iters = CCLIP_ITERS_DEFAULT;
	if (strcmp(agg, "centered_clip") == 0) {
		const json_t *cc = json_object_get(j, "centered_clip");
		long long it = out->clip_iters;
		out->centered_clip = 1;
		if (cc && !json_is_null(cc) &&
		    (cot_json_num(cc, "tau", false, 1e-30, 1e6, &out->clip_tau, &e) ||
		     cot_json_int(cc, "iterations", false, 1, CCLIP_ITERS_MAX, &it, &e)))
			return bad(eb, &e);
		out->clip_iters = (int)it;
	} else if (strcmp(agg, "mean") != 0) {
		return bad(eb, &(cot_errbuf){ "unknown aggregation", "" });
	}
	const json_t *mem = json_object_get(j, "members");
	if (!json_is_array(mem) || json_array_size(mem) < 1 || json_array_size(mem) > CL_PLAN_MAX_MEMBERS)
		return bad(eb, &(cot_errbuf){ "field \"members\" must be an array of 1 to 256 members", "" });
	out->n = json_array_size(mem);
	int self_found = 0;
	uint64_t next = 0;
	int64_t group_samples = 0;
	for (size_t i = 0; i < out->n; i++) {
		const json_t *m = json_array_get(mem, i);
		cl_plan_member *pm = &out->members[i];
		long long id = 0, s = 0, lo = 0, hi = 0;
		const char *ep = NULL;
		if (!json_is_object(m) || cot_json_int(m, "host_id", true, 1, 1LL << 62, &id, &e) ||
		    cot_json_int(m, "samples", true, 1, 1LL << 50, &s, &e) ||
		    cot_json_int(m, "lo", true, 0, pc, &lo, &e) ||
		    cot_json_int(m, "hi", true, lo, pc, &hi, &e) ||
		    cot_json_str(m, "endpoint", true, 3, 79, &ep, &e)) {
			if (!e.msg[0])
				cot_seterr(&e, COT_ERR_INVALID, "members[%zu] is not an object", i);
			return bad(eb, &e);
		}
		if (i > 0 && id <= out->members[i - 1].host_id)
			return bad(eb, &(cot_errbuf){ "members are not in ascending host id order", "" });
		if ((uint64_t)lo != next)
			return bad(eb, &(cot_errbuf){ "the members' ranges do not tile the vector", "" });
		if (cl_parse_endpoint(ep, pm->addr, &pm->port, &e))
			return bad(eb, &e);
		next = (uint64_t)hi;
		pm->host_id = id;
		pm->samples = s;
		pm->lo = (uint64_t)lo;
		pm->hi = (uint64_t)hi;
		group_samples += s;
		if (id == host_id) {
			out->self = i;
			self_found = 1;
		}
	}
	if (next != (uint64_t)pc)
		return bad(eb, &(cot_errbuf){ "the members' ranges do not cover the vector", "" });
	if (!self_found)
		return bad(eb, &(cot_errbuf){ "we are not a member of our group", "" });
	if (group_samples > rs || (ng == 1 && group_samples != rs))
		return bad(eb, &(cot_errbuf){ "round_samples does not add up", "" });
	const json_t *g = json_object_get(j, "gradient");
	if (g && !json_is_null(g)) {
		const char *sha = NULL;
		long long gs = 0;
		if (!json_is_object(g) || cot_json_str(g, "sha256", true, 64, 64, &sha, &e) ||
		    cot_json_int(g, "samples", true, 1, rs, &gs, &e) || !hash_is_sha256_hex(sha)) {
			if (!e.msg[0])
				cot_seterr(&e, COT_ERR_INVALID, "field \"gradient\" is malformed");
			return bad(eb, &e);
		}
		out->has_gradient = 1;
		memcpy(out->gradient_sha256, sha, 65);
		out->gradient_samples = gs;
	}
	const char *cg = "server";
	if (cot_json_str(j, "cross_group", false, 1, 16, &cg, &e) ||
	    (strcmp(cg, "peers") != 0 && strcmp(cg, "server") != 0))
		return bad(eb, &(cot_errbuf){ "field \"cross_group\" must be \"peers\" or \"server\"", "" });
	out->cross_peers = strcmp(cg, "peers") == 0;
	const json_t *cr = json_object_get(j, "cross");
	if (cr && !json_is_null(cr)) {
		if (!out->cross_peers || ng < 2 || me_hi(out) <= me_lo(out))
			return bad(eb,
			           &(cot_errbuf){ "field \"cross\" where nothing is averaged across groups",
			                          "" });
		if (parse_cross(cr, host_id, me_lo(out), me_hi(out), out, &e)) {
			cl_plan_free(out);
			return bad(eb, &e);
		}
	} else if (out->cross_peers && ng > 1 && me_hi(out) > me_lo(out)) {
		return bad(eb, &(cot_errbuf){ "an aggregator's plan across groups has no \"cross\"", "" });
	}
	const char *ps = NULL;
	if (cot_json_str(j, "params_sha256", false, 64, 64, &ps, &e) || (ps && !hash_is_sha256_hex(ps))) {
		cl_plan_free(out);
		return bad(eb, &(cot_errbuf){ "field \"params_sha256\" is malformed", "" });
	}
	if (ps)
		memcpy(out->params_sha256, ps, 65);
	out->version = ver;
	out->attempt = att;
	out->group = grp;
	out->n_groups = ng;
	out->round_samples = rs;
	out->param_count = pc;
	return COT_OK;
}

void cl_round_mean(const float *sum, size_t n, uint64_t total, float *out)
{
	double t = (double)total;
	for (size_t i = 0; i < n; i++)
		out[i] = (float)((double)sum[i] / t);
}

static json_t *sketch_array(const double *x, int k)
{
	json_t *a = json_array();
	for (int j = 0; a && j < k; j++)
		if (json_array_append_new(a, json_real(x[j]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

json_t *cl_round_sketches_json(const allreduce_result *res)
{
	int k = res->sketch_k;
	if (k <= 0)
		return NULL;
	json_t *recv = json_array();
	for (size_t i = 0; recv && i < res->n_recv; i++)
		if (json_array_append_new(recv,
		                          json_pack("{s:I, s:o*}", "aggregator",
		                                    (json_int_t)res->recv_from[i], "sketch",
		                                    sketch_array(res->recv_sketches + i * (size_t)k, k)))) {
			json_decref(recv);
			recv = NULL;
		}
	json_t *out = recv ? json_pack("{s:i, s:o}", "k", k, "received", recv) : NULL;
	if (!out || !res->agg_partials)
		return out;
	json_t *mem = json_array();
	for (size_t i = 0; mem && i < res->n_included; i++)
		if (json_array_append_new(mem, json_pack("{s:I, s:o*, s:f}", "host_id",
		                                         (json_int_t)res->included[i], "sketch",
		                                         sketch_array(res->agg_partials + i * (size_t)k, k),
		                                         "err", res->agg_errs[i]))) {
			json_decref(mem);
			mem = NULL;
		}
	json_t *agg = mem ? json_pack("{s:o, s:o*, s:f}", "members", mem, "result",
	                              sketch_array(res->agg_result, k), "result_err", res->agg_result_err)
	                  : NULL;
	if (agg && res->agg_group_sum &&
	    (json_object_set_new(agg, "group_sum", sketch_array(res->agg_group_sum, k)) ||
	     json_object_set_new(agg, "group_sum_err", json_real(res->agg_group_sum_err)))) {
		json_decref(agg);
		agg = NULL;
	}
	if (!agg || json_object_set_new(out, "aggregated", agg)) {
		json_decref(out);
		return NULL;
	}
	return out;
}
