/* cotrain kernels: optimizers (AdamW, LAMB), schedule and clipping.
 *
 * Every peer applies the same step to the same averaged gradient and must
 * end with bit-identical parameters, so a step is deterministic: elementwise
 * float arithmetic in a fixed order (the library is built with
 * -ffp-contract=off, so no CPU fuses it differently), every reduction (the
 * global gradient norm, LAMB's per-tensor norms) summed in double over
 * fixed blocks of KERN_OPT_BLOCK elements whose partial sums are added in
 * block order, the schedule computed from IEEE operations only (no libm).
 * The thread count never changes a bit.
 *
 * Update rules, with g the gradient after clipping, t = step + 1:
 *   AdamW (PyTorch's torch.optim.AdamW):
 *     p -= lr wd p (decayed tensors only); m = b1 m + (1-b1) g;
 *     v = b2 v + (1-b2) g^2;
 *     p -= (lr / (1-b1^t)) m / (sqrt(v) / sqrt(1-b2^t) + eps)
 *   LAMB (You et al. 2019, as NVIDIA apex's FusedLAMB with use_nvlamb off):
 *     m, v as above; u = (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd p;
 *     per tensor: r = ||p|| / ||u|| (1 when either is 0);
 *     p -= lr r u
 * Decay and the trust ratio apply to tensors of 2 or more dimensions (the
 * embeddings and the linear weights); LayerNorm parameters and biases get
 * neither (wd 0, r = 1), as BERT's and GPT-2's recipes exclude them.
 * Clipping as PyTorch's clip_grad_norm_: with n the global L2 norm of all
 * gradients, g = grad * min(1, clip / (n + 1e-6)).
 *
 * The outer optimizer of local mode (DiLoCo; doc/design.md "Local mode"),
 * SGD with momentum as PyTorch's torch.optim.SGD (dampening 0), on the
 * round's mean pseudo-gradient d (in m->grads) with the momentum in m->m:
 *   mom = mu mom + d;  p -= lr (d + mu mom) (Nesterov) or p -= lr mom,
 * each element in float in exactly this order, no clipping, no decay. */
#ifndef KERN_OPTIMIZER_H
#define KERN_OPTIMIZER_H

#include <stdbool.h>

#include "kernels/model.h"
#include "shared/common/error.h"

#define KERN_OPT_BLOCK 8192

typedef enum { KERN_OPT_ADAMW = 0, KERN_OPT_LAMB = 1 } kern_opt_kind;

typedef enum {
	KERN_DECAY_NONE = 0, /* constant after warmup */
	KERN_DECAY_LINEAR,   /* to lr * min_lr_ratio at total_steps */
	KERN_DECAY_COSINE
} kern_decay_kind;

typedef struct {
	kern_opt_kind kind;
	float lr; /* peak learning rate */
	float beta1, beta2, eps;
	float weight_decay;
	float clip_norm;   /* global gradient-norm clip; 0: off */
	long warmup_steps; /* linear warmup: step s uses lr (s+1)/warmup */
	long total_steps;  /* end of the decay; ignored for KERN_DECAY_NONE */
	kern_decay_kind decay;
	float min_lr_ratio; /* floor of the decay, in [0, 1] */
} kern_opt_config;

typedef struct {
	double grad_norm; /* global L2 norm before clipping */
	float clip_coef;  /* factor applied to the gradients (1: none) */
	float lr;         /* learning rate used */
} kern_opt_stats;

/* Defaults: AdamW lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1; LAMB lr 1e-3
 * (sahajBERT used 1.76e-3 at batch 4096), betas 0.9/0.999, eps 1e-6, wd 0.01;
 * both clip 1.0, warmup 0, no decay, min ratio 0.1. */
void kern_opt_default(kern_opt_config *o, kern_opt_kind kind);

/* COT_OK or COT_ERR_INVALID naming the bad field. */
cot_err kern_opt_validate(const kern_opt_config *o, cot_errbuf *eb);

/* Learning rate for step index s (0 for the first step):
 *   s < warmup:      lr (s + 1) / warmup
 *   then, with q = (s - warmup) / (total - warmup) clamped to [0, 1]:
 *   linear: lr (1 - q (1 - min)); cosine: lr (min + (1 - min)(1 + cos(pi q))/2)
 * Computed in double from basic operations, rounded to float. */
