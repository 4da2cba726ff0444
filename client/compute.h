/* cotrain client: computing gradients over a work unit's microbatches.
 *
 * A session holds the model of one (project, version) (loaded from the
 * work unit's checkpoint, or initialised from the project's seed when the
 * version has none) and the tokens of the work unit's shards.  Stream
 * microbatch g is microbatch m = g % mb_per_epoch of its epoch, made of
 * samples [m*B, (m+1)*B) with B = microbatch_size; sample j is tokens
 * [j*T, j*T + T + 1) of the dataset stream (T = seq_len): inputs the first
 * T, targets the last T.  Gradients of every sample are summed into the
 * model's gradient buffer (kern_backward_scaled with scale B).  A session
 * lives for one model version: it is retargeted to each new work unit of
 * that version, so the gradient sums over every microbatch the host
 * computed for the version until the round averages it (round.c).
 *
 * In local mode (the project's "mode": "local"; doc/design.md "Local
 * mode") the session also takes an inner optimizer step on its own copy of
 * the parameters after every inner_batch microbatches (kernels/local.h),
 * and cl_compute_finish turns the round's work into the peer's
 * contribution, samples x (theta_v - theta), with theta_v back in the
 * model. */
#ifndef CL_COMPUTE_H
#define CL_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "client/state.h"
#include "shared/common/error.h"

typedef struct cl_compute cl_compute;

/* Rough bytes a session for p needs (parameters, gradients, moments,
 * activations), to compare with the memory_max preference; 0 when the model
 * is unknown. */
int64_t cl_compute_memory_estimate(const cl_project *p);

/* Open a session for work unit w of project p; its files must be in
 * cache_dir.  Checks that the shards cover every token of [lo, keep_hi).
 * COT_ERR_CORRUPT (a bad checkpoint or shard), COT_ERR_INVALID (the model
 * or the shards do not fit the work unit: an impossible work unit),
 * COT_ERR_NOMEM. */
cot_err cl_compute_open(const cl_project *p, const cl_work *w, const char *cache_dir, cl_compute **out,
                        cot_errbuf *eb);

/* The GPU (CUDA device index) every session computes on from its next
 * microbatch, or -1 for the CPU; the daemon sets it from the preferences
 * (use_gpu, gpu_device, gpu_only_when_idle).  A session whose model the GPU
 * cannot take, or whose GPU failed, stays on the CPU (logged once). */
void cl_compute_use_gpu(int device);

/* What computed the last microbatch, for status: "CPU", "GPU 0 (NVIDIA
 * H100 80GB HBM3, bf16)", "CPU (GPU 0: ...why...)". */
void cl_compute_device_text(char *buf, size_t n);

/* Forward and backward over stream microbatch g (on the GPU when one is
 * bound: a GPU that fails falls back to the CPU for the same microbatch
 * and the ones whose gradient it held, nothing lost); *loss (may be NULL)
 * gets
 * the mean loss; in local mode an inner step when the inner batch is full.
 * COT_ERR_INVALID when g is outside the session's range (or a gradient is
 * not finite in local mode), COT_ERR_CONFLICT after cl_compute_finish. */
cot_err cl_compute_microbatch(cl_compute *c, int64_t g, float *loss, cot_errbuf *eb);

/* Test hook (COTRAIN_CHEAT=skip-half, client/cheat.h): count stream
 * microbatch g as done without computing it, logging a made-up sketch (a
 * copy of the last one) and adding the last computed microbatch's gradient
 * to the sum again, which the sketch then matches.  COT_ERR_INVALID when g
 * is outside the range. */
cot_err cl_compute_fake_microbatch(cl_compute *c, int64_t g, cot_errbuf *eb);

/* Sketch, from now on in this version, every microbatch the session
 * computes under seed with k values (shared/common/sketch.h): the sketch of
 * the gradient sum's change, so a microbatch's sketch is its gradient's to
 * fp32 summation rounding.  Nothing in local mode (inner steps move the
 * parameters, so a microbatch's gradient cannot be recomputed on theta_v
 * alone) nor when it sketches with this seed and k already.
 * COT_ERR_CONFLICT when this version's microbatches were sketched under
 * another seed, COT_ERR_INVALID (k), COT_ERR_NOMEM. */
cot_err cl_compute_sketch_on(cl_compute *c, uint64_t seed, int k, cot_errbuf *eb);

