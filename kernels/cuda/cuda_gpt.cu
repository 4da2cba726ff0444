/* cotrain CUDA backend: the GPT model's forward and backward on one GPU.
 *
 * The same passes as kernels/model.c, layer for layer, on device buffers:
 * parameters and the gradient are one flat fp32 buffer each, in the host's
 * layout (the views the caller passes), so a step's parameters go up and
 * its gradient comes down in one copy.  The matrix products run in the
 * model's precision (cuda_layers.h): in fp32 and tf32 on the fp32
 * activations; in bf16 on bf16 copies that the kernel producing each
 * operand writes beside (or instead of) its fp32 output, and on a bf16 copy
 * of the parameters made once per forward, so no product converts its
 * operands.
 * Attention in bf16 mode runs fused (cuda_flash.h) where the shape allows
 * (head size 64, T a multiple of 128); elsewhere, and in fp32 and tf32, it
 * materialises each (sample, head) pair's [T, T] probabilities, as the CPU
 * does (GPT-2 small at B 16, T 1024: 0.8 GB a layer).
 * COTRAIN_CUDA_ATTENTION=materialized forces the second path (to compare). */
#include "kernels/cuda/cuda_encoder.h"
#include "kernels/cuda/cuda_flash.h"
#include "kernels/cuda/cuda_layers.h"
#include "kernels/cuda/cuda_optimizer.h"
#include "kernels/cuda/cuda_prof.h"
#include "kernels/cuda/cuda_sketch.h"
#include "kernels/cuda/cuda_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define LN_EPS 1e-5f /* kernels/layernorm.h's KERN_LN_EPS */

static const char *const prof_names[PROF_KINDS] = { "products",    "qkv split",   "attention fwd",
	                                            "attention bwd", "layernorm", "elementwise",
	                                            "head logits", "head dx", "head dW", "cross-entropy",
	                                            "embedding+copies" };

namespace {

struct layer_buf {
	/* ln1, ln2 and fchg exist in fp32 only outside bf16 mode, and their
	 * *16 copies only in it (NULL otherwise) */
	float *ln1, *ln1_mean, *ln1_rstd, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg, *res3;
	__nv_bfloat16 *ln1_16, *atty16, *ln2_16, *fchg16;
	void *qkvp; /* of cu_att_elem bytes: fp32, or bf16 in bf16 mode */
	void *att;  /* the probabilities (the same type), or the fused path's logsumexp (fp32) */
};

/* offsets of one parameter set's 12 tensors (model.h's order) */
struct set_off {
	size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};

} // namespace

struct kern_gpu_model {
	kern_config c;
	/* an encoder's passes (cuda_encoder.h), on this model's device,
	 * stream, products, parameters and gradient; NULL for the GPT */
	cu_encoder *enc;
	int max_batch, precision, device;
	int Vp; /* the logits' row stride: the vocabulary rounded up to 64 */
	bool flash; /* the attention runs fused (cuda_flash.h) */
	size_t n_params, wte, wpe, lnfw, lnfb;
	std::vector<set_off> sets;
	cublasHandle_t blas;
	cudaStream_t s;
	cu_gemm_ctx gx; /* the products' handle, precision and bf16 scratch */
	void *mem; /* one allocation: everything below on the device */
	void *blas_ws;
	float *params, *grads;
	std::vector<layer_buf> L;
	float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *lse, *losses;
	float *dres, *dln, *dqkv, *dqkvp, *datty, *yp, *dfch, *dfchg, *scratch;
	void *dyp, *datt;           /* of cu_att_elem bytes (fused: datt holds D, fp32) */
	/* bf16 mode: the head's operands in bf16, wte's rows padded to Vp with
	 * zeros (so the products run on whole, aligned tiles) */
	__nv_bfloat16 *dlogits16, *wte16, *lnf16;
	/* bf16 mode: the parameters, and the gradients the products read */
	__nv_bfloat16 *params16, *dres16, *dfch16, *dqkv16;
	int32_t *tokens, *targets, *uniq, *offs, *pos;
	/* host side: the embedding gradient's token lists, the losses */
	std::vector<int32_t> h_cnt, h_uniq, h_offs, h_pos;
	float *h_losses; /* pinned */
	float *h_stage;  /* pinned, n_params: the gradient on its way down */
	double *sk_scratch; /* cu_sketch's, allocated at the first sketch */
	/* local mode's inner steps: the views they run over, and their state
	 * (allocated at the first opt_moments) */
	std::vector<kern_view> views;
	cu_opt *opt;
	int B, have_targets, n_uniq;
	cudaEvent_t ev[3];
	double ms[2];
	cu_prof pf; /* COTRAIN_CUDA_PROFILE's stage times (an encoder's too) */
};

