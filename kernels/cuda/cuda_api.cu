/* cotrain CUDA backend: the library's exported table (kernels/gpu_abi.h),
 * the devices' discovery and benchmark, and single layers on host buffers
 * for the tests. */
#include "kernels/cuda/cuda_flash.h"
#include "kernels/cuda/cuda_layers.h"
#include "kernels/cuda/cuda_util.h"

#include <algorithm>
#include <math.h>
#include <string.h>
#include <vector>

#ifndef COTRAIN_CUDA_ARCHS
#define COTRAIN_CUDA_ARCHS "?"
#endif

extern "C" {
int cu_model_create(const kern_config *c, const kern_view *views, int n_views, int max_batch, int device,
                    int precision, kern_gpu_model **out, char *err, size_t errlen);
void cu_model_free(kern_gpu_model *g);
int cu_set_params(kern_gpu_model *g, const float *host, char *err, size_t errlen);
int cu_forward(kern_gpu_model *g, const int32_t *tokens, const int32_t *targets, int B, double *loss, char *err,
               size_t errlen);
int cu_backward(kern_gpu_model *g, float scale, char *err, size_t errlen);
int cu_take_grads(kern_gpu_model *g, float *host, int add, char *err, size_t errlen);
void cu_last_timings(kern_gpu_model *g, double ms[2]);
int cu_profile(kern_gpu_model *g, const char *const **names, const double **ms);
int cu_host_register(void *p, size_t bytes, int on, char *err, size_t errlen);
int cu_sketch_grads(kern_gpu_model *g, uint64_t seed, int k, double *host_out, char *err, size_t errlen);
int cu_model_enc_forward(kern_gpu_model *g, const int32_t *ids, const int32_t *segs, const int32_t *labels,
                         const int32_t *sop, int B, double *res, char *err, size_t errlen);
int cu_model_opt_moments(kern_gpu_model *g, float *host_m1, float *host_m2, int how, char *err, size_t errlen);
int cu_model_opt_norm(kern_gpu_model *g, double divisor, double *host_part, char *err, size_t errlen);
int cu_model_opt_pass(kern_gpu_model *g, const kern_gpu_opt_pass *p, char *err, size_t errlen);
int cu_get_params(kern_gpu_model *g, float *host, char *err, size_t errlen);
int cu_add_grads(kern_gpu_model *g, const float *host, char *err, size_t errlen);
}

static const char *cu_describe(void)
{
	static char line[160];
	if (!line[0]) {
		int rt = 0, bl = 0;
		cudaRuntimeGetVersion(&rt);
		cublasGetProperty(MAJOR_VERSION, &bl);
		int blmin = 0;
		cublasGetProperty(MINOR_VERSION, &blmin);
		snprintf(line, sizeof line, "CUDA runtime %d.%d, cuBLAS %d.%d, built for %s", rt / 1000,
		         rt % 1000 / 10, bl, blmin, COTRAIN_CUDA_ARCHS);
	}
	return line;
}

static int cu_device_count(char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice)
		return 0;
	if (e != cudaSuccess) {
		cu_fail(err, errlen, KERN_GPU_EDEVICE, "no usable CUDA driver", cudaGetErrorString(e));
		return -1;
	}
	return n;
}

static int cu_device_info(int device, kern_gpu_info *out, char *err, size_t errlen)
{
	cudaDeviceProp p;
	memset(out, 0, sizeof *out);
	CU_TRY(cudaGetDeviceProperties(&p, device), "reading the GPU's properties");
	snprintf(out->name, sizeof out->name, "%.95s", p.name);
	out->cc_major = p.major;
	out->cc_minor = p.minor;
	out->multiprocessors = p.multiProcessorCount;
	CU_TRY(cudaSetDevice(device), "selecting the GPU");
	CU_TRY(cudaMemGetInfo(&out->mem_free, &out->mem_total), "reading the GPU's memory");
	return KERN_GPU_OK;
}

__global__ void fill_hash_k(float *p, long n, unsigned seed)
{
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 15;
		h *= 2246822519u;
		h ^= h >> 13;
		p[i] = (float)(h & 0xffff) / 65536.0f - 0.5f;
	}
}

/* Device memory freed on every return. */
struct dev_bufs {
	std::vector<void *> ptrs;
	~dev_bufs()
	{
		for (void *p : ptrs)
			cudaFree(p);
	}
	template <typename T> cudaError_t alloc(T **p, size_t n)
	{
		cudaError_t e = cudaMalloc((void **)p, (n ? n : 1) * sizeof(T));
		if (e == cudaSuccess)
			ptrs.push_back(*p);
		return e;
	}
	/* a device copy of host[n] (NULL stays NULL) */
	template <typename T> cudaError_t up(T **p, const T *host, size_t n)
	{
		*p = NULL;
		if (!host)
			return cudaSuccess;
		cudaError_t e = alloc(p, n);
		return e ? e : cudaMemcpy(*p, host, n * sizeof(T), cudaMemcpyHostToDevice);
	}
};

