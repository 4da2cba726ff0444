/* cotrain-server: the server's own optimizer step of a round (doc/design.md,
 * "The round"; doc/api.md, "The server's step").
 *
 * From checkpoint v and the round's averaged gradient (the mean over the
 * round's samples, as every peer feeds it to its optimizer) the server
 * computes version v+1 exactly as the peers do: ckpt_load_new, grads = the
 * gradient, kern_opt_step with the project's config.optimizer (step index =
 * the checkpoint's step, which must be v), ckpt_save.  In local mode
 * (config "mode": "local", kern_mode_config_from_json) the averaged value is
 * the mean pseudo-gradient and the step is kern_opt_outer_step with
 * config.outer, its momentum carried in the checkpoint's first moment.  Its
 * parameter hash is
 * the sha256 of the raw little-endian fp32 parameter buffer (n_params * 4
 * bytes, kern_param_views order). */
#ifndef COT_SERVER_ROUND_STEP_H
#define COT_SERVER_ROUND_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/optimizer.h"
#include "shared/common/error.h"
#include "shared/common/filestore.h"

/* Compute v+1: load the checkpoint named ckpt_sha from store_dir, take one
 * step with grad[0..n) (n must be the model's parameter count) and the
 * optimizer of config_json in force at version (kernels/config_changes.h), store the new checkpoint in store_dir (its name
 * into ckpt_out, its size into *size) and the parameter hash into
 * params_out.  Steps run one at a time (a process-wide lock), so memory is
 * bounded by one model.  Errors: COT_ERR_NOT_FOUND/IO/CORRUPT (checkpoint
 * v), COT_ERR_CONFLICT (n or the step count does not match the
 * checkpoint), COT_ERR_INVALID (a gradient that is not finite, a bad
 * optimizer config), COT_ERR_NOMEM. */
/* The round's mean gradient from its groups' sums (doc/api.md, "The
 * server's step"): sums[0..n_sums) name files in store_dir, each exactly n
 * little-endian fp32 values, in ascending group order; writes
 *   mean[i] = (float)((sum over k, in order, of (double)sum_k[i]) / (double)total)
 * into mean[0..n) (the caller's).  One at a time per process, like the
 * step.  Errors: COT_ERR_NOT_FOUND/IO (a file), COT_ERR_CORRUPT (a file
 * that is not n * 4 bytes), COT_ERR_INVALID (total < 1, no sums, a mean that
 * is not finite), COT_ERR_NOMEM. */
cot_err round_step_mean(const char *store_dir, const char *const *sums, int n_sums, long long total,
                        float *mean, size_t n, cot_errbuf *eb);

cot_err round_step_compute(const char *store_dir, const char *ckpt_sha, const char *config_json,
                           long long version, const float *grad, size_t n, char ckpt_out[FS_SHA_HEX_LEN + 1],
                           uint64_t *size, char params_out[FS_SHA_HEX_LEN + 1], cot_errbuf *eb);

#endif