/* Lay out (or, with base NULL, count) the device memory of a model. */
static size_t dev_layout(kern_gpu_model *g, char *base)
{
	const kern_config *c = &g->c;
	size_t BT = (size_t)g->max_batch * c->seq_len, C = c->d_model, F = c->d_ff, V = c->vocab,
	       att = (size_t)g->max_batch * c->n_head * c->seq_len * c->seq_len, off = 0;
#define TAKE(ptr, n, type) \
	do { \
		if (base) \
			(ptr) = (type *)(base + off); \
		off += ((n) * sizeof(type) + 255) & ~(size_t)255; \
	} while (0)
#define TAKEF(ptr, n) TAKE(ptr, n, float)
#define TAKEA(ptr, n) TAKE(ptr, (n) * ae, char)
	size_t ae = cu_att_elem(g->precision);
	/* the fused attention keeps a logsumexp per query row, not [T, T] */
	size_t att_bytes = g->flash ? (size_t)g->max_batch * c->n_head * c->seq_len * sizeof(float) : att * ae;
	/* products' operands in fp32 only outside bf16 mode (which reads
	 * their bf16 copies); the materialised attention's scratch only where
	 * it runs */
	bool f32 = g->precision != KERN_PREC_BF16;
	TAKEF(g->params, g->n_params);
	TAKEF(g->grads, g->n_params);
	if (c->arch != KERN_ARCH_GPT) { /* the encoder's activations are its own */
		if (!f32)
			TAKE(g->params16, g->n_params, __nv_bfloat16);
		return off;
	}
	TAKEF(g->encoded, BT * C);
	for (auto &l : g->L) {
		if (f32)
			TAKEF(l.ln1, BT * C);
		TAKEF(l.ln1_mean, BT);
		TAKEF(l.ln1_rstd, BT);
		TAKEA(l.qkvp, 3 * BT * C);
		TAKE(l.att, att_bytes, char);
		TAKEF(l.atty, BT * C);
		TAKEF(l.res2, BT * C);
		if (f32)
			TAKEF(l.ln2, BT * C);
		TAKEF(l.ln2_mean, BT);
		TAKEF(l.ln2_rstd, BT);
		TAKEF(l.fch, BT * F);
		if (f32)
			TAKEF(l.fchg, BT * F);
		TAKEF(l.res3, BT * C);
		if (g->precision == KERN_PREC_BF16) {
			TAKE(l.ln1_16, BT * C, __nv_bfloat16);
			TAKE(l.atty16, BT * C, __nv_bfloat16);
			TAKE(l.ln2_16, BT * C, __nv_bfloat16);
			TAKE(l.fchg16, BT * F, __nv_bfloat16);
		}
	}
	if (f32)
		TAKEF(g->lnf, BT * C);
	TAKEF(g->lnf_mean, BT);
	TAKEF(g->lnf_rstd, BT);
	TAKEF(g->logits, BT * g->Vp);
	TAKEF(g->lse, BT);
	TAKEF(g->losses, BT);
	TAKEF(g->dres, BT * C);
	TAKEF(g->dln, BT * C);
	TAKEF(g->dqkv, 3 * BT * C);
	if (!g->flash)
		TAKEF(g->dqkvp, 3 * BT * C);
	TAKEF(g->datty, BT * C);
	if (!g->flash)
		TAKEF(g->yp, BT * C);
	TAKEF(g->dfch, BT * F);
	TAKEF(g->dfchg, BT * F);
	TAKE(g->datt, att_bytes, char);
	TAKEA(g->dyp, BT * C);
	size_t widest = 3 * C > F ? 3 * C : F;
	TAKEF(g->scratch, cu_colsum_scratch((int)BT, (int)(widest > V ? widest : V)));
	TAKE(g->tokens, BT, int32_t);
	TAKE(g->targets, BT, int32_t);
	TAKE(g->uniq, BT, int32_t);
	TAKE(g->offs, BT + 1, int32_t);
	TAKE(g->pos, BT, int32_t);
	if (g->precision == KERN_PREC_BF16) {
		TAKE(g->params16, g->n_params, __nv_bfloat16);
		TAKE(g->dres16, BT * C, __nv_bfloat16);
		TAKE(g->dfch16, BT * F, __nv_bfloat16);
		TAKE(g->dqkv16, 3 * BT * C, __nv_bfloat16);
		TAKE(g->dlogits16, BT * g->Vp, __nv_bfloat16);
		TAKE(g->wte16, (size_t)g->Vp * C, __nv_bfloat16);
		TAKE(g->lnf16, BT * C, __nv_bfloat16);
	}
#undef TAKEF
#undef TAKEA
#undef TAKE
	return off;
}