static int cu_device_bench(int device, int precision, double *flops, char *err, size_t errlen)
{
	const int n = 4096, reps = 8;
	dev_bufs d;
	float *a, *b, *c;
	cublasHandle_t h;
	*flops = 0;
	CU_TRY(cudaSetDevice(device), "selecting the GPU");
	CU_TRY(d.alloc(&a, (size_t)n * n), "allocating benchmark buffers");
	CU_TRY(d.alloc(&b, (size_t)n * n), "allocating benchmark buffers");
	CU_TRY(d.alloc(&c, (size_t)n * n), "allocating benchmark buffers");
	fill_hash_k<<<1024, 256>>>(a, (long)n * n, 1);
	fill_hash_k<<<1024, 256>>>(b, (long)n * n, 2);
	CUBLAS_TRY(cublasCreate(&h), "creating the cuBLAS handle");
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cu_gemm_ctx gx = { h, 0, precision, NULL, NULL, 0 };
	if (precision == KERN_PREC_BF16) {
		CU_TRY(d.alloc(&gx.a16, (size_t)n * n), "allocating benchmark buffers");
		CU_TRY(d.alloc(&gx.b16, (size_t)n * n), "allocating benchmark buffers");
		gx.cap = (size_t)n * n;
	}
	cublasStatus_t st = cu_gemm(&gx, false, false, n, n, n, 1.0f, a, n, 0, b, n, 0, 0.0f, c, n, 0, 1);
	cudaEventRecord(e0, 0);
	for (int i = 0; i < reps && st == CUBLAS_STATUS_SUCCESS; i++)
		st = cu_gemm(&gx, false, false, n, n, n, 1.0f, a, n, 0, b, n, 0, 0.0f, c, n, 0, 1);
	cudaEventRecord(e1, 0);
	cudaError_t e = cudaEventSynchronize(e1);
	float ms = 0;
	cudaEventElapsedTime(&ms, e0, e1);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cublasDestroy(h);
	CUBLAS_TRY(st, "the benchmark's product");
	CU_TRY(e, "the benchmark's product");
	*flops = ms > 0 ? 2.0 * n * n * (double)n * reps / (ms * 1e-3) : 0;
	return KERN_GPU_OK;
}

