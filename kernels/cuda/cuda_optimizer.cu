/* cotrain CUDA backend: local mode's inner optimizer steps on the device.
 * See cuda_optimizer.h; the CPU's versions of every loop here are in
 * kernels/optimizer.c (sumsq, adamw_segment, lamb_moments, lamb_apply). */
#include "kernels/cuda/cuda_optimizer.h"
#include "kernels/cuda/cuda_util.h"

#include <new>
#include <vector>

namespace {

/* A run of at most KERN_GPU_OPT_BLOCK elements inside one view. */
struct cu_seg {
	size_t lo;
	int len, view;
};

enum { THREADS = 256 };

} // namespace

struct cu_opt {
	size_t n;
	int n_views, nseg, nblocks;
	void *mem;        /* one device allocation: everything below but h_part */
	float *m1, *m2;   /* the inner moments */
	float *u;         /* LAMB's update, between its two passes */
	cu_seg *segs;     /* nseg */
	float *per_view;  /* n_views */
	double *part;     /* max(nblocks, 2 nseg) partial sums */
	double *h_part;   /* pinned, the same */
	bool set;         /* the moments were set (ZERO or UP) */
};

/* The CPU's combination of eight lane sums: for w = 4, 2, 1, a[j] += a[j + w]. */
__device__ static double lane_total(const double *a)
{
	double b0 = __dadd_rn(a[0], a[4]), b1 = __dadd_rn(a[1], a[5]), b2 = __dadd_rn(a[2], a[6]),
	       b3 = __dadd_rn(a[3], a[7]);
	b0 = __dadd_rn(b0, b2);
	b1 = __dadd_rn(b1, b3);
	return __dadd_rn(b0, b1);
}

/* One block of the flat gradient: divided, then its sum of squares as
 * kern_grad_norm's sumsq takes it (lanes over whole groups of 8, the tail
 * apart, added last). */
__global__ static void k_norm(float *g, size_t n, double divisor, double *part)
{
	__shared__ double lane[8];
	size_t lo = (size_t)blockIdx.x * KERN_GPU_OPT_BLOCK;
	int len = (int)(n - lo < KERN_GPU_OPT_BLOCK ? n - lo : KERN_GPU_OPT_BLOCK);
	float *x = g + lo;
	for (int i = threadIdx.x; i < len; i += blockDim.x)
		x[i] = __double2float_rn(__ddiv_rn((double)x[i], divisor));
	__syncthreads();
	int full = len / 8 * 8;
	if (threadIdx.x < 8) {
		double a = 0;
		for (int i = threadIdx.x; i < full; i += 8) {
			double v = x[i];
			a = __dadd_rn(a, __dmul_rn(v, v));
		}
		lane[threadIdx.x] = a;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		double tail = 0;
		for (int i = full; i < len; i++) {
			double v = x[i];
			tail = __dadd_rn(tail, __dmul_rn(v, v));
		}
		part[blockIdx.x] = __dadd_rn(lane_total(lane), tail);
	}
}

/* AdamW on one segment (adamw_segment's operations), the gradient zeroed. */
__global__ static void k_adamw(float *p, float *g, float *m1, float *m2, const cu_seg *segs, const float *keep_v,
                               float coef, float b1, float b2, float eps, float step_size, float bc2_sqrt)
{
	cu_seg sg = segs[blockIdx.x];
	float keep = keep_v[sg.view], omb1 = __fsub_rn(1.0f, b1), omb2 = __fsub_rn(1.0f, b2), nstep = -step_size;
	for (int i = threadIdx.x; i < sg.len; i += blockDim.x) {
		size_t k = sg.lo + (size_t)i;
		float gi = __fmul_rn(g[k], coef);
		float pi = __fmul_rn(p[k], keep);
		float mi = __fadd_rn(__fmul_rn(m1[k], b1), __fmul_rn(omb1, gi));
		float vi = __fadd_rn(__fmul_rn(m2[k], b2), __fmul_rn(__fmul_rn(omb2, gi), gi));
		float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
		p[k] = __fadd_rn(pi, __fmul_rn(nstep, __fdiv_rn(mi, denom)));
		m1[k] = mi;
		m2[k] = vi;
		g[k] = 0.0f;
	}
}

/* LAMB's first pass on one segment (lamb_moments' operations): moments,
 * u kept, the gradient zeroed, then ||p||^2 and ||u||^2 over the CPU's
 * eight lanes (element i in lane i % 8, in order, the tail included). */
