/* cotrain kernels: the table of entry points that the CUDA backend's shared
 * library (libcotrain-cuda.so, kernels/cuda/) exports to the loader
 * (kernels/gpu.c).  Programs never call it directly: they use kernels/gpu.h.
 *
 * Why a library loaded at run time: a client built with CUDA must still
 * start on a machine with no GPU, no driver and no cuBLAS.  Linking cuBLAS
 * into the programs would stop them at load time there; dlopen() of this
 * library fails cleanly instead, and the client computes on the CPU.
 *
 * Every entry returns 0 on success or a KERN_GPU_E* code with a message in
 * err[0..errlen), and never aborts the process.  Pointers named host_* are
 * host memory; the library copies them to and from the device itself. */
#ifndef KERN_GPU_ABI_H
#define KERN_GPU_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the table below changes; the loader refuses a library of
 * another version (an old library left beside a new client). */
#define KERN_GPU_ABI_VERSION 5

/* The symbol the library exports: const kern_gpu_api *KERN_GPU_ENTRY(void). */
#define KERN_GPU_ENTRY "cotrain_cuda_api"

enum {
	KERN_GPU_OK = 0,
	KERN_GPU_EINVAL = 1, /* a bad argument (shape, batch, token id) */
	KERN_GPU_ENOMEM = 2, /* device memory exhausted */
	KERN_GPU_EDEVICE = 3 /* the driver or device failed (no device, Xid-style fault, launch error) */
};

/* Precision of the matrix products (the project setting `precision`).
 * Parameters and gradients are fp32 in every mode. */
enum { KERN_PREC_FP32 = 0, KERN_PREC_TF32 = 1, KERN_PREC_BF16 = 2 };

typedef struct kern_gpu_info {
	char name[96];
	int cc_major, cc_minor;
	int multiprocessors;
	size_t mem_total, mem_free;
} kern_gpu_info;

/* One layer on host buffers, for the tests that compare each layer with the
 * CPU backend (tests/test_gpu_kernels.c).  Which fields an op reads is
 * written beside it in kern_gpu_op; every array is host memory. */
enum {
	KERN_GPU_OP_LINEAR_FWD, /* y[N,O] = x[N,I] w[I,O] + b[O] */
	KERN_GPU_OP_LINEAR_BWD, /* dx[N,I] = dy w^T; dw += x^T dy; db += colsum(dy) */
	KERN_GPU_OP_LN_FWD,     /* y, mean, rstd = layernorm(x; w, b), rows N of width C */
	KERN_GPU_OP_LN_BWD,     /* dx += ..; dw += ..; db += .. from dy, x, w, mean, rstd */
	KERN_GPU_OP_GELU_FWD,   /* y = gelu(x), n = N*C elements */
	KERN_GPU_OP_GELU_BWD,   /* dx = dy * gelu'(x) */
	KERN_GPU_OP_ATTN_FWD,   /* y[B,T,C], att[B,NH,T,T] from qkv[B,T,3C] (x) */
	KERN_GPU_OP_ATTN_BWD,   /* dqkv (dx, set) from dy and qkv (x), through its own forward */
	KERN_GPU_OP_CE_FWD,     /* losses[N] (y) of logits x[N,V] against targets */
	KERN_GPU_OP_CE_BWD,     /* dlogits (dx, set) = scale * (softmax - onehot) */
	KERN_GPU_OP_EMB_FWD,    /* y[B,T,C] = wte[tok] (w) + wpe[t] (b) */
	KERN_GPU_OP_EMB_BWD,    /* dwte (dw) += ..; dwpe (db) += .. from dy */
	/* the fused attention (kernels/cuda/cuda_flash.h: bf16, head size 64,
	 * T a multiple of 128; other shapes EINVAL) */
	KERN_GPU_OP_FLASH_FWD, /* y[B,T,C] from qkv[B,T,3C] (x) */
	KERN_GPU_OP_FLASH_BWD  /* dqkv (dx, set) from dy and qkv (x), through its own forward */
};

