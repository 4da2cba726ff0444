/* cotrain kernels: GPUs, chosen at run time.
 *
 * The CUDA backend is a shared library of its own (libcotrain-cuda.so,
 * kernels/cuda/, entry table kernels/gpu_abi.h) that this loader opens with
 * dlopen() on first use.  A program built with or without CUDA, on a
 * machine with or without a GPU, driver or cuBLAS, starts and runs the same
 * way: where the library or a device is missing, kern_gpu_api_get says why
 * in one line and everything computes on the CPU.
 *
 * A model bound to a GPU (kern_gpu_bind) runs its forward and backward
 * there through kern_stream_step (a GPT's, or an ALBERT's or BERT's); its
 * parameters and gradient stay the host's fp32 buffers: the parameters go
 * up when they change (kern_gpu_params_changed), each backward's gradient
 * comes down into m->grads (or, kept, sums on the GPU until it is brought
 * home: kern_gpu_keep_grads), and the optimizer step stays the
 * deterministic CPU one, so every peer still applies identical bytes. */
#ifndef KERN_GPU_H
#define KERN_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/encoder.h"
#include "kernels/gpu_abi.h"
#include "kernels/model.h"

/* The environment variable naming the library to load instead of the
 * installed one (tests and benchmarks in the build tree). */
#define KERN_GPU_LIB_ENV "COTRAIN_CUDA_LIB"

/* The backend's table, loading it on first call (thread safe), or NULL
 * with why[0..n) saying what is missing ("libcotrain-cuda.so: cannot open
 * shared object file", "no usable CUDA driver: ...", "this build has no
 * CUDA backend").  why may be NULL. */
const kern_gpu_api *kern_gpu_api_get(char *why, size_t n);

/* Number of usable GPUs (0 when none or no backend; why says why). */
int kern_gpu_count(char *why, size_t n);

/* "fp32", "tf32", "bf16" <-> KERN_PREC_*; parse returns -1 for others. */
int kern_precision_parse(const char *name);
const char *kern_precision_name(int precision);

/* Bind m (created with activations for max_batch samples) to GPU device at
 * precision: its training passes in kern_stream_step run there from now on
 * (other passes, such as evaluation's, stay on the CPU).
 * COT_ERR_UNSUPPORTED (no backend or device; the message says which),
 * COT_ERR_NOMEM (the device's memory), COT_ERR_IO (a device error).  On
 * error m stays on the CPU. */
cot_err kern_gpu_bind(kern_model *m, int device, int precision, cot_errbuf *eb);
/* Back to the CPU, freeing the device's memory (no-op when not bound).  A
 * gradient the GPU holds (kern_gpu_keep_grads) is dropped: bring it home
 * first. */
void kern_gpu_unbind(kern_model *m);
bool kern_gpu_bound(const kern_model *m);
/* Mark m's parameters as changed on the host: the next GPU pass uploads them. */
void kern_gpu_params_changed(kern_model *m);

/* One microbatch on the bound GPU: kern_forward(tokens, targets, B) then
 * kern_backward_scaled(scale), the gradient added into m->grads (kept: into
 * the gradient the GPU holds).  Errors: COT_ERR_INVALID (tokens, B),
 * COT_ERR_NOMEM, COT_ERR_IO (device): the caller may unbind and compute the
 * microbatch on the CPU instead. */
cot_err kern_gpu_step(kern_model *m, const int32_t *tokens, const int32_t *targets, int B, float scale,
                      float *loss, cot_errbuf *eb);

/* An encoder's training microbatch on the bound GPU: kern_enc_forward
 * (batch with labels and SOP labels, every sample full length: lengths
 * NULL) then kern_enc_backward_scaled(scale), the gradient added as
 * kern_gpu_step adds it; *res (if not NULL) as kern_enc_forward's.
 * Errors as kern_gpu_step's. */
cot_err kern_gpu_enc_step(kern_model *m, const kern_enc_batch *batch, int B, float scale,
                          kern_enc_result *res, cot_errbuf *eb);