extern "C" void cu_model_free(kern_gpu_model *g)
{
	if (!g)
		return;
	cudaSetDevice(g->device);
	if (g->s)
		cudaStreamSynchronize(g->s);
	cu_enc_free(g->enc);
	for (auto &e : g->ev)
		if (e)
			cudaEventDestroy(e);
	for (auto &e : g->pf.ev)
		if (e)
			cudaEventDestroy(e);
	if (g->blas)
		cublasDestroy(g->blas);
	if (g->s)
		cudaStreamDestroy(g->s);
	cudaFree(g->mem);
	cudaFree(g->blas_ws);
	cudaFree(g->sk_scratch);
	cu_opt_free(g->opt);
	cudaFreeHost(g->h_losses);
	cudaFreeHost(g->h_stage);
	delete g;
}

static int model_on_device(kern_gpu_model *g, size_t BT, char *err, size_t errlen);

/* The rest of cu_model_create for an encoder: the device, stream,
 * products, parameters and gradient here, its passes cuda_encoder.cu's. */
static int enc_model_create(kern_gpu_model *g, const kern_view *views, int n_views, kern_gpu_model **out, char *err,
                            size_t errlen)
{
	int rc = model_on_device(g, (size_t)g->max_batch * g->c.seq_len, err, errlen);
	if (!rc)
		rc = cu_enc_create(&g->c, views, n_views, g->max_batch, &g->gx, g->params, g->grads, g->params16,
		                   g->n_params, &g->pf, &g->enc, err, errlen);
	if (rc) {
		cu_model_free(g);
		return rc;
	}
	*out = g;
	return KERN_GPU_OK;
}

extern "C" int cu_model_create(const kern_config *c, const kern_view *views, int n_views, int max_batch, int device,
                               int precision, kern_gpu_model **out, char *err, size_t errlen)
{
	*out = NULL;
	if (max_batch < 1 || precision < KERN_PREC_FP32 || precision > KERN_PREC_BF16)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "bad batch or precision");
	kern_gpu_model *g = new (std::nothrow) kern_gpu_model();
	if (!g)
		return cu_fail(err, errlen, KERN_GPU_ENOMEM, "CUDA backend", "out of host memory");
	g->c = *c;
	g->max_batch = max_batch;
	g->precision = precision;
	g->device = device;
	for (int i = 0; i < n_views; i++)
		g->n_params += views[i].numel;
	g->views.assign(views, views + n_views);
	if (c->arch != KERN_ARCH_GPT)
		return enc_model_create(g, views, n_views, out, err, errlen);
	g->Vp = (c->vocab + 63) / 64 * 64;
	const char *ae = getenv("COTRAIN_CUDA_ATTENTION");
	g->flash = cu_flash_fits(precision, c->seq_len, c->d_model, c->n_head) &&
	           !(ae && strcmp(ae, "materialized") == 0);
	size_t C = c->d_model, F = c->d_ff;
	int ok = cu_find_view(views, n_views, "wte", (size_t)c->vocab * C, &g->wte) &&
	         cu_find_view(views, n_views, "wpe", (size_t)c->seq_len * C, &g->wpe) &&
	         cu_find_view(views, n_views, "ln_f.weight", C, &g->lnfw) &&
	         cu_find_view(views, n_views, "ln_f.bias", C, &g->lnfb);
	for (int s = 0; ok && s < c->n_shared; s++) {
		set_off o;
		char nm[64];
#define V(field, suffix, numel) \
	(snprintf(nm, sizeof nm, "h.%d.%s", s, suffix), cu_find_view(views, n_views, nm, numel, &o.field))
		ok = V(ln1w, "ln_1.weight", C) && V(ln1b, "ln_1.bias", C) && V(qkvw, "attn.c_attn.weight", C * 3 * C) &&
		     V(qkvb, "attn.c_attn.bias", 3 * C) && V(projw, "attn.c_proj.weight", C * C) &&
		     V(projb, "attn.c_proj.bias", C) && V(ln2w, "ln_2.weight", C) && V(ln2b, "ln_2.bias", C) &&
		     V(fcw, "mlp.c_fc.weight", C * F) && V(fcb, "mlp.c_fc.bias", F) &&
		     V(fcprojw, "mlp.c_proj.weight", F * C) && V(fcprojb, "mlp.c_proj.bias", C);
#undef V
		g->sets.push_back(o);
	}
	if (!ok) {
		delete g;
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the parameter views are not a gpt's");
	}
	g->L.resize((size_t)c->n_layer);
	g->h_cnt.assign((size_t)c->vocab, 0);
	size_t BT = (size_t)max_batch * c->seq_len;
	g->h_uniq.resize(BT);
	g->h_offs.resize(BT + 1);
	g->h_pos.resize(BT);
	int rc = model_on_device(g, BT, err, errlen);
	if (rc) {
		cu_model_free(g);
		return rc;
	}
	*out = g;
	return KERN_GPU_OK;
}

