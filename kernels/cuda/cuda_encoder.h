/* cotrain CUDA backend: the encoders (ALBERT, BERT; kernels/encoder.h) on
 * one GPU, trained on masked language modelling and sentence order.
 *
 * The same passes as kernels/encoder.c, layer for layer, on device
 * buffers: the caller (cuda_gpt.cu's model, which owns the device, the
 * stream, the products' handle and the flat fp32 parameters and gradient
 * in the host's layout) hands them over at creation.  Products run in the
 * model's precision: in bf16 mode the weights come from a bf16 copy of the
 * parameters made once per forward, and the activations from the bf16
 * copies their kernels write (LayerNorm's, GELU's, the attention's), else
 * rounded into scratch.  The attention covers every key; in bf16 mode with
 * head size 64 and T a multiple of 128 it runs fused (cuda_flash.h), with
 * relative positions materialised with their distance terms
 * (cu_attention_rel_fwd).  Every sample is full length (training). */
#ifndef COTRAIN_CUDA_ENCODER_H
#define COTRAIN_CUDA_ENCODER_H

#include "kernels/cuda/cuda_layers.h"
#include "kernels/cuda/cuda_prof.h"
#include "kernels/gpu_abi.h"

typedef struct cu_encoder cu_encoder;

/* The encoder c on the device of gx's stream, its parameters params[n_params]
 * laid out as views[n_views], its gradient grads (both the caller's, on
 * the device), params16 the bf16 copy in bf16 mode (else NULL), with
 * activations for batches of up to max_batch; its passes mark their stages
 * in pf (the model's COTRAIN_CUDA_PROFILE profile, cuda_prof.h). */
int cu_enc_create(const kern_config *c, const kern_view *views, int n_views, int max_batch,
                  const cu_gemm_ctx *gx, float *params, float *grads, __nv_bfloat16 *params16,
                  size_t n_params, cu_prof *pf, cu_encoder **out, char *err, size_t errlen);
void cu_enc_free(cu_encoder *e);

/* kern_enc_forward with labels on host batch arrays (ids, segs, labels
 * [B*T], sop [B]), every sample full length; res[KERN_GPU_ENC_RESULTS] as
 * kern_gpu_api.enc_forward says.  Checks every id and label first
 * (KERN_GPU_EINVAL). */
int cu_enc_forward(cu_encoder *e, const int32_t *ids, const int32_t *segs, const int32_t *labels,
                   const int32_t *sop, int B, double *res, char *err, size_t errlen);
/* kern_enc_backward_scaled: adds scale times the last forward's gradient
 * into the device's gradient. */
int cu_enc_backward(cu_encoder *e, float scale, char *err, size_t errlen);

#endif
