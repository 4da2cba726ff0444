/* cotrain kernels: the inner steps of local mode (DiLoCo; doc/design.md
 * "Local mode").
 *
 * In local mode a peer trains its own copy of the parameters during the
 * round of version v.  Each microbatch's gradient is summed into m->grads as
 * in sync mode (kern_backward_scaled with scale B); after every inner_batch
 * microbatches kern_local_microbatch takes one inner step:
 *   - the inner batch's mean gradient, g[i] = (float)((double)g[i] / s) with
 *     s its samples, as the round's mean is rounded in sync mode;
 *   - kern_opt_step_with with the project's "optimizer" settings, the
 *     learning rate of schedule step v (the ROUND's step: every inner step
 *     of a round uses the same rate) and the bias corrections of the inner
 *     step count t = 1, 2, ... of this round, on moments that start at zero
 *     every round.  DiLoCo keeps each worker's inner moments across rounds;
 *     a volunteer comes and goes, so here nothing of a round outlives it
 *     but what the checkpoint holds (theta_{v+1} and the outer momentum);
 *   - m->grads zeroed.
 * kern_local_finish flushes a partial inner batch with one last inner step
 * over its samples (so every sample computed moves the parameters), writes
 * the peer's contribution to the round into m->grads,
 *   c[i] = (theta_v[i] - theta[i]) * (float)S    (both in float)
 * with S the samples of the whole round, and puts theta_v back into
 * m->params: the all-reduce of "sums with sample counts" then yields the
 * sample-weighted mean pseudo-gradient, and every peer and the server apply
 * the outer step (kern_opt_outer_step) to theta_v.
 *
 * On a GPU (kernels/gpu.h) the inner steps run there, where the
 * parameters and the inner moments then stay from step to step, whenever
 * the inner batch's whole gradient is there (kern_gpu_can_step: the model
 * keeps its gradient on the GPU and none of it was brought home); else
 * the state comes home and the step runs on the CPU.  Both take the same
 * float operations (kern_opt_step_gpu): the same bits from the same
 * gradient.  A GPU with no room for the moments leaves the inner steps on
 * the CPU (kern_local_gpu_off).
 *
 * The client's session (client/compute.c) and the replay trainer
 * (tests/replay_rounds.c) both run the inner steps through here. */
#ifndef KERN_LOCAL_H
#define KERN_LOCAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "shared/common/error.h"

typedef struct kern_local kern_local;

/* State for the inner steps of a model of m's size: theta_v and two
 * moments, 3 n_params floats.  inner is copied.  On success the caller owns
 * *out (kern_local_free); then call kern_local_begin.  COT_ERR_INVALID (a bad
 * inner config, inner_batch below 1), COT_ERR_NOMEM. */
cot_err kern_local_new(const kern_model *m, const kern_opt_config *inner, int inner_batch, kern_local **out,
                       cot_errbuf *eb);
void kern_local_free(kern_local *l);

/* Take inner (copied) as the inner optimizer from now on: between rounds
 * only (before the round's first microbatch, or after kern_local_finish),
 * for a project whose optimizer changes from a version on
 * (doc/project-file.md "Changes during a run").  COT_ERR_INVALID (a bad
 * config), COT_ERR_CONFLICT (the round's inner steps have begun). */
cot_err kern_local_set_inner(kern_local *l, const kern_opt_config *inner, cot_errbuf *eb);

/* Start a round from m as it is: theta_v = m->params, moments and counters
 * zero, the schedule's step m->step; zeroes m->grads. */
void kern_local_begin(kern_local *l, kern_model *m);

/* Count one microbatch of `samples` samples whose gradient sum was just
 * added to m->grads, and take the inner step when the inner batch is full.
 * COT_ERR_INVALID (a gradient that is not finite; the round is lost then),
 * COT_ERR_CONFLICT after kern_local_finish, COT_ERR_NOMEM. */
cot_err kern_local_microbatch(kern_local *l, kern_model *m, int64_t samples, cot_errbuf *eb);

/* End the round: flush, contribution into m->grads, theta_v back into
 * m->params (see above); *samples (may be NULL) gets S.  Errors as
 * kern_local_microbatch; COT_ERR_CONFLICT when called twice. */
cot_err kern_local_finish(kern_local *l, kern_model *m, int64_t *samples, cot_errbuf *eb);

/* Bring the round's state on m's GPU home: the gradient it holds into
 * m->grads, the parameters and inner moments of inner steps taken there.
 * Before m leaves its GPU (kern_gpu_unbind), or anything reads m->params
 * mid-round.  COT_ERR_IO: the device failed and the round's state with it
 * (kern_local_restart). */
cot_err kern_local_home(kern_local *l, kern_model *m, cot_errbuf *eb);

/* Start the round over from theta_v, as kern_local_begin started it: after
 * the round's state was lost with a failed GPU, the caller then computes
 * the round's microbatches again (on the CPU). */
void kern_local_restart(kern_local *l, kern_model *m);

/* Whether the GPU had no room for the inner moments, so that the inner
 * steps run on the CPU for the rest of this state's life. */
bool kern_local_gpu_off(const kern_local *l);

/* Inner steps taken this round. */
long kern_local_steps(const kern_local *l);

#endif