/* The device half of cu_model_create: stream, events, memory, cuBLAS. */
static int model_on_device(kern_gpu_model *g, size_t BT, char *err, size_t errlen)
{
	int device = g->device;
	CU_TRY(cudaSetDevice(device), "selecting the GPU");
	CU_TRY(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking), "creating a stream");
	for (auto &e : g->ev)
		CU_TRY(cudaEventCreate(&e), "creating an event");
	size_t bytes = dev_layout(g, NULL);
	CU_TRY(cudaMalloc(&g->mem, bytes), "allocating the model's device memory");
	dev_layout(g, (char *)g->mem);
	CU_TRY(cudaMemsetAsync(g->grads, 0, g->n_params * sizeof(float), g->s), "zeroing the gradient");
	if (g->wte16) /* its padding rows stay zero */
		CU_TRY(cudaMemsetAsync(g->wte16, 0, (size_t)g->Vp * g->c.d_model * sizeof(__nv_bfloat16), g->s),
		       "zeroing the head's operand");
	CU_TRY(cudaMallocHost(&g->h_losses, BT * sizeof(float)), "allocating pinned memory");
	CU_TRY(cudaMallocHost(&g->h_stage, g->n_params * sizeof(float)), "allocating pinned memory");
	CUBLAS_TRY(cublasCreate(&g->blas), "creating the cuBLAS handle");
	CUBLAS_TRY(cublasSetStream(g->blas, g->s), "cuBLAS stream");
	/* a fixed workspace: cuBLAS's results then depend on nothing else */
	size_t ws = 32u << 20;
	CU_TRY(cudaMalloc(&g->blas_ws, ws), "allocating the cuBLAS workspace");
	CUBLAS_TRY(cublasSetWorkspace(g->blas, g->blas_ws, ws), "cuBLAS workspace");
	CUBLAS_TRY(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH), "cuBLAS math mode");
	g->gx.h = g->blas;
	g->gx.s = g->s;
	g->gx.precision = g->precision;
	const char *pe = getenv("COTRAIN_CUDA_PROFILE");
	if (pe && strcmp(pe, "1") == 0) {
		g->pf.on = true;
		g->pf.ev.resize(PROF_MAX_EVENTS);
		g->pf.kind.resize(PROF_MAX_EVENTS);
		for (auto &e : g->pf.ev)
			CU_TRY(cudaEventCreate(&e), "creating an event");
	}
	CU_SYNC(g->s, "creating the model");
	return KERN_GPU_OK;
}

extern "C" int cu_set_params(kern_gpu_model *g, const float *host, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	CU_TRY(cudaMemcpyAsync(g->params, host, g->n_params * sizeof(float), cudaMemcpyHostToDevice, g->s),
	       "copying the parameters to the GPU");
	CU_SYNC(g->s, "copying the parameters to the GPU");
	return KERN_GPU_OK;
}

/* the work from here to the next mark is of kind k (profiling only) */
#define MARK(k) cu_prof_mark(&g->pf, (k), g->s)

/* Sum the marks' intervals by kind, the last one ending at end. */
static void prof_collect(kern_gpu_model *g, cudaEvent_t end)
{
	cu_prof *p = &g->pf;
	if (!p->on)
		return;
	memset(p->ms, 0, sizeof p->ms);
	for (int k = 0; k < p->np; k++) {
		float ms = 0;
		cudaEventElapsedTime(&ms, p->ev[(size_t)k], k + 1 < p->np ? p->ev[(size_t)k + 1] : end);
		p->ms[p->kind[(size_t)k]] += ms;
	}
	p->np = 0;
}

extern "C" int cu_profile(kern_gpu_model *g, const char *const **names, const double **ms)
{
	*names = prof_names;
	*ms = g->pf.ms;
	return g->pf.on ? PROF_KINDS : 0;
}

#define P(off) (g->params + (off))
#define G(off) (g->grads + (off))
#define GEMM(ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc) \
	CUBLAS_TRY(cu_gemm(&g->gx, ta, tb, M, N, K, alpha, A, lda, 0, Bm, ldb, 0, beta, Cm, ldc, 0, \
	                   1), \
	           "a matrix product")
/* a product on the fp32 operands, or in bf16 mode on their bf16 copies */
#define PROD(ta, tb, M, N, K, alpha, A, A16, lda, Bm, B16, ldb, beta, Cm, ldc) \
	CUBLAS_TRY(g->params16 ? cu_gemm_bf16(&g->gx, ta, tb, M, N, K, alpha, A16, lda, B16, ldb, beta, Cm, ldc) \
	                       : cu_gemm(&g->gx, ta, tb, M, N, K, alpha, A, lda, 0, Bm, ldb, 0, beta, Cm, ldc, 0, 1), \
	           "a matrix product")