/* One layer on host buffers (kern_gpu_op), on device 0. */
static int cu_layer_op(const kern_gpu_op *o, char *err, size_t errlen)
{
	dev_bufs d;
	cublasHandle_t h = NULL;
	cudaStream_t s = 0;
	CU_TRY(cudaSetDevice(0), "selecting the GPU");
	CUBLAS_TRY(cublasCreate(&h), "creating the cuBLAS handle");
	struct hguard {
		cublasHandle_t h;
		~hguard() { cublasDestroy(h); }
	} guard = { h };
	(void)guard;
	float *x, *w, *b, *dy, *mean, *rstd, *y, *dx, *dw, *db, *scr;
	int32_t *ids;
	int N = o->N, I = o->I, O = o->O, C = o->C, B = o->B, T = o->T, NH = o->NH, V = o->V;
	size_t BT = (size_t)B * T;
#define UP(dst, src, n) CU_TRY(d.up(&dst, src, n), "copying a layer's input")
#define ALLOC(dst, n) CU_TRY(d.alloc(&dst, n), "allocating a layer's buffer")
#define DOWN(host, dev, n) CU_TRY(cudaMemcpy(host, dev, (n) * sizeof(*(host)), cudaMemcpyDeviceToHost), "copying out")
#define PROD(...) CUBLAS_TRY(cu_gemm(&gx, __VA_ARGS__), "a matrix product")
	/* bf16 scratch for the largest operand any op multiplies */
	cu_gemm_ctx gx = { h, s, o->precision, NULL, NULL, 0 };
	if (o->precision == KERN_PREC_BF16) {
		size_t big = (size_t)N * (I > O ? I : O);
		for (size_t n : { (size_t)I * O, (size_t)B * NH * T * T, 3 * BT * C })
			big = n > big ? n : big;
		CU_TRY(d.alloc(&gx.a16, big), "allocating bf16 scratch");
		CU_TRY(d.alloc(&gx.b16, big), "allocating bf16 scratch");
		gx.cap = big;
	}
	switch (o->op) {
	case KERN_GPU_OP_LINEAR_FWD:
		UP(x, o->x, (size_t)N * I);
		UP(w, o->w, (size_t)I * O);
		UP(b, o->b, (size_t)O);
		ALLOC(y, (size_t)N * O);
		cu_rows_bias(s, y, NULL, b, N, O);
		PROD(false, false, N, O, I, 1.0f, x, I, 0, w, O, 0, 1.0f, y, O, 0, 1);
		DOWN(o->y, y, (size_t)N * O);
		break;
	case KERN_GPU_OP_LINEAR_BWD:
		UP(x, o->x, (size_t)N * I);
		UP(w, o->w, (size_t)I * O);
		UP(dy, o->dy, (size_t)N * O);
		UP(dw, o->dw, (size_t)I * O);
		UP(db, o->db, (size_t)O);
		ALLOC(dx, (size_t)N * I);
		ALLOC(scr, cu_colsum_scratch(N, O));
		PROD(false, true, N, I, O, 1.0f, dy, O, 0, w, O, 0, 0.0f, dx, I, 0, 1);
		PROD(true, false, I, O, N, 1.0f, x, I, 0, dy, O, 0, 1.0f, dw, O, 0, 1);
		cu_colsum_add(s, db, dy, N, O, scr);
		DOWN(o->dx, dx, (size_t)N * I);
		DOWN(o->dw, dw, (size_t)I * O);
		DOWN(o->db, db, (size_t)O);
		break;
	case KERN_GPU_OP_LN_FWD:
		UP(x, o->x, (size_t)N * C);
		UP(w, o->w, (size_t)C);
		UP(b, o->b, (size_t)C);
		ALLOC(y, (size_t)N * C);
		ALLOC(mean, (size_t)N);
		ALLOC(rstd, (size_t)N);
		cu_layernorm_fwd(s, y, NULL, mean, rstd, x, w, b, N, C, 1e-5f);
		DOWN(o->y, y, (size_t)N * C);
		DOWN(o->mean, mean, (size_t)N);
		DOWN(o->rstd, rstd, (size_t)N);
		break;
	case KERN_GPU_OP_LN_BWD: {
		float *mi, *ri;
		UP(x, o->x, (size_t)N * C);
		UP(w, o->w, (size_t)C);
		UP(dy, o->dy, (size_t)N * C);
		UP(mi, o->mean_in, (size_t)N);
		UP(ri, o->rstd_in, (size_t)N);
		UP(dx, o->dx, (size_t)N * C);
		UP(dw, o->dw, (size_t)C);
		UP(db, o->db, (size_t)C);
		ALLOC(scr, cu_colsum_scratch(N, C));
		cu_layernorm_bwd(s, dx, NULL, dw, db, dy, x, w, mi, ri, N, C, scr);
		DOWN(o->dx, dx, (size_t)N * C);
		DOWN(o->dw, dw, (size_t)C);
		DOWN(o->db, db, (size_t)C);
		break;
	}
	case KERN_GPU_OP_GELU_FWD:
		UP(x, o->x, (size_t)N * C);
		ALLOC(y, (size_t)N * C);
		cu_gelu_fwd(s, y, x, (long)N * C);
		DOWN(o->y, y, (size_t)N * C);
		break;
	case KERN_GPU_OP_GELU_BWD:
		UP(x, o->x, (size_t)N * C);
		UP(dy, o->dy, (size_t)N * C);
		ALLOC(dx, (size_t)N * C);
		cu_gelu_bwd(s, dx, NULL, x, dy, (long)N * C);
		DOWN(o->dx, dx, (size_t)N * C);
		break;
	case KERN_GPU_OP_ATTN_FWD:
	case KERN_GPU_OP_ATTN_BWD: {
		size_t natt = (size_t)B * NH * T * T, ae = cu_att_elem(o->precision);
		char *qkvp, *patt;
		float *yp;
		UP(x, o->x, 3 * BT * C);
		ALLOC(qkvp, 3 * BT * C * ae);
		ALLOC(patt, natt * ae);
		ALLOC(yp, BT * C);
		ALLOC(y, BT * C);
		/* the backward's saved state comes from this forward (its
		 * probabilities are the GPU's own, in its storage type) */
		CUBLAS_TRY(cu_attention_fwd(&gx, y, patt, qkvp, yp, x, NULL, B, T, C, NH, !o->full), "the attention");
		if (o->op == KERN_GPU_OP_ATTN_FWD) {
			DOWN(o->y, y, BT * C);
			if (ae == sizeof(float)) {
				DOWN(o->att, (float *)patt, natt);
			} else { /* widen bf16 for the caller */
				std::vector<__nv_bfloat16> h16(natt);
				DOWN(h16.data(), (__nv_bfloat16 *)patt, natt);
				for (size_t i = 0; i < natt; i++)
					o->att[i] = __bfloat162float(h16[i]);
			}
			break;
		}
		char *datt, *dyp;
		float *dqkvp;
		UP(dy, o->dy, BT * C);
		ALLOC(datt, natt * ae);
		ALLOC(dyp, BT * C * ae);
		ALLOC(dqkvp, 3 * BT * C);
		ALLOC(dx, 3 * BT * C);
		CUBLAS_TRY(cu_attention_bwd(&gx, dx, dy, qkvp, patt, dyp, datt, dqkvp, B, T, C, NH, !o->full),
		           "the attention's backward");
		DOWN(o->dx, dx, 3 * BT * C);
		break;
	}
	case KERN_GPU_OP_FLASH_FWD:
	case KERN_GPU_OP_FLASH_BWD: {
		if (!cu_flash_fits(o->precision, T, C, NH))
			return cu_fail(err, errlen, KERN_GPU_EINVAL, "the fused attention",
			               "needs bf16, head size 64 and T a multiple of 128");
		__nv_bfloat16 *qkvp, *dO16;
		float *lse, *D;
		UP(x, o->x, 3 * BT * C);
		ALLOC(qkvp, 3 * BT * C);
		ALLOC(lse, (size_t)B * NH * T);
		ALLOC(y, BT * C);
		cu_qkv_split16(s, qkvp, x, NULL, B, T, C, NH);
		cu_flash_fwd(s, y, NULL, lse, qkvp, B, T, C, NH, !o->full);
		if (o->op == KERN_GPU_OP_FLASH_FWD) {
			DOWN(o->y, y, BT * C);
			break;
		}
		UP(dy, o->dy, BT * C);
		ALLOC(D, (size_t)B * NH * T);
		ALLOC(dO16, BT * C);
		ALLOC(dx, 3 * BT * C);
		cu_flash_bwd(s, dx, dy, y, qkvp, lse, D, dO16, B, T, C, NH, !o->full);
		DOWN(o->dx, dx, 3 * BT * C);
		break;
	}
	case KERN_GPU_OP_CE_FWD:
	case KERN_GPU_OP_CE_BWD: {
		float *lse, *losses;
		UP(x, o->x, (size_t)N * V);
		UP(ids, o->ids, (size_t)N);
		ALLOC(lse, (size_t)N);
		ALLOC(losses, (size_t)N);
		cu_crossentropy_fwd(s, losses, lse, x, ids, N, V, V);
		if (o->op == KERN_GPU_OP_CE_FWD) {
			DOWN(o->y, losses, (size_t)N);
			break;
		}
		cu_crossentropy_bwd(s, x, lse, ids, N, V, V, o->scale);
		DOWN(o->dx, x, (size_t)N * V);
		break;
	}
	case KERN_GPU_OP_EMB_FWD:
		UP(ids, o->ids, BT);
		UP(w, o->w, (size_t)V * C);
		UP(b, o->b, (size_t)T * C);
		ALLOC(y, BT * C);
		cu_embedding_fwd(s, y, ids, w, b, B, T, C);
		DOWN(o->y, y, BT * C);
		break;
	case KERN_GPU_OP_EMB_BWD: {
		/* the token lists, built as the model builds them */
		std::vector<int32_t> order(BT), uniq, offs;
		for (size_t i = 0; i < BT; i++)
			order[i] = (int32_t)i;
		std::stable_sort(order.begin(), order.end(),
		                 [&](int32_t a, int32_t c) { return o->ids[a] < o->ids[c]; });
		for (size_t i = 0; i < BT; i++)
			if (i == 0 || o->ids[order[i]] != o->ids[order[i - 1]]) {
				uniq.push_back(o->ids[order[i]]);
				offs.push_back((int32_t)i);
			}
		offs.push_back((int32_t)BT);
		int32_t *du, *dof, *dpos;
		UP(dy, o->dy, BT * C);
		UP(dw, o->dw, (size_t)V * C);
		UP(db, o->db, (size_t)T * C);
		UP(du, uniq.data(), uniq.size());
		UP(dof, offs.data(), offs.size());
		UP(dpos, order.data(), BT);
		cu_embedding_bwd(s, dw, db, dy, du, dof, dpos, (int)uniq.size(), B, T, C);
		DOWN(o->dw, dw, (size_t)V * C);
		DOWN(o->db, db, (size_t)T * C);
		break;
	}
	default:
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA layer", "unknown op");
	}
#undef UP
#undef ALLOC
#undef DOWN
#undef PROD
	CU_SYNC(s, "a layer op");
	return KERN_GPU_OK;
}

static const kern_gpu_api api = {
	KERN_GPU_ABI_VERSION, cu_describe, cu_device_count, cu_device_info, cu_device_bench, cu_model_create,
	cu_model_free,        cu_set_params, cu_forward,    cu_backward,    cu_take_grads,   cu_layer_op,
	cu_host_register, cu_last_timings, cu_profile, cu_sketch_grads, cu_model_enc_forward,
	cu_model_opt_moments, cu_model_opt_norm, cu_model_opt_pass, cu_get_params, cu_add_grads,
};

extern "C" __attribute__((visibility("default"))) const kern_gpu_api *cotrain_cuda_api(void) { return &api; }