float kern_opt_lr(const kern_opt_config *o, long s);

/* Whether tensor v takes weight decay and LAMB's trust ratio. */
bool kern_opt_decays(const kern_view *v);

/* Global L2 norm of m->grads, summed as described above. */
double kern_grad_norm(const kern_model *m);

/* One optimizer step on m->params, m->m and m->v from m->grads (which are
 * not changed), then m->step++.  st may be NULL.  COT_ERR_INVALID for a bad
 * config or a gradient that is not finite (nothing is changed then),
 * COT_ERR_NOMEM. */
cot_err kern_opt_step(kern_model *m, const kern_opt_config *o, kern_opt_stats *st, cot_errbuf *eb);

/* The same step on m->params from m->grads with the moments mom1 and mom2
 * (n_params floats each, updated) instead of m->m and m->v: the learning
 * rate of schedule step lr_step, the bias corrections of step t >= 1.
 * m->step, m->m and m->v are left alone.  kern_opt_step is this with
 * (m->m, m->v, m->step, m->step + 1) and then m->step++; local mode's inner
 * steps (kernels/local.h) use it with their own moments.  Errors as
 * kern_opt_step, and COT_ERR_INVALID for t < 1. */
cot_err kern_opt_step_with(kern_model *m, const kern_opt_config *o, float *mom1, float *mom2, long lr_step,
                           long t, kern_opt_stats *st, cot_errbuf *eb);

/* kern_opt_step_with's step on the GPU m is bound to (kernels/gpu.h),
 * for local mode's inner steps (kernels/local.h): the gradient the GPU
 * holds, first divided by divisor (g = (float)((double)g / divisor), as
 * local mode takes the inner batch's mean), updates the GPU's parameters
 * and inner moments, which stay there; its gradient is zeroed.  moments
 * (kernels/gpu.h): KERN_GPU_MOM_ZERO or KERN_GPU_MOM_UP (from mom1, mom2)
 * to set the GPU's moments first, KERN_GPU_MOM_KEEP to go on from those.  Every
 * scalar is computed here as the CPU's step computes it and every element
 * there in the CPU's operations (kernels/cuda/cuda_optimizer.h): the same
 * bits as kern_opt_step_with on the same gradient.  COT_ERR_CONFLICT when
 * kern_gpu_can_step is false; COT_ERR_NOMEM when the GPU cannot hold the
 * moments (nothing is changed then); COT_ERR_INVALID for a bad config or a
 * gradient that is not finite (the GPU's gradient is divided then, nothing
 * else changed); COT_ERR_IO when the device failed (what it held is lost). */
cot_err kern_opt_step_gpu(kern_model *m, const kern_opt_config *o, float *mom1, float *mom2, int moments,
                          long lr_step, long t, double divisor, kern_opt_stats *st, cot_errbuf *eb);

typedef struct {
	float lr;       /* outer learning rate, in (0, 10] */
	float momentum; /* mu, in [0, 1) */
	bool nesterov;
} kern_outer_config;

/* DiLoCo's: lr 0.7, momentum 0.9, Nesterov (also the project file's
 * defaults, server/project_file.c). */
#define KERN_OUTER_LR_DEFAULT 0.7
#define KERN_OUTER_MOMENTUM_DEFAULT 0.9
#define KERN_OUTER_NESTEROV_DEFAULT true
void kern_outer_default(kern_outer_config *o);

/* COT_OK or COT_ERR_INVALID naming the bad field. */
cot_err kern_outer_validate(const kern_outer_config *o, cot_errbuf *eb);

/* One outer step (rule above) on m->params and m->m from the mean
 * pseudo-gradient in m->grads (not changed), then m->step++; m->v is left
 * alone.  Deterministic: elementwise, the thread count changes no bit.
 * COT_ERR_INVALID for a bad config or a pseudo-gradient that is not finite
 * (nothing is changed then). */
cot_err kern_opt_outer_step(kern_model *m, const kern_outer_config *o, cot_errbuf *eb);

#endif