typedef struct kern_gpu_op {
	int op, precision;
	int N, I, O;        /* rows, in and out widths (LINEAR); N, C for LN and GELU */
	int B, T, C, NH, V; /* attention, cross-entropy (N rows of V), embedding */
	float scale;        /* CE_BWD */
	int full;           /* ATTN_*, FLASH_*: over every key (the encoders), not causal */
	const float *x, *w, *b, *dy, *mean_in, *rstd_in, *att_in;
	const int32_t *ids; /* tokens or targets */
	float *y, *dx, *dw, *db, *mean, *rstd, *att;
} kern_gpu_op;

typedef struct kern_gpu_model kern_gpu_model;

/* Local mode's inner optimizer steps on the device (kernels/local.h): the
 * rules of kernels/optimizer.h in the same float operations in the same
 * order, so that a step there gives the CPU's bits from the same gradient.
 * The host drives a step (kernels/optimizer.c, kern_opt_step_gpu): it
 * computes every scalar (learning rate, bias corrections, clip factor,
 * trust ratios) from the partial sums the device returns, summed in the
 * CPU's order.  Segments are the CPU's: each parameter view (in the
 * model's view order) cut into runs of KERN_GPU_OPT_BLOCK elements. */
#define KERN_GPU_OPT_BLOCK 8192

/* opt_moments: how the device's two inner moments are set or read */
enum { KERN_GPU_MOM_ZERO = 0, KERN_GPU_MOM_UP = 1, KERN_GPU_MOM_DOWN = 2 };

enum {
	KERN_GPU_PASS_ADAMW,        /* the AdamW update of every element */
	KERN_GPU_PASS_LAMB_MOMENTS, /* LAMB's moments and update u; ||p||^2, ||u||^2 per segment */
	KERN_GPU_PASS_LAMB_APPLY    /* p -= (lr r) u */
};

typedef struct kern_gpu_opt_pass {
	int pass;
	/* one value per view: ADAMW the decay factor 1 - lr wd (1 for a view
	 * without decay); LAMB_MOMENTS wd (0 without); LAMB_APPLY lr r */
	const float *per_view;
	int n_views;
	float coef; /* the clip factor applied to the gradient */
	float beta1, beta2, eps;
	float step_size, bc2_sqrt; /* ADAMW: lr / (1 - b1^t), sqrt(1 - b2^t) */
	float bc1, bc2;            /* LAMB: 1 - b^t */
	/* LAMB_MOMENTS: out, one double per segment each */
	double *host_p2, *host_u2;
} kern_gpu_opt_pass;