#define P16(off) (g->params16 ? g->params16 + (off) : NULL)
extern "C" int cu_forward(kern_gpu_model *g, const int32_t *tokens, const int32_t *targets, int B, double *loss,
                          char *err, size_t errlen)
{
	const kern_config *c = &g->c;
	if (loss)
		*loss = 0;
	if (g->enc)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA forward", "an encoder's batches take enc_forward");
	if (B < 1 || B > g->max_batch)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA forward", "batch size outside 1..max_batch");
	int T = c->seq_len, C = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab, BT = B * T;
	for (int i = 0; i < BT; i++)
		if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
			return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA forward", "a token outside the vocabulary");
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	g->B = 0;
	cudaStream_t s = g->s;
	CU_TRY(cudaEventRecord(g->ev[0], s), "recording an event");
	g->pf.np = 0; /* marks of a forward that no backward collected */
	MARK(PROF_EMBEDDING);
	CU_TRY(cudaMemcpyAsync(g->tokens, tokens, BT * sizeof(int32_t), cudaMemcpyHostToDevice, s), "copying tokens");
	if (targets) {
		CU_TRY(cudaMemcpyAsync(g->targets, targets, BT * sizeof(int32_t), cudaMemcpyHostToDevice, s),
		       "copying targets");
		g->n_uniq = cu_token_lists(tokens, BT, g->h_cnt.data(), g->h_uniq.data(), g->h_offs.data(),
		                           g->h_pos.data());
		CU_TRY(cudaMemcpyAsync(g->uniq, g->h_uniq.data(), g->n_uniq * sizeof(int32_t), cudaMemcpyHostToDevice, s),
		       "copying token lists");
		CU_TRY(cudaMemcpyAsync(g->offs, g->h_offs.data(), (g->n_uniq + 1) * sizeof(int32_t),
		                       cudaMemcpyHostToDevice, s),
		       "copying token lists");
		CU_TRY(cudaMemcpyAsync(g->pos, g->h_pos.data(), BT * sizeof(int32_t), cudaMemcpyHostToDevice, s),
		       "copying token lists");
	}
	cu_embedding_fwd(s, g->encoded, g->tokens, P(g->wte), P(g->wpe), B, T, C);
	bool bf = g->params16 != NULL; /* bf16 mode: the products' operands in bf16 */
	if (bf)
		cu_to_bf16(s, g->params16, g->params, (long)g->n_params);
	const float *res = g->encoded;
	for (int l = 0; l < c->n_layer; l++) {
		const set_off &p = g->sets[(size_t)((long)l * c->n_shared / c->n_layer)];
		layer_buf &a = g->L[(size_t)l];
		MARK(PROF_LAYERNORM);
		cu_layernorm_fwd(s, bf ? NULL : a.ln1, a.ln1_16, a.ln1_mean, a.ln1_rstd, res, P(p.ln1w), P(p.ln1b), BT, C,
		                 LN_EPS);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, 3 * C, C, 1.0f, a.ln1, a.ln1_16, C, P(p.qkvw), P16(p.qkvw), 3 * C, 0.0f, g->dqkv,
		     3 * C);
		if (g->flash) {
			MARK(PROF_SPLIT);
			cu_qkv_split16(s, (__nv_bfloat16 *)a.qkvp, g->dqkv, P(p.qkvb), B, T, C, NH);
			MARK(PROF_ATTENTION);
			cu_flash_fwd(s, a.atty, a.atty16, (float *)a.att, (const __nv_bfloat16 *)a.qkvp, B, T, C, NH, true);
		} else {
			MARK(PROF_ATTENTION);
			CUBLAS_TRY(cu_attention_fwd(&g->gx, a.atty, a.att, a.qkvp, g->yp, g->dqkv, P(p.qkvb), B, T, C, NH, true),
			           "the attention");
			if (bf)
				cu_to_bf16(s, a.atty16, a.atty, (long)BT * C);
		}
		MARK(PROF_PRODUCTS);
		cu_rows_bias(s, a.res2, res, P(p.projb), BT, C);
		PROD(false, false, BT, C, C, 1.0f, a.atty, a.atty16, C, P(p.projw), P16(p.projw), C, 1.0f, a.res2, C);
		MARK(PROF_LAYERNORM);
		cu_layernorm_fwd(s, bf ? NULL : a.ln2, a.ln2_16, a.ln2_mean, a.ln2_rstd, a.res2, P(p.ln2w), P(p.ln2b), BT,
		                 C, LN_EPS);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, F, C, 1.0f, a.ln2, a.ln2_16, C, P(p.fcw), P16(p.fcw), F, 0.0f, a.fch, F);
		MARK(PROF_ELEMENTWISE);
		cu_bias_gelu_fwd(s, bf ? NULL : a.fchg, a.fchg16, a.fch, P(p.fcb), BT, F);
		MARK(PROF_PRODUCTS);
		cu_rows_bias(s, a.res3, a.res2, P(p.fcprojb), BT, C);
		PROD(false, false, BT, C, F, 1.0f, a.fchg, a.fchg16, F, P(p.fcprojw), P16(p.fcprojw), C, 1.0f, a.res3,
		     C);
		res = a.res3;
	}
	MARK(PROF_LAYERNORM);
	cu_layernorm_fwd(s, bf ? NULL : g->lnf, g->lnf16, g->lnf_mean, g->lnf_rstd, res, P(g->lnfw), P(g->lnfb), BT,
	                 C, LN_EPS);
	MARK(PROF_HEAD);
	if (bf) { /* the product over the padded Vp columns: wte's rows from the bf16 parameters */
		CU_TRY(cudaMemcpyAsync(g->wte16, g->params16 + g->wte, (size_t)V * C * sizeof(__nv_bfloat16),
		                       cudaMemcpyDeviceToDevice, s),
		       "copying wte for the head");
		CUBLAS_TRY(cu_gemm_bf16(&g->gx, false, true, BT, g->Vp, C, 1.0f, g->lnf16, C, g->wte16, C, 0.0f,
		                        g->logits, g->Vp),
		           "a matrix product");
	} else {
		GEMM(false, true, BT, V, C, 1.0f, g->lnf, C, P(g->wte), C, 0.0f, g->logits, g->Vp);
	}
	if (targets) {
		MARK(PROF_CE);
		cu_crossentropy_fwd(s, g->losses, g->lse, g->logits, g->targets, BT, V, g->Vp);
		CU_TRY(cudaMemcpyAsync(g->h_losses, g->losses, BT * sizeof(float), cudaMemcpyDeviceToHost, s),
		       "copying the losses");
	}
	CU_TRY(cudaEventRecord(g->ev[1], s), "recording an event");
	CU_SYNC(s, "the forward pass");
	if (targets && loss) {
		double sum = 0;
		for (int i = 0; i < BT; i++)
			sum += g->h_losses[i];
		*loss = sum / BT;
	}
	g->have_targets = targets != NULL;
	g->B = B;
	return KERN_GPU_OK;
}