/* Keep (on) each step's gradient on the GPU, summed there, instead of
 * adding it into m->grads after every step: the whole gradient is then
 * m->grads plus what the GPU holds, until kern_gpu_grads_home.  Saves
 * copying the gradient down and adding it on the host for each microbatch
 * (at GPT-2 small's size, about half a bf16 step on an H200).  Off (as at
 * bind) brings a held gradient home first.  The sum on the GPU adds each
 * step's terms into the running sum, where m->grads adds the step's total:
 * the same sum to fp32 rounding, not the same bits.  COT_ERR_CONFLICT when
 * not bound; else kern_gpu_grads_home's. */
cot_err kern_gpu_keep_grads(kern_model *m, bool on, cot_errbuf *eb);
/* Whether the GPU holds a gradient not yet in m->grads. */
bool kern_gpu_holds_grads(const kern_model *m);
/* m->grads += the gradient the GPU holds, which it then zeroes (no-op when
 * it holds none).  COT_ERR_IO (the device failed: the held gradient is
 * lost and m->grads unchanged; the caller computes its microbatches again),
 * COT_ERR_NOMEM. */
cot_err kern_gpu_grads_home(kern_model *m, cot_errbuf *eb);
/* out[0..k) = the sketch (shared/common/sketch.h) under seed of the
 * gradient the GPU holds (all zeros when it holds none), computed there:
 * sketch_add's values up to double rounding.  k 1..256.  COT_ERR_CONFLICT
 * when not bound, COT_ERR_IO, COT_ERR_NOMEM. */
cot_err kern_gpu_sketch_held(kern_model *m, uint64_t seed, int k, double *out, cot_errbuf *eb);

/* Local mode's inner steps on the GPU (kernels/local.h; the step itself is
 * kern_opt_step_gpu in kernels/optimizer.h, over the entries below).
 * There the parameters and the inner moments stay on the GPU from step to
 * step, and m->params falls behind until kern_gpu_params_home. */

/* Whether a step can run on m's GPU now: bound, keeping the gradient there
 * (kern_gpu_keep_grads), and m->grads known to be all zero, so that the
 * whole gradient is the one the GPU holds. */
bool kern_gpu_can_step(const kern_model *m);
/* kern_zero_grad's note that m->grads is all zero now (no-op unbound). */
void kern_gpu_host_grads_zeroed(kern_model *m);
/* kern_opt_step_gpu's moments argument: go on from the moments on the GPU. */
#define KERN_GPU_MOM_KEEP (-1)

/* The backend's opt_moments, opt_norm and opt_pass (kernels/gpu_abi.h) on
 * m's GPU; a pass first uploads the host's parameters if they changed
 * there (kern_gpu_params_changed), and one that zeroes the GPU's gradient
 * leaves it holding none.
 * COT_ERR_CONFLICT when not bound; COT_ERR_NOMEM (opt_moments: nothing
 * changed), COT_ERR_INVALID, COT_ERR_IO (the device failed). */
cot_err kern_gpu_opt_moments(kern_model *m, float *mom1, float *mom2, int how, cot_errbuf *eb);
cot_err kern_gpu_opt_norm(kern_model *m, double divisor, double *part, cot_errbuf *eb);
cot_err kern_gpu_opt_run(kern_model *m, const kern_gpu_opt_pass *p, cot_errbuf *eb);
/* The gradient the GPU holds += host[n_params] (for the tests: a known
 * gradient there); m keeps its gradient there (kern_gpu_keep_grads).
 * COT_ERR_CONFLICT otherwise; COT_ERR_NOMEM, COT_ERR_IO. */
cot_err kern_gpu_grads_add(kern_model *m, const float *host, cot_errbuf *eb);
/* m->params = the GPU's parameters.  Errors as kern_gpu_opt_norm's; on
 * COT_ERR_IO m->params may hold part of them. */
cot_err kern_gpu_params_home(kern_model *m, cot_errbuf *eb);

#endif
