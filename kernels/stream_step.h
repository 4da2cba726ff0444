/* cotrain kernels: one microbatch of the training stream, forward and
 * backward, for either architecture: the step the client, its spot checks
 * and the single-process replay all take, so that they take the same one. */
#ifndef KERN_STREAM_STEP_H
#define KERN_STREAM_STEP_H

#include "kernels/model.h"

#include <stdint.h>

/* Microbatch g of the stream on m (created for at least B samples): in and
 * tgt are its [B, seq_len] inputs and next-token targets as mb_fill
 * (shared/common/microbatch.h) gives them.
 *   GPT: kern_forward(in, tgt), kern_backward_scaled(scale); on the GPU
 *   the model is bound to (kernels/gpu.h), kern_gpu_step instead, its
 *   gradient added into m->grads all the same.
 *   Encoders: kern_enc_train_stream on the first seq_len - 3 tokens of each
 *   sample (stride seq_len; tgt unused), keyed by the project's seed, the
 *   epoch g / mb_per_epoch and the microbatch g % mb_per_epoch in it; on
 *   a GPU, kern_gpu_enc_step on the same batch.
 * *loss (if not NULL) receives the mean loss (0 on error).  Errors as those
 * functions; COT_ERR_INVALID for g < 0 or mb_per_epoch < 1. */
cot_err kern_stream_step(kern_model *m, const int32_t *in, const int32_t *tgt, int B, uint64_t seed,
                         int64_t g, int64_t mb_per_epoch, float scale, float *loss, cot_errbuf *eb);

#endif