extern "C" int cu_model_enc_forward(kern_gpu_model *g, const int32_t *ids, const int32_t *segs,
                                    const int32_t *labels, const int32_t *sop, int B, double *res, char *err,
                                    size_t errlen)
{
	if (!g->enc)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA encoder forward", "the model is a gpt");
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	CU_TRY(cudaEventRecord(g->ev[0], g->s), "recording an event");
	g->pf.np = 0;
	int rc = cu_enc_forward(g->enc, ids, segs, labels, sop, B, res, err, errlen);
	if (!rc)
		CU_TRY(cudaEventRecord(g->ev[1], g->s), "recording an event");
	return rc;
}

/* an encoder's backward, timed as the GPT's */
static int enc_backward(kern_gpu_model *g, float scale, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	int rc = cu_enc_backward(g->enc, scale, err, errlen);
	if (rc)
		return rc;
	CU_TRY(cudaEventRecord(g->ev[2], g->s), "recording an event");
	CU_SYNC(g->s, "the backward pass");
	float f = 0, b = 0;
	cudaEventElapsedTime(&f, g->ev[0], g->ev[1]);
	cudaEventElapsedTime(&b, g->ev[1], g->ev[2]);
	g->ms[0] = f;
	g->ms[1] = b;
	prof_collect(g, g->ev[2]);
	return KERN_GPU_OK;
}

