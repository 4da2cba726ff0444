/* cotrain client: the host's speed, measured with the real kernels.
 *
 * Forward and backward passes of a small model (2 layers, width 128,
 * sequence 64, batch 4) for about the given time; the speed is the model's
 * exact FLOPs per sample (kern_flops_per_sample) times the samples done,
 * over the time taken.  Run on first start and whenever the hardware
 * fingerprint changes; reported with the host's hardware when it
 * registers. */
#ifndef CL_BENCHMARK_H
#define CL_BENCHMARK_H

#include "shared/common/error.h"

/* FLOP/s measured with threads threads over about seconds seconds (at least
 * three steps); 0 on failure with a detail in eb. */
double cl_benchmark(int threads, double seconds, cot_errbuf *eb);

/* The same on GPU device (kernels/gpu.h), products in fp32 (the projects'
 * default precision), on a model the size of a GPU's work (4 layers, width
 * 512, sequence 256, batch 16); 0 on failure (no GPU, a device error) with
 * a detail in eb. */
double cl_benchmark_gpu(int device, double seconds, cot_errbuf *eb);

#endif
