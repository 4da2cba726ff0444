/* cotrain kernels: model checkpoints.
 *
 * A checkpoint is one safetensors file (see safetensors.h), so other tools
 * (Python's safetensors, PyTorch) can read it:
 *
 *   __metadata__ (every value a string, as safetensors requires)
 *     format          "cotrain-checkpoint"
 *     format_version  "1"
 *     tokenizer       "byte" (TOK_NAME)
 *     n_layer n_shared n_head d_model seq_len vocab d_ff
 *                     the kern_config fields, decimal
 *     step            optimizer steps taken, decimal
 *   tensors, all F32 little-endian, in this order:
 *     param.<name>    the parameters, one per view of kern_param_views,
 *                     with the view's shape
 *     opt.m.<name>    the optimizer's first moment, same shapes
 *     opt.v.<name>    the optimizer's second moment, same shapes
 *
 * Loading trusts nothing: the config must pass the model's validation, every
 * expected tensor must be present with its dtype and shape, no other tensor
 * may be, every value must be finite, and every second moment >= 0. */
#ifndef KERN_CHECKPOINT_H
#define KERN_CHECKPOINT_H

#include "kernels/model.h"
#include "shared/common/error.h"

#define CKPT_FORMAT "cotrain-checkpoint"
#define CKPT_FORMAT_VERSION 1

/* Write m's config, step, parameters and moments to path, atomically (the
 * old file stays until the new one is complete).  m is not changed.
 * COT_ERR_IO, COT_ERR_NOMEM, COT_ERR_INVALID for a model whose views do not
 * fit a checkpoint. */
cot_err ckpt_save(const kern_model *m, const char *path, cot_errbuf *eb);

/* Read the checkpoint at path into an existing model whose config must equal
 * the file's; fills params, m, v and step.  All or nothing: on any error the
 * model is untouched.  COT_ERR_NOT_FOUND, COT_ERR_IO, COT_ERR_CORRUPT (bad
 * file, missing or misshapen tensor, non-finite value), COT_ERR_UNSUPPORTED
 * (another format, version or tokenizer), COT_ERR_CONFLICT (the file's
 * config differs from the model's; the detail names the field). */
cot_err ckpt_load(kern_model *m, const char *path, cot_errbuf *eb);

/* Read the checkpoint at path into a new model made for batches of up to
 * max_batch sequences (0: no activations, enough for an optimizer but not
 * for kern_forward).  Validates the whole file first, so a small file cannot
 * make it allocate a large model.  On success the caller owns *out
 * (kern_model_free); on error *out is NULL.  Errors as ckpt_load, plus those
 * of kern_model_create. */
cot_err ckpt_load_new(const char *path, int max_batch, kern_model **out, cot_errbuf *eb);

#endif
