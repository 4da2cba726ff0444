/* cotrain CUDA backend: error handling shared by its files.  Every entry
 * point of the library returns a KERN_GPU_* code with a message; these
 * macros turn a failed CUDA or cuBLAS call into that return. */
#ifndef COTRAIN_CUDA_UTIL_H
#define COTRAIN_CUDA_UTIL_H

#include "kernels/gpu_abi.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

/* The code for a CUDA error: out of memory, or a device failure. */
static inline int cu_code(cudaError_t e)
{
	return e == cudaErrorMemoryAllocation ? KERN_GPU_ENOMEM : KERN_GPU_EDEVICE;
}

static inline int cu_fail(char *err, size_t n, int code, const char *what, const char *detail)
{
	if (err && n)
		snprintf(err, n, "%s: %s", what, detail);
	return code;
}

#define CU_TRY(call, what) \
	do { \
		cudaError_t e_ = (call); \
		if (e_ != cudaSuccess) \
			return cu_fail(err, errlen, cu_code(e_), what, cudaGetErrorString(e_)); \
	} while (0)

#define CUBLAS_TRY(call, what) \
	do { \
		cublasStatus_t s_ = (call); \
		if (s_ != CUBLAS_STATUS_SUCCESS) \
			return cu_fail(err, errlen, \
			               s_ == CUBLAS_STATUS_ALLOC_FAILED ? KERN_GPU_ENOMEM \
			                                                : KERN_GPU_EDEVICE, \
			               what, cublasGetStatusString(s_)); \
	} while (0)

/* after a run of launches: a launch error, then the stream's completion */
#define CU_SYNC(stream, what) \
	do { \
		CU_TRY(cudaGetLastError(), what); \
		CU_TRY(cudaStreamSynchronize(stream), what); \
	} while (0)

/* *off = the offset of the parameter view named name of numel elements;
 * false when views[0..n) has none such (a model of another layout). */
static inline bool cu_find_view(const kern_view *views, int n, const char *name, size_t numel, size_t *off)
{
	for (int i = 0; i < n; i++)
		if (strcmp(views[i].name, name) == 0 && views[i].numel == numel) {
			*off = views[i].offset;
			return true;
		}
	return false;
}

#endif
