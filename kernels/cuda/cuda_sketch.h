/* cotrain CUDA backend: the sketch of a vector on the device
 * (shared/common/sketch.h defines it; the CPU computes it in
 * shared/common/sketch.c). */
#ifndef COTRAIN_CUDA_SKETCH_H
#define COTRAIN_CUDA_SKETCH_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* Doubles of scratch cu_sketch needs on the device. */
size_t cu_sketch_scratch_len(void);

/* host_out[0..k) = the sketch of x[0..n) (device memory) under seed, k in
 * 1..256, on stream s, with scratch (cu_sketch_scratch_len doubles on the
 * device); waits for the stream.  Each block of 64 coordinates is summed
 * by one warp and each projection by one thread, in an order fixed by n
 * and k alone: the same bits on every run and every GPU, equal to the
 * CPU's sketch_add up to double rounding (about 1e-16 relative).  Returns
 * a KERN_GPU_* code. */
int cu_sketch(const float *x, size_t n, uint64_t seed, int k, double *host_out, double *scratch,
              cudaStream_t s, char *err, size_t errlen);

#endif
