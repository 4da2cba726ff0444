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
 * computed for the version until the round averages it (round.c). */
#ifndef CL_COMPUTE_H
#define CL_COMPUTE_H

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

/* Forward and backward over stream microbatch g; *loss (may be NULL) gets
 * the mean loss.  COT_ERR_INVALID when g is outside the session's range. */
cot_err cl_compute_microbatch(cl_compute *c, int64_t g, float *loss, cot_errbuf *eb);

/* Point the session at work unit w (of the same version) without touching
 * the model or its accumulated gradient: its shards replace the previous
 * unit's.  Errors as cl_compute_open; on error the session computes
 * nothing until retargeted successfully. */
cot_err cl_compute_retarget(cl_compute *c, const cl_work *w, const char *cache_dir, cot_errbuf *eb);

/* The session's model: parameters, optimizer state and the gradient sum. */
struct kern_model;
struct kern_model *cl_compute_model(cl_compute *c);

void cl_compute_close(cl_compute *c);

#endif
