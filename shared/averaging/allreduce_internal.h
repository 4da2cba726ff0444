/* cotrain: the state one allreduce_run call shares between its threads
 * (private to shared/averaging/allreduce*.c; see allreduce.c for the
 * threads and the pipelining).
 *
 * Everything sits in one struct run under one mutex; per member of the
 * group, one struct member_state holds what we know of it both as an
 * aggregator (its slice of our range) and as a member (our exchange with
 * it as the aggregator of its range).  Waits are bounded by the call's
 * deadlines. */
#ifndef COT_ALLREDUCE_INTERNAL_H
#define COT_ALLREDUCE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "shared/averaging/allreduce.h"
#include "shared/common/deadline.h"
#include "shared/common/fault.h"
#include "shared/peer/hello.h"
#include "shared/common/log.h"

/* Values per slice part and result part: a multiple of COMP_BLOCK, so that
 * the encodings of the parts, laid end to end, are the encoding of the whole
 * range (BLOCK8 blocks never straddle two parts).  Small (64 KiB of fp32),
 * because a result part waits for the part of the slowest sender, who
 * shares its uplink among all aggregators: at 8 Mbit/s a 1 MiB part took a
 * second, and the first results came that late. */
#define PART_VALUES ((size_t)COMP_BLOCK * 4)

enum { C_NONE, C_OK, C_REFUSED, C_FAILED };  /* member_state.state */
enum { AGG_PENDING, AGG_RESULT, AGG_ABORT }; /* run.agg_state */

typedef struct run run;

typedef struct {
	run *r;
	size_t idx; /* its index in p->members */

	/* Aggregator side: its contribution to our range. */
	int state;                    /* C_* */
	float *data;                  /* a_len values while C_OK; freed by run_free */
	char reason[160];             /* why it was refused or failed */
	size_t parts_in;              /* slice parts taken */
	unsigned char claimed;        /* a connection identified as its slice one */
	uint64_t claimed_samples;     /* p->claimed_samples: the samples its SLICE named */
	unsigned char claimed_stream; /* a stream connection from it */
	unsigned char stream_end;     /* once its stream connection was served: 1 every
	                               * part and STREAM_END 1 went out, 2 not */

	/* Member side, when it aggregates a range: our exchange with it. */
	int64_t *rep; /* its ACCEPTED report, ascending ids */
	size_t rep_n;
	int64_t *rids; /* the included ids its RESULT named */
	size_t rids_n;
	uint64_t rtotal;           /* the total samples its RESULT named */
	unsigned char st_done;     /* our streamer for it ended */
	size_t st_parts;           /* result parts the streamer decoded */
	unsigned char st_complete; /* it got every part and STREAM_END 1 */
	unsigned char st_abandon;  /* the sender takes the result parts from the
	                               * slice connection: the streamer must not
	                               * decode any more */
	unsigned char st_busy;     /* the streamer is decoding a part into out */
	size_t pace_next;          /* the next part our sender sends */
	unsigned char pacing;      /* our sender is sending parts */
	double sk_time;            /* seconds our sender thread spent sketching its result */
	pthread_t sender_th, streamer_th;
	int have_sender, have_streamer;
} member_state;

struct run {
	const allreduce_params *p;
	float *out;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* every change of the shared state */
	pthread_cond_t pace_cv; /* a sender advanced (pacing only) */
	member_state *m;        /* p->n, by member index */
	int64_t t0;             /* when the call started (deadline clock), for traces */

	/* aggregator side */
	int agg; /* our range is not empty */
	size_t a_len;
	size_t n_parts; /* of our range */
	size_t arrived; /* remote members done sending (any outcome) */
	int frozen;
	unsigned char *acc_payload; /* our ACCEPTED message, once frozen */
	size_t acc_len;
	int agg_state;
	unsigned char *res_payload; /* our RESULT message, once AGG_RESULT */
	size_t res_len;
	unsigned char *fin_bytes; /* the result encoding of our range, when it is not
	                               * the streamed one: sent in parts before RESULT */
	char abort_reason[256];
	int stop_accept;
	pthread_t acceptor;
	int have_acceptor;
	size_t *order;             /* member indices by ascending host id */
	int spec_ok;               /* still streaming the sum over all members */
	int spec_busy;             /* a thread is summing part spec_done */
	size_t spec_done;          /* parts summed and encoded into spec_bytes */
	unsigned char *spec_bytes; /* result encoding of our whole range */
	float *spec_tmp;           /* PART_VALUES, for the one busy thread */
	const float **spec_x;      /* p->n, for the one busy thread */

	/* sketches (p->sketch_k), as data arrives: by member index, k each */
	double *sk_part;    /* aggregator: each member's slice of our range, decoded */
	double *sk_err2;    /* the square of its encoding error bound */
	double *sk_recv;    /* member: each aggregator's result as we decoded it */
	double *sk_res;     /* aggregator: our result as every member decodes it */
	double sk_res_err2; /* the square of its rounding and encoding bound */
	double sk_time;     /* seconds sketching slices (mu held) */
	double sk_time_res; /* seconds sketching our result (one thread at a time) */
	/* aggregator with p->cross: the group's sum of our range, and the
	 * square of its rounding bound */
	double *sk_gsum;
	double sk_gsum_err2;
	/* with cross and keep_slices: our range of the group's sum before the
	 * stage across groups (a_len values; handed to the result) */
	float *gsum_kept;

