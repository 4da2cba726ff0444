/* cotrain: butterfly all-reduce of a gradient within one averaging group.
 *
 * Each member holds a gradient SUM over its own samples (fp32, V values) and
 * aggregates one contiguous range of the vector (server/load_balance.h;
 * empty for members that cannot accept connections).  Every member sends
 * each aggregator its slice; each aggregator checks the contributions,
 * agrees with the others on one included set, sums exactly that set and
 * returns the same bytes to every member.  doc/averaging.md gives the
 * messages and the fault rule; in short:
 *
 *   - a sender that fails, stalls past the collect deadline, or whose slice
 *     is refused (NaN/Inf, norm outlier, malformed) by ANY aggregator is
 *     dropped by ALL of them (the included set is the intersection of every
 *     aggregator's ACCEPTED report), and its samples are reported dropped;
 *   - an aggregator that fails aborts the round for the whole group with
 *     COT_ERR_NETWORK: no member ever ends with part of the vector
 *     un-averaged.  The server then fails the whole round, every range goes
 *     back to the pool, and the round opens again as its next attempt.
 *
 * The output is the group SUM (not the mean) plus the total samples, so that
 * a later stage across groups can add sums before one division.  The sum is
 * exact up to one rounding: each aggregator adds the included contributions
 * (as decoded from the wire) in ascending host id order in double and rounds
 * to fp32 once, then applies result_comp once; every member decodes the same
 * bytes.  With ALLREDUCE_CENTERED_CLIP each aggregator instead combines its
 * range with CenteredClip (shared/averaging/centered_clip.h) over the same
 * ordered set, once the whole of every slice is in (no result is streamed
 * while slices arrive), and returns total samples x the result.  With a
 * stage across groups (cross below, cross_group.h) each aggregator makes
 * its range's sum the round's mean before returning it. */
#ifndef COT_ALLREDUCE_H
#define COT_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "shared/averaging/compress.h"
#include "shared/peer/dialer.h"
#include "shared/common/error.h"
#include "shared/common/sketch.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"

/* Averaging message types (the 0x10..0x1f range of frame.h). */
#define ALLREDUCE_FRAME_SLICE 0x10    /* FRAME_SLICE: sender -> aggregator */
#define ALLREDUCE_FRAME_RESULT 0x11   /* FRAME_RESULT: aggregator -> sender */
#define ALLREDUCE_FRAME_ABORT 0x12    /* FRAME_ABORT: aggregator -> sender */
#define ALLREDUCE_FRAME_ACCEPTED 0x13 /* aggregator -> sender: whom it accepted */

#define ALLREDUCE_MAX_MEMBERS 256

/* How an aggregator combines the included contributions to its range. */
typedef enum {
	ALLREDUCE_SUM,           /* the exact sum (allreduce_sum): the default */
	ALLREDUCE_CENTERED_CLIP, /* CenteredClip (centered_clip.h), scaled back to a sum */
	/* The stage across groups (cross_group.h): the sum in double divided by
	 * the included samples, rounded to fp32 once. */
	ALLREDUCE_MEAN
} allreduce_aggregation;

/* The stage across groups (shared/averaging/cross_group.h), called by our
 * aggregator once its range's group sum is known (mu of the call not
 * held): sum[0..end - start) holds the group's sum of the values
 * [start, end) over group_samples samples; on COT_OK it holds the round's
 * mean of those values, identical at every peer of every group.  Any error
 * aborts our range (the group fails, as when an aggregator fails). */
typedef cot_err (*allreduce_cross_fn)(void *arg, float *sum, uint64_t start, uint64_t end,
                                      uint64_t group_samples, cot_errbuf *eb);
#define ALLREDUCE_OUTLIER_DEFAULT 10.0 /* norm per sample above 10x the median */

typedef struct {
	int64_t host_id;  /* > 0, unique in the group */
	const char *addr; /* numeric address of its listener (aggregators) */
	uint16_t port;
	uint64_t start, end; /* the range [start, end) it aggregates; may be empty */
	uint64_t samples;    /* samples in its gradient sum */
} allreduce_member;