__global__ static void k_lamb_moments(const float *p, float *g, float *m1, float *m2, float *u, const cu_seg *segs,
                                      const float *wd_v, float coef, float b1, float b2, float eps, float bc1,
                                      float bc2, double *p2, double *u2)
{
	__shared__ double pl[8], ul[8];
	cu_seg sg = segs[blockIdx.x];
	float wd = wd_v[sg.view], omb1 = __fsub_rn(1.0f, b1), omb2 = __fsub_rn(1.0f, b2);
	for (int i = threadIdx.x; i < sg.len; i += blockDim.x) {
		size_t k = sg.lo + (size_t)i;
		float gi = __fmul_rn(g[k], coef);
		float mi = __fadd_rn(__fmul_rn(m1[k], b1), __fmul_rn(omb1, gi));
		float vi = __fadd_rn(__fmul_rn(m2[k], b2), __fmul_rn(__fmul_rn(omb2, gi), gi));
		float uk = __fadd_rn(__fdiv_rn(__fdiv_rn(mi, bc1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, bc2)), eps)),
		                     __fmul_rn(wd, p[k]));
		m1[k] = mi;
		m2[k] = vi;
		u[k] = uk;
		g[k] = 0.0f;
	}
	__syncthreads();
	if (threadIdx.x < 8) {
		double pa = 0, ua = 0;
		for (int i = threadIdx.x; i < sg.len; i += 8) {
			double pv = p[sg.lo + (size_t)i], uv = u[sg.lo + (size_t)i];
			pa = __dadd_rn(pa, __dmul_rn(pv, pv));
			ua = __dadd_rn(ua, __dmul_rn(uv, uv));
		}
		pl[threadIdx.x] = pa;
		ul[threadIdx.x] = ua;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		p2[blockIdx.x] = lane_total(pl);
		u2[blockIdx.x] = lane_total(ul);
	}
}

/* LAMB's second pass (lamb_apply's): p -= scale u, u as the first pass left it. */
__global__ static void k_lamb_apply(float *p, const float *u, const cu_seg *segs, const float *scale_v)
{
	cu_seg sg = segs[blockIdx.x];
	float scale = scale_v[sg.view];
	for (int i = threadIdx.x; i < sg.len; i += blockDim.x) {
		size_t k = sg.lo + (size_t)i;
		p[k] = __fsub_rn(p[k], __fmul_rn(scale, u[k]));
	}
}

void cu_opt_free(cu_opt *o)
{
	if (!o)
		return;
	cudaFree(o->mem);
	cudaFreeHost(o->h_part);
	delete o;
}

int cu_opt_create(const kern_view *views, int n_views, size_t n, cu_opt **out, char *err, size_t errlen)
{
	*out = NULL;
	std::vector<cu_seg> segs;
	for (int v = 0; v < n_views; v++)
		for (size_t lo = 0; lo < views[v].numel; lo += KERN_GPU_OPT_BLOCK) {
			size_t left = views[v].numel - lo;
			segs.push_back(cu_seg{ views[v].offset + lo,
			                       (int)(left < KERN_GPU_OPT_BLOCK ? left : KERN_GPU_OPT_BLOCK), v });
		}
	cu_opt *o = new (std::nothrow) cu_opt();
	if (!o)
		return cu_fail(err, errlen, KERN_GPU_ENOMEM, "CUDA backend", "out of host memory");
	o->n = n;
	o->n_views = n_views;
	o->nseg = (int)segs.size();
	o->nblocks = (int)((n + KERN_GPU_OPT_BLOCK - 1) / KERN_GPU_OPT_BLOCK);
	size_t nparts = (size_t)(o->nblocks > 2 * o->nseg ? o->nblocks : 2 * o->nseg) + 1;
	auto up = [](size_t b) { return (b + 255) & ~(size_t)255; };
	size_t fl = up(n * sizeof(float)), sg = up(segs.size() * sizeof(cu_seg) + 1),
	       pv = up((size_t)n_views * sizeof(float) + 1), pt = up(nparts * sizeof(double));
	cudaError_t e = cudaMalloc(&o->mem, 3 * fl + sg + pv + pt);
	if (e == cudaSuccess)
		e = cudaMallocHost(&o->h_part, nparts * sizeof(double));
	if (e != cudaSuccess) {
		cudaGetLastError(); /* a failed allocation must not fail the next launch's check */
		cu_opt_free(o);
		return cu_fail(err, errlen, cu_code(e), "allocating the inner optimizer's device memory",
		               cudaGetErrorString(e));
	}
	char *b = (char *)o->mem;
	o->m1 = (float *)b;
	o->m2 = (float *)(b + fl);
	o->u = (float *)(b + 2 * fl);
	o->segs = (cu_seg *)(b + 3 * fl);
	o->per_view = (float *)(b + 3 * fl + sg);
	o->part = (double *)(b + 3 * fl + sg + pv);
	e = cudaMemcpy(o->segs, segs.data(), segs.size() * sizeof(cu_seg), cudaMemcpyHostToDevice);
	if (e != cudaSuccess) {
		cu_opt_free(o);
		return cu_fail(err, errlen, cu_code(e), "copying the optimizer's segments to the GPU",
		               cudaGetErrorString(e));
	}
	*out = o;
	return KERN_GPU_OK;
}

