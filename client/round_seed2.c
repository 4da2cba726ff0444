/* cotrain client: the sketches under a round's second seed (see
 * round_seed2.h). */
#include "client/round_seed2.h"

#include <stdlib.h>
#include <string.h>

#include "shared/common/sketch.h"

/* The sketch of x[0..len), coordinates [first, first + len), as a JSON
 * array of k numbers (NULL when memory ran out). */
static json_t *sketch_json(const float *x, size_t len, uint64_t first, uint64_t seed, int k)
{
	double s[SKETCH_K_MAX] = { 0 };
	sketch_add(x, len, first, seed, k, s);
	json_t *a = json_array();
	for (int j = 0; a && j < k; j++)
		if (json_array_append_new(a, json_real(s[j]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

json_t *cl_seed2_sketches_json(const cl_seed2_kept *kp, uint64_t seed2)
{
	json_t *o = json_pack("{s:i}", "k", kp->k);
	json_t *recv = json_array();
	int bad = !o || !recv || json_object_set_new(o, "received", recv);
	for (size_t a = 0; !bad && kp->received && a < kp->n_aggs; a++) {
		uint64_t lo = kp->agg_lo[a], hi = kp->agg_hi[a];
		json_t *s = sketch_json(kp->received + lo, (size_t)(hi - lo), lo, seed2, kp->k);
		bad = !s || json_array_append_new(recv, json_pack("{s:I, s:o}", "aggregator",
		                                                  (json_int_t)kp->agg_id[a], "sketch", s));
	}
	if (!bad && kp->blocks_ok) {
		json_t *bl = json_array();
		bad = !bl || json_object_set_new(o, "blocks", bl);
		for (size_t b = 0; !bad && b < kp->n_blocks; b++) {
			json_t *s = sketch_json(kp->blocks[b].grad, kp->n, 0, seed2, kp->k);
			bad = !s ||
			      json_array_append_new(bl,
			                            json_pack("{s:I, s:I, s:o}", "first",
			                                      (json_int_t)kp->blocks[b].first, "count",
			                                      (json_int_t)kp->blocks[b].count, "sketch", s));
		}
	}
	if (!bad && kp->slices && kp->received && kp->hi > kp->lo) {
		size_t len = (size_t)(kp->hi - kp->lo);
		json_t *mem = json_array();
		json_t *res = sketch_json(kp->received + kp->lo, len, kp->lo, seed2, kp->k);
		bad = !mem || !res ||
		      json_object_set_new(o, "aggregated",
		                          json_pack("{s:o, s:o, s:f}", "members", mem, "result", res,
		                                    "result_err", kp->result_err));
		if (!bad && kp->group_sum) {
			json_t *gs = sketch_json(kp->group_sum, len, kp->lo, seed2, kp->k);
			bad = !gs || json_object_set_new(json_object_get(o, "aggregated"), "group_sum", gs) ||
			      json_object_set_new(json_object_get(o, "aggregated"), "group_sum_err",
			                          json_real(kp->group_sum_err));
		}
		for (size_t i = 0; !bad && i < kp->n_slices; i++) {
			if (!kp->slices[i])
				continue; /* not kept: that member's check is skipped */
			json_t *s = sketch_json(kp->slices[i], len, kp->lo, seed2, kp->k);
			bad = !s ||
			      json_array_append_new(mem, json_pack("{s:I, s:o, s:f}", "host_id",
			                                           (json_int_t)kp->slice_host[i], "sketch", s,
			                                           "err", kp->slice_err[i]));
		}
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

void cl_seed2_kept_free(cl_seed2_kept *kp)
{
	free(kp->received);
	for (size_t i = 0; kp->slices && i < kp->n_slices; i++)
		free(kp->slices[i]);
	free(kp->slices);
	free(kp->slice_host);
	free(kp->slice_err);
	free(kp->group_sum);
	cl_blocks_free(kp->blocks, kp->n_blocks);
	free(kp->included);
	memset(kp, 0, sizeof *kp);
}