extern "C" int cu_backward(kern_gpu_model *g, float dscale, char *err, size_t errlen)
{
	if (g->enc)
		return enc_backward(g, dscale, err, errlen);
	const kern_config *c = &g->c;
	if (g->B == 0 || !g->have_targets)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backward",
		               "no forward pass with targets preceded it");
	int B = g->B, T = c->seq_len, C = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab, BT = B * T,
	    L = c->n_layer;
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	cudaStream_t s = g->s;
	long BTC = (long)BT * C;
	int Vp = g->Vp;
	/* the head; the logits become their gradient (the forward's logits are
	 * not kept: kern_logits is the CPU model's) */
	MARK(PROF_CE);
	if (g->dlogits16) { /* bf16: the gradient written once in bf16 (zeros past V), read so by both
	                       products beside the forward's bf16 operands */
		cu_crossentropy_bwd16(s, g->dlogits16, g->logits, g->lse, g->targets, BT, V, Vp, dscale / (float)BT);
		MARK(PROF_HEAD_DX);
		CUBLAS_TRY(cu_gemm_bf16(&g->gx, false, false, BT, C, Vp, 1.0f, g->dlogits16, Vp, g->wte16, C, 0.0f,
		                        g->dln, C),
		           "a matrix product");
		MARK(PROF_HEAD_DW);
		CUBLAS_TRY(cu_gemm_bf16(&g->gx, true, false, V, C, BT, 1.0f, g->dlogits16, Vp, g->lnf16, C, 1.0f,
		                        G(g->wte), C),
		           "a matrix product");
	} else {
		cu_crossentropy_bwd(s, g->logits, g->lse, g->targets, BT, V, Vp, dscale / (float)BT);
		MARK(PROF_HEAD_DX);
		GEMM(false, false, BT, C, V, 1.0f, g->logits, Vp, P(g->wte), C, 0.0f, g->dln, C);
		MARK(PROF_HEAD_DW);
		GEMM(true, false, V, C, BT, 1.0f, g->logits, Vp, g->lnf, C, 1.0f, G(g->wte), C);
	}
	MARK(PROF_LAYERNORM);
	CU_TRY(cudaMemsetAsync(g->dres, 0, BTC * sizeof(float), s), "zeroing a gradient");
	cu_layernorm_bwd(s, g->dres, g->dres16, G(g->lnfw), G(g->lnfb), g->dln, g->L[(size_t)L - 1].res3, P(g->lnfw),
	                 g->lnf_mean, g->lnf_rstd, BT, C, g->scratch);
	g->B = 0; /* the logits are spent */
	for (int l = L - 1; l >= 0; l--) {
		const set_off &p = g->sets[(size_t)((long)l * c->n_shared / c->n_layer)];
		layer_buf &a = g->L[(size_t)l];
		const float *res_in = l > 0 ? g->L[(size_t)l - 1].res3 : g->encoded;
		/* the MLP: dres is d res3 */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, F, C, 1.0f, g->dres, g->dres16, C, P(p.fcprojw), P16(p.fcprojw), C, 0.0f, g->dfchg,
		     F);
		PROD(true, false, F, C, BT, 1.0f, a.fchg, a.fchg16, F, g->dres, g->dres16, C, 1.0f, G(p.fcprojw), C);
		cu_colsum_add(s, G(p.fcprojb), g->dres, BT, C, g->scratch);
		MARK(PROF_ELEMENTWISE);
		cu_gelu_bwd(s, g->dfch, g->dfch16, a.fch, g->dfchg, (long)BT * F);
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, C, F, 1.0f, g->dfch, g->dfch16, F, P(p.fcw), P16(p.fcw), F, 0.0f, g->dln, C);
		PROD(true, false, C, F, BT, 1.0f, a.ln2, a.ln2_16, C, g->dfch, g->dfch16, F, 1.0f, G(p.fcw), F);
		cu_colsum_add(s, G(p.fcb), g->dfch, BT, F, g->scratch);
		MARK(PROF_LAYERNORM);
		cu_layernorm_bwd(s, g->dres, g->dres16, G(p.ln2w), G(p.ln2b), g->dln, a.res2, P(p.ln2w), a.ln2_mean,
		                 a.ln2_rstd, BT, C, g->scratch);
		/* the attention: dres is d res2 */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, C, C, 1.0f, g->dres, g->dres16, C, P(p.projw), P16(p.projw), C, 0.0f, g->datty, C);
		PROD(true, false, C, C, BT, 1.0f, a.atty, a.atty16, C, g->dres, g->dres16, C, 1.0f, G(p.projw), C);
		cu_colsum_add(s, G(p.projb), g->dres, BT, C, g->scratch);
		MARK(PROF_ATTENTION_BWD);
		if (g->flash) {
			cu_flash_bwd(s, g->dqkv, g->datty, a.atty, (const __nv_bfloat16 *)a.qkvp, (const float *)a.att,
			             (float *)g->datt, (__nv_bfloat16 *)g->dyp, B, T, C, NH, true);
		} else {
			CUBLAS_TRY(cu_attention_bwd(&g->gx, g->dqkv, g->datty, a.qkvp, a.att, g->dyp, g->datt, g->dqkvp,
			                            B, T, C, NH, true),
			           "the attention's backward");
		}
		MARK(PROF_PRODUCTS);
		if (g->dqkv16)
			cu_to_bf16(s, g->dqkv16, g->dqkv, 3 * BTC);
		PROD(false, true, BT, C, 3 * C, 1.0f, g->dqkv, g->dqkv16, 3 * C, P(p.qkvw), P16(p.qkvw), 3 * C, 0.0f,
		     g->dln, C);
		PROD(true, false, C, 3 * C, BT, 1.0f, a.ln1, a.ln1_16, C, g->dqkv, g->dqkv16, 3 * C, 1.0f, G(p.qkvw),
		     3 * C);
		cu_colsum_add(s, G(p.qkvb), g->dqkv, BT, 3 * C, g->scratch);
		MARK(PROF_LAYERNORM);
		cu_layernorm_bwd(s, g->dres, g->dres16, G(p.ln1w), G(p.ln1b), g->dln, res_in, P(p.ln1w), a.ln1_mean,
		                 a.ln1_rstd, BT, C, g->scratch);
	}
	MARK(PROF_EMBEDDING);
	cu_embedding_bwd(s, G(g->wte), G(g->wpe), g->dres, g->uniq, g->offs, g->pos, g->n_uniq, B, T, C);
	CU_TRY(cudaEventRecord(g->ev[2], s), "recording an event");
	CU_SYNC(s, "the backward pass");
	float f = 0, b = 0;
	cudaEventElapsedTime(&f, g->ev[0], g->ev[1]);
	cudaEventElapsedTime(&b, g->ev[1], g->ev[2]);
	g->ms[0] = f;
	g->ms[1] = b;
	prof_collect(g, g->ev[2]);
	return KERN_GPU_OK;
}