	/* member side */
	size_t rep_pending; /* ACCEPTED reports still to come */
	int failed;
	cot_errbuf feb; /* why, once failed */
	int64_t *fin;   /* p->n: the included set, ascending */
	size_t n_fin;
	uint64_t total; /* samples of the included set */
};

/* A debug line of the exchange's timeline: milliseconds since the call
 * started, so that the lines of all members (started together) line up. */
#define TRACE(r, fmt, ...) \
	log_debug("allreduce host %lld +%lld ms: " fmt, (long long)(r)->p->members[(r)->p->self].host_id, \
	          (long long)(deadline_now_ms() - (r)->t0), __VA_ARGS__)

/* ---- allreduce.c: helpers of both sides ---- */

/* Wait on cv (with r->mu held) for at most 100 ms and never past deadline;
 * 0 once the deadline has passed.  ar_wait waits on r->cv. */
int ar_wait_on(run *r, pthread_cond_t *cv, int64_t deadline);
int ar_wait(run *r, int64_t deadline);

/* Record the first member-side failure and wake everyone (mu not held). */
void ar_fail(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bound the unsent bytes of a connection we are about to use (best effort). */
void ar_tune_socket(int fd);

/* Index of host_id in p->members, or -1. */
int ar_member_index(const allreduce_params *p, int64_t host_id);

/* Parts of member a's range; the length of a member's range. */
size_t ar_parts_of(const allreduce_params *p, size_t a);
uint64_t ar_range_len(const allreduce_member *m);

/* The values of part k of a range of len values: [k * PART_VALUES, +n). */
size_t ar_part_len(size_t len, size_t k);

/* Our HELLO for this round. */
hello_msg ar_our_hello(const allreduce_params *p);

int64_t ar_min64(int64_t a, int64_t b);
int ar_cmp_i64(const void *a, const void *b);

/* ---- allreduce_aggregator.c ---- */

/* Take our own slice of our range through the same encoding and checks as
 * any member's (mu not held).  COT_ERR_NOMEM when it cannot be encoded. */
cot_err ar_agg_take_own(run *r, cot_errbuf *eb);

/* Acceptor thread (arg: run *): accepts connections until stop_accept or
 * the deadline, one handler thread each, and joins them before it ends. */
void *ar_acceptor_main(void *arg);

/* Wait until every remote member sent its slice (or collect_deadline),
 * then freeze: refuse the incomplete and the outliers, and publish our
 * ACCEPTED report (mu held).  On failure our range is aborted. */
void ar_agg_collect(run *r);

/* Reduce our range over the included set r->fin and publish our RESULT
 * (mu held).  On failure our range is aborted and the run failed. */
void ar_agg_reduce(run *r);

/* Give up our range (mu held): handlers send ABORT with reason. */
void ar_agg_abort(run *r, const char *reason);

/* Stop streaming and wait until no thread is summing (mu held). */
void ar_spec_stop(run *r);

/* ---- allreduce_sketch.c ---- */

/* Fill res's sketches (allreduce.h) once the exchange succeeded
 * (p->sketch_k > 0; mu not held): the slices' and received results'
 * sketches taken as they arrived, our result's now; with p->keep_slices
 * the included members' slices move to res (the threads are joined).
 * COT_ERR_NOMEM leaves in *res what allreduce_result_free frees. */
cot_err ar_sketch_result(run *r, allreduce_result *res, cot_errbuf *eb);

/* Add the sketch of x[0..n), values [first, first + n) of the vector, to
 * row[0..k) and the square of its error bound (comp_error_bound(kind, x,
 * n, rel)) to *err2 (NULL: none), when p->sketch_k > 0 and row is not
 * NULL.  Linear and range-splittable: parts add up to the whole.
 * Returns the seconds it took (for allreduce_result.sketch_s). */
double ar_sketch_part(const allreduce_params *p, const float *x, size_t n, uint64_t first, int kind,
                      double rel, double *row, double *err2);

/* Test hook: add p->test_result_noise |x[i]| with a pseudo-random sign to
 * each of x[0..n), the values [first, first + n) of the vector. */
void ar_test_noise(const allreduce_params *p, uint64_t first, float *x, size_t n);

/* ---- allreduce_member.c ---- */

/* Sender thread (arg: member_state * of the aggregator): sends our slice,
 * reads its ACCEPTED and RESULT into the member_state.  Never returns an
 * error: a failure goes through ar_fail. */
void *ar_sender_main(void *arg);

/* Streamer thread (arg: member_state * of the aggregator): the stream
 * connection; records what arrived and never fails the run by itself. */
void *ar_streamer_main(void *arg);

/* Our sender to aggregator a sent a part (next is its next one), or stopped
 * (next = SIZE_MAX): wake the senders that wait on it (mu not held). */
void ar_pace_done(run *r, size_t a, size_t next);

#endif
