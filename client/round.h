/* cotrain client: the parts of a collaborative round that need no network
 * (doc/design.md, "The round"; doc/api.md, "Rounds").
 *
 * The daemon (daemon_round.c) reports its work units, fetches its averaging
 * plan, runs the all-reduce within its group (shared/averaging/allreduce.h), turns the
 * round's gradient sum into the mean every peer feeds its optimizer, takes
 * the step and reports the hash of its new parameters.  Here: the plan,
 * checked as hostile input, and the arithmetic that must be bit-identical
 * with the server's. */
#ifndef CL_ROUND_H
#define CL_ROUND_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "shared/averaging/allreduce.h"
#include "shared/averaging/cross_group.h"

#include "shared/peer/dialer.h"
#include "shared/common/error.h"

#define CL_PLAN_MAX_MEMBERS 256

typedef struct {
	int64_t host_id;
	char addr[DIALER_ADDR_MAX]; /* numeric address of its listener */
	uint16_t port;
	int64_t samples;
	uint64_t lo, hi; /* the elements it aggregates */
} cl_plan_member;

typedef struct {
	int64_t version, attempt;
	int64_t group, n_groups;
	int64_t round_samples; /* across every group */
	int64_t param_count;
	int64_t deadline;  /* unix seconds (server clock) */
	int comp;          /* comp_kind for slices and results */
	int centered_clip; /* aggregators combine with CenteredClip (else the exact sum) */
	double clip_tau;
	int clip_iters;
	size_t n; /* members of our group, ascending host id */
	cl_plan_member members[CL_PLAN_MAX_MEMBERS];
	size_t self;      /* our index in members */
	int has_gradient; /* the server's mean exists (several groups) */
	char gradient_sha256[65];
	int64_t gradient_samples;
	char params_sha256[65]; /* the server's v+1, when known ("" else) */
	/* "cross_group": "peers" (doc/averaging.md, "Across groups"): the
	 * peers average across groups themselves; the server takes only the
	 * mean's hash and one peer's v+1. */
	int cross_peers;
	cross_slice *cross; /* the slices of our range across groups (n_cross,
	                     * ascending; NULL when we aggregate nothing or there
	                     * is one group); cl_plan_free */
	size_t n_cross;
	cross_holder *cross_holders; /* every slice's holders, end to end */
} cl_plan;

#define CL_PLAN_MAX_HOLDERS 65536 /* holders of all our slices together */

/* Parse and check a plan answer for host_id and version: members ascending
 * and unique, ranges tiling [0, param_count) in order, endpoints numeric,
 * samples > 0, ourselves among them, param_count equal to the model's
 * (expect_params), compression and aggregation known ("mean", or
 * "centered_clip" with "centered_clip": {"tau", "iterations"}, BTARD's
 * defaults when absent).  COT_ERR_NETWORK with the detail
 * when the server sent something else. */
cot_err cl_plan_parse(const json_t *j, int64_t host_id, int64_t version, int64_t expect_params, cl_plan *out,
                      cot_errbuf *eb);

/* Free what cl_plan_parse allocated in p (the slices across groups) and
 * clear it; a cleared or zeroed plan is fine. */
void cl_plan_free(cl_plan *p);

/* "203.0.113.5:7070" or "[2001:db8::5]:7070" into a numeric address and a
 * port (1..65535).  COT_ERR_INVALID when it is anything else (no names:
 * nothing is looked up). */
cot_err cl_parse_endpoint(const char *s, char addr[DIALER_ADDR_MAX], uint16_t *port, cot_errbuf *eb);

/* The sketches of what our all-reduce averaged (allreduce_result, when
 * res->sketch_k > 0) as the outcome's "sketches" (doc/api.md, "Rounds"):
 * {"k", "received": [{"aggregator", "sketch"}], "aggregated": {"members":
 * [{"host_id", "sketch", "err"}], "result", "result_err"}} ("aggregated"
 * only when we aggregate a range).  A new reference, or NULL when there
 * are none or memory ran out. */
json_t *cl_round_sketches_json(const allreduce_result *res);

/* The round's mean from one group's sum, as the server computes it:
 * out[i] = (float)((double)sum[i] / (double)total).  out may be sum. */
void cl_round_mean(const float *sum, size_t n, uint64_t total, float *out);

#endif
