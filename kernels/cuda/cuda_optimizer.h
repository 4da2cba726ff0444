/* cotrain CUDA backend: local mode's inner optimizer steps on the device
 * (kernels/gpu_abi.h, "opt_"; the rules are kernels/optimizer.h's).
 *
 * Every element's update is the CPU's float operations in the CPU's order,
 * written with the round-to-nearest intrinsics so that nvcc fuses nothing
 * (the CPU library is built with -ffp-contract=off), and every partial sum
 * runs over the CPU's lanes in the CPU's order: the device's step gives
 * the CPU's bits.  The model's file (cuda_gpt.cu) owns a cu_opt and calls
 * these on its stream. */
#ifndef COTRAIN_CUDA_OPTIMIZER_H
#define COTRAIN_CUDA_OPTIMIZER_H

#include "kernels/gpu_abi.h"

#include <cuda_runtime.h>
#include <stddef.h>

typedef struct cu_opt cu_opt;

/* The moments and scratch for a model of n parameters laid out as
 * views[n_views], on the current device.  KERN_GPU_* code. */
int cu_opt_create(const kern_view *views, int n_views, size_t n, cu_opt **out, char *err, size_t errlen);
void cu_opt_free(cu_opt *o);

/* kern_gpu_api's opt_moments, opt_norm and opt_pass on params and grads
 * (device, n elements each) of the model o was created for, on stream s;
 * each waits for s. */
int cu_opt_moments(cu_opt *o, float *host_m1, float *host_m2, int how, cudaStream_t s, char *err,
                   size_t errlen);
int cu_opt_norm(cu_opt *o, float *grads, double divisor, double *host_part, cudaStream_t s, char *err,
                size_t errlen);
int cu_opt_pass(cu_opt *o, float *params, float *grads, const kern_gpu_opt_pass *p, cudaStream_t s, char *err,
                size_t errlen);

#endif