extern "C" int cu_take_grads(kern_gpu_model *g, float *host, int add, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	size_t n = g->n_params;
	CU_TRY(cudaMemcpyAsync(add ? g->h_stage : host, g->grads, n * sizeof(float), cudaMemcpyDeviceToHost, g->s),
	       "copying the gradient from the GPU");
	CU_TRY(cudaMemsetAsync(g->grads, 0, n * sizeof(float), g->s), "zeroing the gradient");
	CU_SYNC(g->s, "copying the gradient from the GPU");
	if (add) {
		const float *st = g->h_stage;
#pragma omp parallel for schedule(static)
		for (size_t i = 0; i < n; i++)
			host[i] += st[i];
	}
	return KERN_GPU_OK;
}

extern "C" int cu_sketch_grads(kern_gpu_model *g, uint64_t seed, int k, double *host_out, char *err,
                               size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	if (!g->sk_scratch)
		CU_TRY(cudaMalloc(&g->sk_scratch, cu_sketch_scratch_len() * sizeof(double)),
		       "allocating the sketch's scratch");
	return cu_sketch(g->grads, g->n_params, seed, k, host_out, g->sk_scratch, g->s, err, errlen);
}

extern "C" int cu_get_params(kern_gpu_model *g, float *host, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	CU_TRY(cudaMemcpyAsync(host, g->params, g->n_params * sizeof(float), cudaMemcpyDeviceToHost, g->s),
	       "copying the parameters from the GPU");
	CU_SYNC(g->s, "copying the parameters from the GPU");
	return KERN_GPU_OK;
}

extern "C" int cu_add_grads(kern_gpu_model *g, const float *host, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	float *tmp = NULL, one = 1.0f;
	CU_TRY(cudaMalloc(&tmp, g->n_params * sizeof(float)), "allocating room for a gradient");
	cudaError_t e = cudaMemcpyAsync(tmp, host, g->n_params * sizeof(float), cudaMemcpyHostToDevice, g->s);
	/* y = 1 x + y: one rounding, the sum's */
	cublasStatus_t bs = e == cudaSuccess ? cublasSaxpy(g->blas, (int)g->n_params, &one, tmp, 1, g->grads, 1)
	                                     : CUBLAS_STATUS_SUCCESS;
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(g->s);
	cudaFree(tmp);
	CU_TRY(e, "adding a gradient on the GPU");
	CUBLAS_TRY(bs, "adding a gradient on the GPU");
	return KERN_GPU_OK;
}

extern "C" int cu_model_opt_moments(kern_gpu_model *g, float *host_m1, float *host_m2, int how, char *err,
                                    size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	if (!g->opt) {
		if (how != KERN_GPU_MOM_ZERO && how != KERN_GPU_MOM_UP)
			return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the inner moments are not set");
		int rc = cu_opt_create(g->views.data(), (int)g->views.size(), g->n_params, &g->opt, err, errlen);
		if (rc)
			return rc;
	}
	return cu_opt_moments(g->opt, host_m1, host_m2, how, g->s, err, errlen);
}

extern "C" int cu_model_opt_norm(kern_gpu_model *g, double divisor, double *host_part, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	if (!g->opt)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the inner moments are not set");
	return cu_opt_norm(g->opt, g->grads, divisor, host_part, g->s, err, errlen);
}

extern "C" int cu_model_opt_pass(kern_gpu_model *g, const kern_gpu_opt_pass *p, char *err, size_t errlen)
{
	CU_TRY(cudaSetDevice(g->device), "selecting the GPU");
	if (!g->opt)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend", "the inner moments are not set");
	return cu_opt_pass(g->opt, g->params, g->grads, p, g->s, err, errlen);
}

extern "C" int cu_host_register(void *p, size_t bytes, int on, char *err, size_t errlen)
{
	if (on)
		CU_TRY(cudaHostRegister(p, bytes, cudaHostRegisterDefault), "pinning host memory");
	else
		CU_TRY(cudaHostUnregister(p), "unpinning host memory");
	return KERN_GPU_OK;
}

extern "C" void cu_last_timings(kern_gpu_model *g, double ms[2])
{
	ms[0] = g->ms[0];
	ms[1] = g->ms[1];
}