typedef struct kern_gpu_api {
	int abi_version;
	/* a line naming the library's build ("cuda 13.0, cuBLAS 13.0.0, sm_80 ...") */
	const char *(*describe)(void);
	/* number of usable devices (0 is a valid answer), or -1 with err */
	int (*device_count)(char *err, size_t errlen);
	int (*device_info)(int device, kern_gpu_info *out, char *err, size_t errlen);
	/* the device's measured matrix rate in FLOP/s for a precision: a few
	 * timed products of the model's size (about 0.1 s) */
	int (*device_bench)(int device, int precision, double *flops, char *err, size_t errlen);
	/* the model c (a GPT, or an encoder: enc_forward) on device, its parameters laid out as views[n_views]
	 * (kern_param_views), activations for batches of up to max_batch;
	 * parameters unset and gradients zero */
	int (*model_create)(const kern_config *c, const kern_view *views, int n_views, int max_batch,
	                    int device, int precision, kern_gpu_model **out, char *err, size_t errlen);
	void (*model_free)(kern_gpu_model *g);
	/* host_params[kern_param_count] onto the device (after every step) */
	int (*set_params)(kern_gpu_model *g, const float *host_params, char *err, size_t errlen);
	/* kern_forward's contract: tokens, targets [B*T] (targets NULL: no loss);
	 * *loss the mean cross-entropy, summed in double */
	int (*forward)(kern_gpu_model *g, const int32_t *tokens, const int32_t *targets, int B, double *loss,
	               char *err, size_t errlen);
	/* kern_backward_scaled's contract, adding into the device's gradient */
	int (*backward)(kern_gpu_model *g, float scale, char *err, size_t errlen);
	/* host_grads (+)= the device's gradient (add 0: =), then zero it there */
	int (*take_grads)(kern_gpu_model *g, float *host_grads, int add, char *err, size_t errlen);
	/* one layer op on host buffers (see kern_gpu_op), on device 0 */
	int (*layer_op)(const kern_gpu_op *op, char *err, size_t errlen);
	/* Pin (on 1) or unpin (on 0) host memory [p, p + bytes) that
	 * set_params and take_grads copy from and to: the copies then run at
	 * the bus's speed instead of through a bounce buffer.  Unpin before
	 * freeing it. */
	int (*host_register)(void *p, size_t bytes, int on, char *err, size_t errlen);
	/* timings of the last forward + backward in ms: [0] forward, [1] backward */
	void (*last_timings)(kern_gpu_model *g, double ms[2]);
	/* With COTRAIN_CUDA_PROFILE=1 in the environment when the model was
	 * created: the last forward + backward's time by kind of work (events
	 * between its launches; *names and *ms get n entries, n returned);
	 * otherwise 0.  For tests/bench/bench_gpu. */
	int (*profile)(kern_gpu_model *g, const char *const **names, const double **ms);
	/* host_out[0..k) = the sketch (shared/common/sketch.h) of the device's
	 * gradient under seed, k 1..256: what sketch_add of the same vector
	 * gives, up to double rounding (a fixed order of its own) */
	int (*sketch_grads)(kern_gpu_model *g, uint64_t seed, int k, double *host_out, char *err,
	                    size_t errlen);
	/* An encoder's (ALBERT, BERT) forward with labels, kern_enc_forward's
	 * contract on a training batch (every sample full length): ids, segs,
	 * labels [B*T], sop [B]; res[KERN_GPU_ENC_RESULTS] gets the loss, the
	 * MLM loss, the SOP loss, the predicted positions, the MLM and the
	 * SOP predictions that were right (kern_enc_result's fields, in its
	 * order).  backward then adds its gradient.  forward refuses an
	 * encoder. */
	int (*enc_forward)(kern_gpu_model *g, const int32_t *ids, const int32_t *segs, const int32_t *labels,
	                   const int32_t *sop, int B, double *res, char *err, size_t errlen);
	/* The inner moments (2 n_params floats, allocated on first use; ENOMEM
	 * changes nothing): ZERO, UP from host_m1/host_m2, or DOWN into them.
	 * Every other opt_ entry needs them set first (EINVAL). */
	int (*opt_moments)(kern_gpu_model *g, float *host_m1, float *host_m2, int how, char *err,
	                   size_t errlen);
	/* The device's gradient g[i] = (float)((double)g[i] / divisor); then
	 * host_part[b] = the sum of squares of the flat gradient's block b of
	 * KERN_GPU_OPT_BLOCK elements, as kern_grad_norm sums one block, for
	 * every block (ceil(n_params / KERN_GPU_OPT_BLOCK) doubles). */
	int (*opt_norm)(kern_gpu_model *g, double divisor, double *host_part, char *err, size_t errlen);
	/* One pass of the step (kern_gpu_opt_pass) on the device's
	 * parameters and moments; ADAMW and LAMB_MOMENTS zero the gradient
	 * after reading it. */
	int (*opt_pass)(kern_gpu_model *g, const kern_gpu_opt_pass *p, char *err, size_t errlen);
	/* host_params[kern_param_count] = the device's parameters */
	int (*get_params)(kern_gpu_model *g, float *host_params, char *err, size_t errlen);
	/* the device's gradient += host_grads[kern_param_count], one fp32
	 * addition per element (the tests' way to put a known gradient there) */
	int (*add_grads)(kern_gpu_model *g, const float *host_grads, char *err, size_t errlen);
} kern_gpu_api;

enum { KERN_GPU_ENC_RESULTS = 6 };

typedef const kern_gpu_api *(*kern_gpu_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