typedef struct {
	const allreduce_member *members; /* n members; ranges tile [0, len) */
	size_t n;
	size_t self;       /* our index in members */
	int64_t round;     /* model version being averaged (HELLO round) */
	const float *grad; /* our gradient sum, len values */
	size_t len;
	int send_comp;                     /* comp_kind of slices (the group agrees) */
	int result_comp;                   /* comp_kind of results */
	double outlier_factor;             /* 0: ALLREDUCE_OUTLIER_DEFAULT; < 0: off */
	peer_ctx *ctx;                     /* our identity */
	dialer *dialer;                    /* to reach the aggregators */
	listener *lst;                     /* ours; needed when our range is not empty */
	int64_t collect_deadline;          /* slices must have arrived by then */
	int64_t deadline;                  /* the whole exchange ends by then */
	allreduce_aggregation aggregation; /* what our aggregator computes */
	double clip_tau;                   /* CenteredClip's tau and iterations */
	int clip_iters;
	int no_stream; /* 1: open no stream connections; every
	                                   * aggregator then sends us its result on
	                                   * the slice connection (one connection
	                                   * per aggregator instead of two) */
	/* Sketches of what was averaged (doc/credit.md, "Tied to the bytes"):
	 * with sketch_k 1..SKETCH_K_MAX, *res gets, under sketch_seed, the
	 * partial sketch of each included member's slice of our range as we
	 * decoded it, of the result of our range, and of every aggregator's
	 * result as we decoded it; 0: none. */
	uint64_t sketch_seed;
	int sketch_k;
	/* With sketch_k: 1 hands each included member's slice of our range, as
	 * we decoded it, to *res (agg_slices), and with cross our range of the
	 * group's sum before the stage across groups (agg_group_sum_values),
	 * for the sketches under the second seed drawn once the round commits
	 * (doc/credit.md). */
	int keep_slices;
	/* With cross: our aggregator turns its range's group sum into the
	 * round's mean through cross(cross_arg, ...) before it returns it, so
	 * the result every member gets is the round's MEAN, not the group's
	 * sum.  Nothing is streamed, and our acceptor stops once the slices
	 * are frozen (the stage across groups accepts on the same listener);
	 * members must set no_stream. */
	allreduce_cross_fn cross;
	void *cross_arg;
	/* The stage across groups itself: members[].samples of the others are
	 * not known in advance (0): each sender's SLICE names its samples
	 * (>= 1), and the total is what the RESULTs name. */
	int claimed_samples;
	/* Dial an aggregator again every 50 ms until collect_deadline when a
	 * connection fails: across groups its acceptor may refuse our HELLO as
	 * for another round (it is still in an earlier stage on the same
	 * listener), and such a refusal drops nobody. */
	int retry_refused;
	/* Test hook (client/cheat.h only): our aggregator adds noise of this
	 * relative size to the sum it returns; 0 in every real use. */
	double test_result_noise;
} allreduce_params;

typedef struct {
	int64_t host_id;
	uint64_t samples;
	char reason[160]; /* why (only when we refused it ourselves) */
} allreduce_drop;

typedef struct {
	uint64_t total_samples; /* samples of the included contributions */
	int64_t *included;      /* ascending host ids; n_included */
	size_t n_included;
	allreduce_drop *dropped; /* members left out, with their samples */
	size_t n_dropped;
	uint64_t dropped_samples;
	allreduce_drop *refused; /* senders our aggregator refused, and why */
	size_t n_refused;
	/* With p->sketch_k (k below), all sketches k values each, in double: */
	int sketch_k;
	double *agg_partials;  /* n_included x k: each included member's slice of
	                        * our range as decoded (order of included); NULL
	                        * when our range is empty */
	double *agg_errs;      /* n_included: a bound on the L2 norm of the wire
	                        * encoding's error in each (comp_error_bound) */
	double *agg_result;    /* k: our range of the result we returned, decoded */
	double agg_result_err; /* bound on its fp32 rounding and encoding error */
	int64_t *recv_from;    /* n_recv aggregators (non-empty ranges, us too) */
	double *recv_sketches; /* n_recv x k: their results as we decoded them */
	size_t n_recv;
	/* With cross: our range of the group's sum before the stage across
	 * groups made it the mean (what the partials add up to), k values, and
	 * a bound on its fp32 rounding; else NULL. */
	double *agg_group_sum;
	double agg_group_sum_err;
	/* With cross, p->keep_slices and a non-empty range: the values
	 * agg_group_sum sketches (our range's length); else NULL. */
	float *agg_group_sum_values;
	/* With p->keep_slices and a non-empty range: n_included slices of our
	 * range (order of included), each as we decoded it (the values we
	 * summed), its length values; else NULL. */
	float **agg_slices;
	double sketch_s; /* seconds spent sketching, all threads together (taken
	                  * as the data arrived, mostly beside the transfers) */
} allreduce_result;

/* Run the all-reduce for member p->self.  On COT_OK out[0..len) holds the
 * group's gradient SUM, or with p->cross the round's MEAN (identical bytes
 * at every member that succeeds) and
 * *res what was included and dropped; free it with allreduce_result_free.
 * Errors: COT_ERR_INVALID for bad parameters (nothing sent);
 * COT_ERR_NETWORK when some aggregator's range could not be reduced or the
 * aggregators disagreed (the round must be rerun without the failed peer;
 * eb names it); COT_ERR_NOMEM.  Returns by p->deadline (plus the time to
 * tear down threads, which is bounded by the same deadline). */
cot_err allreduce_run(const allreduce_params *p, float *out, allreduce_result *res, cot_errbuf *eb);

/* The all-reduce of a group of one (p->n 1, p->self 0, its range all of
 * [0, p->len)): out[0..len) = p->grad exactly (nothing is sent within the
 * group, nothing encoded), or with p->cross what cross(cross_arg, out, 0,
 * len, samples) makes of it (the round's mean), and *res as
 * allreduce_run's: the member included with its samples, and with
 * p->sketch_k the sketches of an aggregator of the whole vector that
 * received its own result (partial: of p->grad; result and received: of
 * out; with cross, group_sum: of p->grad; error bounds 0), with
 * p->keep_slices its slice (a copy of p->grad, and with cross another in
 * agg_group_sum_values).  Only members, n, self, grad, len, sketch_seed,
 * sketch_k, keep_slices, cross and cross_arg are read.  COT_ERR_INVALID
 * for other parameters, COT_ERR_NOMEM, or cross's error; *res is empty on
 * error, else freed with allreduce_result_free. */
cot_err allreduce_alone(const allreduce_params *p, float *out, allreduce_result *res, cot_errbuf *eb);

void allreduce_result_free(allreduce_result *res);

/* The exact arithmetic every aggregator uses, for tests and the server:
 * out[i] = (float)(sum over k of (double)x[k][i]), k ascending as given. */
void allreduce_sum(const float *const *x, size_t k, size_t len, float *out);

#endif