int cu_opt_moments(cu_opt *o, float *host_m1, float *host_m2, int how, cudaStream_t s, char *err, size_t errlen)
{
	size_t bytes = o->n * sizeof(float);
	if (how == KERN_GPU_MOM_ZERO) {
		CU_TRY(cudaMemsetAsync(o->m1, 0, bytes, s), "zeroing the inner moments");
		CU_TRY(cudaMemsetAsync(o->m2, 0, bytes, s), "zeroing the inner moments");
		o->set = true;
	} else if (how == KERN_GPU_MOM_UP) {
		CU_TRY(cudaMemcpyAsync(o->m1, host_m1, bytes, cudaMemcpyHostToDevice, s), "copying the moments up");
		CU_TRY(cudaMemcpyAsync(o->m2, host_m2, bytes, cudaMemcpyHostToDevice, s), "copying the moments up");
		o->set = true;
	} else if (how == KERN_GPU_MOM_DOWN && o->set) {
		CU_TRY(cudaMemcpyAsync(host_m1, o->m1, bytes, cudaMemcpyDeviceToHost, s), "copying the moments down");
		CU_TRY(cudaMemcpyAsync(host_m2, o->m2, bytes, cudaMemcpyDeviceToHost, s), "copying the moments down");
	} else {
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend",
		               how == KERN_GPU_MOM_DOWN ? "the inner moments are not set" : "bad opt_moments mode");
	}
	CU_SYNC(s, "the inner moments");
	return KERN_GPU_OK;
}

int cu_opt_norm(cu_opt *o, float *grads, double divisor, double *host_part, cudaStream_t s, char *err,
                size_t errlen)
{
	if (!o->set)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the inner moments are not set");
	if (!(divisor > 0))
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the gradient's divisor is not positive");
	if (o->nblocks > 0) {
		k_norm<<<o->nblocks, THREADS, 0, s>>>(grads, o->n, divisor, o->part);
		CU_TRY(cudaMemcpyAsync(o->h_part, o->part, (size_t)o->nblocks * sizeof(double),
		                       cudaMemcpyDeviceToHost, s),
		       "copying the gradient's norm down");
	}
	CU_SYNC(s, "the gradient's norm");
	memcpy(host_part, o->h_part, (size_t)o->nblocks * sizeof(double));
	return KERN_GPU_OK;
}

int cu_opt_pass(cu_opt *o, float *params, float *grads, const kern_gpu_opt_pass *p, cudaStream_t s, char *err,
                size_t errlen)
{
	if (!o->set)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the inner moments are not set");
	if (p->n_views != o->n_views || !p->per_view)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the pass's views are not the model's");
	CU_TRY(cudaMemcpyAsync(o->per_view, p->per_view, (size_t)o->n_views * sizeof(float), cudaMemcpyHostToDevice,
	                       s),
	       "copying the pass's factors up");
	int nb = o->nseg;
	if (nb > 0) {
		switch (p->pass) {
		case KERN_GPU_PASS_ADAMW:
			k_adamw<<<nb, THREADS, 0, s>>>(params, grads, o->m1, o->m2, o->segs, o->per_view, p->coef, p->beta1,
			                               p->beta2, p->eps, p->step_size, p->bc2_sqrt);
			break;
		case KERN_GPU_PASS_LAMB_MOMENTS:
			if (!p->host_p2 || !p->host_u2)
				return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "LAMB's sums have nowhere to go");
			k_lamb_moments<<<nb, THREADS, 0, s>>>(params, grads, o->m1, o->m2, o->u, o->segs, o->per_view,
			                                      p->coef, p->beta1, p->beta2, p->eps, p->bc1, p->bc2, o->part,
			                                      o->part + nb);
			CU_TRY(cudaMemcpyAsync(o->h_part, o->part, 2 * (size_t)nb * sizeof(double), cudaMemcpyDeviceToHost,
			                       s),
			       "copying LAMB's sums down");
			break;
		case KERN_GPU_PASS_LAMB_APPLY:
			k_lamb_apply<<<nb, THREADS, 0, s>>>(params, o->u, o->segs, o->per_view);
			break;
		default:
			return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "unknown optimizer pass");
		}
	}
	CU_SYNC(s, "an inner optimizer step");
	if (p->pass == KERN_GPU_PASS_LAMB_MOMENTS && nb > 0) {
		memcpy(p->host_p2, o->h_part, (size_t)nb * sizeof(double));
		memcpy(p->host_u2, o->h_part + nb, (size_t)nb * sizeof(double));
	}
	return KERN_GPU_OK;
}