/* The k values (cl_compute_sketch_k) of each sketch of stream microbatches
 * [g, g + n) into out[n * k], the latest when one was computed twice.
 * COT_ERR_NOT_FOUND when one was not sketched. */
cot_err cl_compute_sketches(const cl_compute *c, int64_t g, int64_t n, double *out, cot_errbuf *eb);

/* The gradient of b consecutive microbatches of the version, kept for the
 * check under a second seed (doc/credit.md, "A second seed"): count stream
 * microbatches from first, grad their gradient sum (n_params values). */
typedef struct {
	int64_t first, count;
	float *grad;
} cl_block;

/* Keep, from now on, the gradient of each block of b consecutive sketched
 * microbatches of this version (a block also ends where the microbatches
 * stop being consecutive, at cl_compute_retarget, so that a block lies in
 * one work unit, and at cl_compute_take_blocks).  A no-op in
 * local mode, when not sketching, or with the same b again; another b for
 * the same version (the project changed) applies to the blocks after the
 * open one.  COT_ERR_INVALID for b above CL_BLOCK_MAX, COT_ERR_NOMEM.
 * Memory: n_params floats per block, plus one copy of the gradient. */
cot_err cl_compute_blocks_on(cl_compute *c, int b, cot_errbuf *eb);

/* Close the open block and hand every kept block of this version to the
 * caller (*out, *n; free with cl_blocks_free); the session keeps none
 * after.  *out NULL with *n 0 when none are kept (not asked for, or
 * memory ran out: the blocks then no longer add up to the gradient). */
void cl_compute_take_blocks(cl_compute *c, cl_block **out, size_t *n);

void cl_blocks_free(cl_block *b, size_t n);

/* The session's sketch size, 0 when it does not sketch. */
int cl_compute_sketch_k(const cl_compute *c);

/* The seed the session sketches under (meaningful when cl_compute_sketch_k
 * is not 0): the round's, which the averaged bytes are sketched under too. */
uint64_t cl_compute_sketch_seed(const cl_compute *c);

/* Point the session at work unit w of project p without touching the
 * model or its accumulated gradient: its shards replace the previous
 * unit's; in local mode, the inner optimizer the unit brings (its
 * version's) replaces the session's between rounds (COT_ERR_CONFLICT when
 * it differs once the round's inner steps have begun).  Errors as
 * cl_compute_open; on error the session computes nothing until retargeted
 * successfully. */
cot_err cl_compute_retarget(cl_compute *c, const cl_project *p, const cl_work *w, const char *cache_dir,
                            cot_errbuf *eb);

/* 1 when the session trains in local mode. */
int cl_compute_is_local(const cl_compute *c);

/* 1 when, in local mode, a GPU failed with the round's inner state on it
 * and computing the round again on the CPU failed too: the session's
 * gradient of this version is unusable (the daemon drops it), and
 * cl_compute_finish refuses. */
int cl_compute_round_lost(const cl_compute *c);

/* Local mode: end the round's inner steps (a partial inner batch takes a
 * last step), leave the contribution in the model's gradient buffer and
 * theta_v in its parameters; *samples (may be NULL) gets the samples of
 * the round.  No microbatch may follow until cl_compute_next_version.  In
 * sync mode nothing happens (the gradient sum is the contribution).
 * COT_ERR_INVALID (a gradient that is not finite), COT_ERR_CONFLICT
 * (called twice), COT_ERR_IO (cl_compute_round_lost); the round is lost
 * then. */
cot_err cl_compute_finish(cl_compute *c, int64_t *samples, cot_errbuf *eb);

/* After the round's step: the model holds v+1; zero the gradient, forget
 * the sketches and, in local mode, start the next round's inner steps from
 * it. */
void cl_compute_next_version(cl_compute *c);

/* The session's model: parameters, optimizer state and the gradient sum,
 * all in host memory (a gradient the GPU held is brought home first).
 * COT_ERR_IO or another error only when the GPU failed holding part of the
 * gradient and computing that part again on the CPU failed too: the
 * gradient then lacks microbatches, and *m is NULL. */
struct kern_model;
cot_err cl_compute_model(cl_compute *c, struct kern_model **m, cot_errbuf *eb);

void cl_compute_close(cl_compute *c);

#endif
