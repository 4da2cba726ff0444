/* cotrain CUDA backend: the encoders' forward and backward on one GPU.  See
 * cuda_encoder.h; the CPU's passes are kernels/encoder.c. */
#include "kernels/cuda/cuda_encoder.h"

#include "kernels/cuda/cuda_encoder_layers.h"
#include "kernels/cuda/cuda_flash.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

typedef __nv_bfloat16 bf16;

namespace
{

/* one block's saved activations; the *16 copies exist in bf16 mode only,
 * fchg in fp32 only outside it */
struct enc_layer {
	void *qkvp; /* q, k, v in the heads' layout (cu_att_elem bytes) */
	void *att;  /* the probabilities, or the fused path's logsumexp (fp32) */
	float *atty, *r1, *h1, *mean1, *rstd1, *fch, *fchg, *r2, *h2, *mean2, *rstd2;
	bf16 *atty16, *h1_16, *fchg16, *h2_16;
};

/* one parameter set's offsets (kernels/encoder.h's order) */
struct enc_set {
	size_t qkvw, qkvb, outw, outb, ln1w, ln1b, fcw, fcb, fcow, fcob, ln2w, ln2b;
	size_t dist; /* the distance embedding [2T-1, hd], with relative positions */
};

}   // namespace

struct cu_encoder {
	kern_config c;
	int max_batch, precision;
	bool albert, erf, flash;
	/* relative positions (kern_position): rel, key_query for relative_key_query,
	 * rs the term's scale (encoder.c's rel_scale) */
	bool rel, key_query;
	float rs;
	int Vp; /* the MLM logits' row stride: the vocabulary rounded up to 64 */
	cu_gemm_ctx gx;
	cudaStream_t s;
	cu_prof *pf; /* the model's stage profile (cuda_prof.h) */
	float *params, *grads;
	bf16 *params16;
	size_t n_params;
	size_t word, pos, type, elnw, elnb, projw, projb, poolw, poolb, sopw, sopb, mdw, mdb, mlnw, mlnb,
	        mbias;
	std::vector<enc_set> sets;
	void *mem;
	std::vector<enc_layer> L;
	int32_t *ids, *segs, *rows, *targets, *sop, *uniq, *offs, *pos_list, *amax;
	float *emb, *embln, *emb_mean, *emb_rstd, *x0, *qkv;
	bf16 *embln16, *x0_16;
	/* the heads */
	float *xg, *mpre, *mact, *mout, *mmean, *mrstd, *logits, *lse, *losses;
	float *cls, *pooled, *sopl, *sop_lse, *sop_losses;
	bf16 *xg16, *mout16, *word16, *dlogits16;
	/* the backward's */
	float *dx, *dy, *dqkv, *datty, *dfch, *dfchg, *dmout, *dmact, *dmpre, *dxg, *de1, *de2, *dcls,
	        *dpooled;
	float *colv, *scratch, *type_scratch, *yp, *dqkvp, *relq, *relk;
	void *drel;
	void *datt, *dyp;
	bf16 *dx16, *dy16, *dfch16, *dqkv16;
	bf16 *sa16, *sb16; /* operands rounded to bf16 for a product */
	size_t scap;
	/* host side */
	std::vector<int32_t> h_rows, h_targets, h_cnt, h_uniq, h_offs, h_pos, h_amax;
	std::vector<float> h_losses, h_sopl;
	int B, NR, n_uniq;
};

/* Lay out (or, with base NULL, count) the encoder's device memory. */
static size_t layout(cu_encoder *e, char *base)
{
	const kern_config *c = &e->c;
	size_t B = (size_t)e->max_batch, BT = B * c->seq_len, H = c->d_model, F = c->d_ff, E = c->d_embed,
	       NH = c->n_head, T = c->seq_len, Vp = (size_t)e->Vp, off = 0;
	bool bf = e->precision == KERN_PREC_BF16;
	size_t ae = cu_att_elem(e->precision);
	size_t att_bytes = e->flash ? B * NH * T * sizeof(float) : B * NH * T * T * ae;
#define TAKE(ptr, n, type) \
	do { \
		if (base) \
			(ptr) = (type *)(base + off); \
		off += ((n) * sizeof(type) + 255) & ~(size_t)255; \
	} while (0)
#define TAKEF(ptr, n) TAKE(ptr, n, float)
#define TAKE16(ptr, n) \
	do { \
		if (bf) \
			TAKE(ptr, n, bf16); \
	} while (0)
	TAKE(e->ids, BT, int32_t);
	TAKE(e->segs, BT, int32_t);
	TAKE(e->rows, BT, int32_t);
	TAKE(e->targets, BT, int32_t);
	TAKE(e->sop, B, int32_t);
	TAKE(e->uniq, BT, int32_t);
	TAKE(e->offs, BT + 1, int32_t);
	TAKE(e->pos_list, BT, int32_t);
	TAKE(e->amax, BT, int32_t);
	TAKEF(e->emb, BT * E);
	TAKEF(e->embln, BT * E);
	TAKE16(e->embln16, BT * E);
	TAKEF(e->emb_mean, BT);
	TAKEF(e->emb_rstd, BT);
	if (e->albert) {
		TAKEF(e->x0, BT * H);
		TAKE16(e->x0_16, BT * H);
	}
	TAKEF(e->qkv, BT * 3 * H);
	for (auto &l : e->L) {
		TAKE(l.qkvp, 3 * BT * H * ae, char);
		TAKE(l.att, att_bytes, char);
		TAKEF(l.atty, BT * H);
		TAKE16(l.atty16, BT * H);
		TAKEF(l.r1, BT * H);
		TAKEF(l.h1, BT * H);
		TAKE16(l.h1_16, BT * H);
		TAKEF(l.mean1, BT);
		TAKEF(l.rstd1, BT);
		TAKEF(l.fch, BT * F);
		if (bf)
			TAKE(l.fchg16, BT * F, bf16);
		else
			TAKEF(l.fchg, BT * F);
		TAKEF(l.r2, BT * H);
		TAKEF(l.h2, BT * H);
		TAKE16(l.h2_16, BT * H);
		TAKEF(l.mean2, BT);
		TAKEF(l.rstd2, BT);
	}
	TAKEF(e->xg, BT * H);
	TAKE16(e->xg16, BT * H);
	TAKEF(e->mpre, BT * E);
	TAKEF(e->mact, BT * E);
	TAKEF(e->mout, BT * E);
	TAKE16(e->mout16, BT * E);
	TAKEF(e->mmean, BT);
	TAKEF(e->mrstd, BT);
	TAKEF(e->logits, BT * Vp);
	TAKE16(e->dlogits16, BT * Vp);
	TAKE16(e->word16, Vp * E);
	TAKEF(e->lse, BT);
	TAKEF(e->losses, BT);
	TAKEF(e->cls, B * H);
	TAKEF(e->pooled, B * H);
	TAKEF(e->sopl, B * 2);
	TAKEF(e->sop_lse, B);
	TAKEF(e->sop_losses, B);
	TAKEF(e->dx, BT * H);
	TAKEF(e->dy, BT * H);
	TAKEF(e->dqkv, BT * 3 * H);
	TAKEF(e->datty, BT * H);
	TAKEF(e->dfch, BT * F);
	TAKEF(e->dfchg, BT * F);
	/* bf16 mode: the gradients two products each read, written once in
	 * bf16 by the kernel that makes them */
	TAKE16(e->dx16, BT * H);
	TAKE16(e->dy16, BT * H);
	TAKE16(e->dfch16, BT * F);
	TAKE16(e->dqkv16, BT * 3 * H);
	TAKEF(e->dmout, BT * E);
	TAKEF(e->dmact, BT * E);
	TAKEF(e->dmpre, BT * E);
	TAKEF(e->dxg, BT * H);
	TAKEF(e->de1, BT * E);
	TAKEF(e->de2, BT * E);
	TAKEF(e->dcls, B * H);
	TAKEF(e->dpooled, B * H);
	TAKEF(e->colv, Vp);
	size_t wide = 3 * H > F ? 3 * H : F; /* the widest activation or gradient */
	TAKEF(e->scratch, cu_colsum_scratch((int)BT, (int)(wide > Vp ? wide : Vp)));
	TAKEF(e->type_scratch, cu_embedding_type_scratch((int)BT, (int)E, c->type_vocab));
	/* the attention's scratch: fused, D [B*NH*T] in datt and dO in dyp
	 * (bf16); materialised, [B,NH,T,T] and [B,T,H] of its element */
	TAKE(e->datt, att_bytes, char);
	TAKE(e->dyp, BT * H * (e->flash ? sizeof(bf16) : ae), char);
	if (!e->flash) {
		TAKEF(e->yp, BT * H);
		TAKEF(e->dqkvp, 3 * BT * H);
	}
	if (e->rel) { /* the distance terms of every (sample, head, query) */
		size_t nrel = B * NH * T * (2 * T - 1);
		TAKEF(e->relq, nrel);
		if (e->key_query)
			TAKEF(e->relk, nrel);
		TAKE(e->drel, nrel * ae, char);
	}
	/* the operands a bf16 product rounds: the widest activation or
	 * gradient, [BT, max(3H, F)] */
	e->scap = BT * wide;
	TAKE16(e->sa16, e->scap);
	TAKE16(e->sb16, e->scap);
#undef TAKE16
#undef TAKEF
#undef TAKE
	return off;
}

int cu_enc_create(const kern_config *c, const kern_view *views, int n_views, int max_batch,
                  const cu_gemm_ctx *gx, float *params, float *grads, bf16 *params16, size_t n_params,
                  cu_prof *pf, cu_encoder **out, char *err, size_t errlen)
{
	*out = NULL;
	cu_encoder *e = new (std::nothrow) cu_encoder();
	if (!e)
		return cu_fail(err, errlen, KERN_GPU_ENOMEM, "CUDA backend", "out of host memory");
	e->c = *c;
	e->max_batch = max_batch;
	e->precision = gx->precision;
	e->albert = c->arch == KERN_ARCH_ALBERT;
	e->erf = c->arch == KERN_ARCH_BERT;
	e->rel = c->position != KERN_POS_ABSOLUTE;
	e->key_query = c->position == KERN_POS_RELATIVE_KEY_QUERY;
	e->rs = e->albert ? 1.0f : 1.0f / sqrtf((float)(c->d_model / c->n_head));
	e->flash = !e->rel && cu_flash_fits(e->precision, c->seq_len, c->d_model, c->n_head);
	const char *ae = getenv("COTRAIN_CUDA_ATTENTION");
	if (ae && strcmp(ae, "materialized") == 0)
		e->flash = false;
	e->Vp = (c->vocab + 63) / 64 * 64;
	e->gx = *gx;
	e->s = gx->s;
	e->params = params;
	e->grads = grads;
	e->params16 = params16;
	e->n_params = n_params;
	e->pf = pf;
	size_t H = c->d_model, F = c->d_ff, E = c->d_embed, V = c->vocab, T = c->seq_len;
	bool ok = cu_find_view(views, n_views, "emb.word", V * E, &e->word) &&
	          cu_find_view(views, n_views, "emb.position", T * E, &e->pos) &&
	          cu_find_view(views, n_views, "emb.token_type", (size_t)c->type_vocab * E, &e->type) &&
	          cu_find_view(views, n_views, "emb.ln.weight", E, &e->elnw) &&
	          cu_find_view(views, n_views, "emb.ln.bias", E, &e->elnb) &&
	          (!e->albert || (cu_find_view(views, n_views, "emb.proj.weight", E * H, &e->projw) &&
	                          cu_find_view(views, n_views, "emb.proj.bias", H, &e->projb))) &&
	          cu_find_view(views, n_views, "pooler.weight", H * H, &e->poolw) &&
	          cu_find_view(views, n_views, "pooler.bias", H, &e->poolb) &&
	          cu_find_view(views, n_views, "sop.weight", H * 2, &e->sopw) &&
	          cu_find_view(views, n_views, "sop.bias", 2, &e->sopb) &&
	          cu_find_view(views, n_views, "mlm.dense.weight", H * E, &e->mdw) &&
	          cu_find_view(views, n_views, "mlm.dense.bias", E, &e->mdb) &&
	          cu_find_view(views, n_views, "mlm.ln.weight", E, &e->mlnw) &&
	          cu_find_view(views, n_views, "mlm.ln.bias", E, &e->mlnb) &&
	          cu_find_view(views, n_views, "mlm.bias", V, &e->mbias);
	for (int s = 0; ok && s < c->n_shared; s++) {
		enc_set o;
		char nm[64];
#define V(field, suffix, numel) \
	(snprintf(nm, sizeof nm, "layer.%d.%s", s, suffix), cu_find_view(views, n_views, nm, numel, &o.field))
		ok = V(qkvw, "attn.qkv.weight", H * 3 * H) && V(qkvb, "attn.qkv.bias", 3 * H) &&
		     V(outw, "attn.out.weight", H * H) && V(outb, "attn.out.bias", H) &&
		     V(ln1w, "attn.ln.weight", H) && V(ln1b, "attn.ln.bias", H) &&
		     V(fcw, "ffn.weight", H * F) && V(fcb, "ffn.bias", F) &&
		     V(fcow, "ffn_out.weight", F * H) && V(fcob, "ffn_out.bias", H) &&
		     V(ln2w, "ln.weight", H) && V(ln2b, "ln.bias", H) &&
		     (!e->rel || V(dist, "attn.distance.weight", (2 * T - 1) * (H / c->n_head)));
#undef V
		e->sets.push_back(o);
	}
	if (!ok) {
		delete e;
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA backend",
		               "the parameter views are not an encoder's");
	}
	e->L.resize((size_t)c->n_layer);
	size_t BT = (size_t)max_batch * T;
	e->h_rows.resize(BT);
	e->h_targets.resize(BT);
	e->h_cnt.assign(V, 0);
	e->h_uniq.resize(BT);
	e->h_offs.resize(BT + 1);
	e->h_pos.resize(BT);
	e->h_amax.resize(BT);
	e->h_losses.resize(BT);
	e->h_sopl.resize((size_t)2 * max_batch + max_batch);
	cudaError_t ce = cudaMalloc(&e->mem, layout(e, NULL));
	if (ce != cudaSuccess) {
		delete e;
		return cu_fail(err, errlen, cu_code(ce), "allocating the encoder's device memory",
		               cudaGetErrorString(ce));
	}
	layout(e, (char *)e->mem);
	if (e->word16) /* its padding rows stay zero */
		cudaMemsetAsync(e->word16, 0, (size_t)e->Vp * E * sizeof(bf16), e->s);
	ce = cudaStreamSynchronize(e->s);
	if (ce != cudaSuccess) {
		cu_enc_free(e);
		return cu_fail(err, errlen, cu_code(ce), "creating the encoder", cudaGetErrorString(ce));
	}
	*out = e;
	return KERN_GPU_OK;
}

void cu_enc_free(cu_encoder *e)
{
	if (!e)
		return;
	cudaFree(e->mem);
	delete e;
}

/* C = op(A) op(B) + beta C in the model's precision (cu_gemm's row-major
 * convention): in bf16 mode from the operands' bf16 copies where given,
 * else rounded into scratch first; A is rows x lda (ta: K x lda). */
static cublasStatus_t prod(cu_encoder *e, bool ta, bool tb, int M, int N, int K, const float *A,
                           const bf16 *A16, int lda, const float *Bm, const bf16 *B16, int ldb, float beta,
                           float *C, int ldc)
{
	if (e->precision != KERN_PREC_BF16)
		return cu_gemm(&e->gx, ta, tb, M, N, K, 1.0f, A, lda, 0, Bm, ldb, 0, beta, C, ldc, 0, 1);
	if (!A16) {
		long n = (long)(ta ? K : M) * lda;
		if ((size_t)n > e->scap)
			return CUBLAS_STATUS_INVALID_VALUE;
		cu_to_bf16(e->s, e->sa16, A, n);
		A16 = e->sa16;
	}
	if (!B16) {
		long n = (long)(tb ? N : K) * ldb;
		if ((size_t)n > e->scap)
			return CUBLAS_STATUS_INVALID_VALUE;
		cu_to_bf16(e->s, e->sb16, Bm, n);
		B16 = e->sb16;
	}
	return cu_gemm_bf16(&e->gx, ta, tb, M, N, K, 1.0f, A16, lda, B16, ldb, beta, C, ldc);
}

#define P(off) (e->params + (off))
#define G(off) (e->grads + (off))
#define P16(off) (e->params16 ? e->params16 + (off) : NULL)
#define PROD(...) CUBLAS_TRY(prod(e, __VA_ARGS__), "a matrix product")
/* the work from here to the next mark is of kind k (profiling only) */
#define MARK(k) cu_prof_mark(e->pf, (k), e->s)

/* Each of x[0..n) in lo..hi (or KERN_ENC_IGNORE where ignore_ok). */
static bool in_range(const int32_t *x, size_t n, int lo, int hi, bool ignore_ok)
{
	for (size_t i = 0; i < n; i++)
		if ((x[i] < lo || x[i] > hi) && !(ignore_ok && x[i] == KERN_ENC_IGNORE))
			return false;
	return true;
}

int cu_enc_forward(cu_encoder *e, const int32_t *ids, const int32_t *segs, const int32_t *labels,
                   const int32_t *sop, int B, double *res, char *err, size_t errlen)
{
	const kern_config *c = &e->c;
	for (int i = 0; i < KERN_GPU_ENC_RESULTS; i++)
		res[i] = 0;
	if (B < 1 || B > e->max_batch)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA encoder forward",
		               "batch size outside 1..max_batch");
	int T = c->seq_len, H = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab, E = c->d_embed,
	    BT = B * T, Vp = e->Vp;
	if (!ids || !segs || !labels || !sop || !in_range(ids, BT, 0, V - 1, false) ||
	    !in_range(segs, BT, 0, c->type_vocab - 1, false) || !in_range(labels, BT, 0, V - 1, true) ||
	    !in_range(sop, B, 0, 1, false))
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA encoder forward",
		               "a token, segment, label or sentence-order label out of range");
	e->B = 0;
	int NR = 0;
	for (int i = 0; i < BT; i++)
		if (labels[i] != KERN_ENC_IGNORE) {
			e->h_rows[NR] = i;
			e->h_targets[NR++] = labels[i];
		}
	e->n_uniq = cu_token_lists(ids, BT, e->h_cnt.data(), e->h_uniq.data(), e->h_offs.data(), e->h_pos.data());
	cudaStream_t s = e->s;
#define UP(dst, src, n, what) \
	CU_TRY(cudaMemcpyAsync(dst, src, (size_t)(n) * sizeof(int32_t), cudaMemcpyHostToDevice, s), what)
	MARK(PROF_EMBEDDING);
	UP(e->ids, ids, BT, "copying the token ids");
	UP(e->segs, segs, BT, "copying the segment ids");
	UP(e->sop, sop, B, "copying the sentence-order labels");
	if (NR > 0) {
		UP(e->rows, e->h_rows.data(), NR, "copying the predicted positions");
		UP(e->targets, e->h_targets.data(), NR, "copying the labels");
	}
	UP(e->uniq, e->h_uniq.data(), e->n_uniq, "copying the token lists");
	UP(e->offs, e->h_offs.data(), e->n_uniq + 1, "copying the token lists");
	UP(e->pos_list, e->h_pos.data(), BT, "copying the token lists");
#undef UP
	bool bf = e->params16 != NULL;
	if (bf)
		MARK(PROF_ELEMENTWISE);
		cu_to_bf16(s, e->params16, e->params, (long)e->n_params);

	/* the embeddings, their LayerNorm, ALBERT's projection E -> H */
	MARK(PROF_EMBEDDING);
	cu_embedding_seg_fwd(s, e->emb, e->ids, e->segs, P(e->word), e->rel ? NULL : P(e->pos), P(e->type), B, T,
	                     E);
	MARK(PROF_LAYERNORM);
	cu_layernorm_fwd(s, e->embln, e->embln16, e->emb_mean, e->emb_rstd, e->emb, P(e->elnw), P(e->elnb),
	                 BT, E, KERN_ENC_LN_EPS);
	const float *x = e->embln;
	const bf16 *x16 = e->embln16;
	if (e->albert) {
		MARK(PROF_ELEMENTWISE);
		cu_rows_bias(s, e->x0, NULL, P(e->projb), BT, H);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, H, E, e->embln, e->embln16, E, P(e->projw), P16(e->projw), H, 1.0f,
		     e->x0, H);
		if (bf)
			MARK(PROF_ELEMENTWISE);
			cu_to_bf16(s, e->x0_16, e->x0, (long)BT * H);
		x = e->x0;
		x16 = e->x0_16;
	}
	/* the blocks (post-LN) */
	for (int l = 0; l < c->n_layer; l++) {
		const enc_set &p = e->sets[(size_t)((long)l * c->n_shared / c->n_layer)];
		enc_layer &a = e->L[(size_t)l];
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, 3 * H, H, x, x16, H, P(p.qkvw), P16(p.qkvw), 3 * H, 0.0f, e->qkv,
		     3 * H);
		if (e->flash) {
			MARK(PROF_SPLIT);
			cu_qkv_split16(s, (bf16 *)a.qkvp, e->qkv, P(p.qkvb), B, T, H, NH);
			MARK(PROF_ATTENTION);
			cu_flash_fwd(s, a.atty, a.atty16, (float *)a.att, (const bf16 *)a.qkvp, B, T, H, NH,
			             false);
		} else {
			MARK(PROF_ATTENTION);
			if (e->rel)
				CUBLAS_TRY(cu_attention_rel_fwd(&e->gx, a.atty, a.att, a.qkvp, e->yp, e->qkv, P(p.qkvb),
				                                P(p.dist), P16(p.dist), e->relq, e->relk, B, T, H, NH,
				                                e->rs),
				           "the attention");
			else
				CUBLAS_TRY(cu_attention_fwd(&e->gx, a.atty, a.att, a.qkvp, e->yp, e->qkv, P(p.qkvb),
				                            B, T, H, NH, false),
				           "the attention");
			if (bf)
				MARK(PROF_ELEMENTWISE);
				cu_to_bf16(s, a.atty16, a.atty, (long)BT * H);
		}
		MARK(PROF_ELEMENTWISE);
		cu_rows_bias(s, a.r1, x, P(p.outb), BT, H);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, H, H, a.atty, a.atty16, H, P(p.outw), P16(p.outw), H, 1.0f, a.r1, H);
		MARK(PROF_LAYERNORM);
		cu_layernorm_fwd(s, a.h1, a.h1_16, a.mean1, a.rstd1, a.r1, P(p.ln1w), P(p.ln1b), BT, H,
		                 KERN_ENC_LN_EPS);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, F, H, a.h1, a.h1_16, H, P(p.fcw), P16(p.fcw), F, 0.0f, a.fch, F);
		MARK(PROF_ELEMENTWISE);
		if (e->erf)
			cu_bias_gelu_erf_fwd(s, a.fchg, a.fchg16, a.fch, P(p.fcb), BT, F);
		else
			cu_bias_gelu_fwd(s, a.fchg, a.fchg16, a.fch, P(p.fcb), BT, F);
		cu_rows_bias(s, a.r2, a.h1, P(p.fcob), BT, H);
		MARK(PROF_PRODUCTS);
		PROD(false, false, BT, H, F, a.fchg, a.fchg16, F, P(p.fcow), P16(p.fcow), H, 1.0f, a.r2, H);
		MARK(PROF_LAYERNORM);
		cu_layernorm_fwd(s, a.h2, a.h2_16, a.mean2, a.rstd2, a.r2, P(p.ln2w), P(p.ln2b), BT, H,
		                 KERN_ENC_LN_EPS);
		x = a.h2;
		x16 = a.h2_16;
	}
	/* the MLM head on the predicted rows: dense, GELU, LayerNorm, the
	 * word embedding (tied) plus the bias */
	if (NR > 0) {
		MARK(PROF_ELEMENTWISE);
		cu_gather_rows(s, e->xg, e->xg16, x, e->rows, NR, H);
		MARK(PROF_PRODUCTS);
		PROD(false, false, NR, E, H, e->xg, e->xg16, H, P(e->mdw), P16(e->mdw), E, 0.0f, e->mpre, E);
		MARK(PROF_ELEMENTWISE);
		if (e->erf)
			cu_bias_gelu_erf_fwd(s, e->mact, NULL, e->mpre, P(e->mdb), NR, E);
		else
			cu_bias_gelu_fwd(s, e->mact, NULL, e->mpre, P(e->mdb), NR, E);
		MARK(PROF_LAYERNORM);
		cu_layernorm_fwd(s, e->mout, e->mout16, e->mmean, e->mrstd, e->mact, P(e->mlnw), P(e->mlnb),
		                 NR, E, KERN_ENC_LN_EPS);
		MARK(PROF_HEAD);
		cu_rows_bias_ld(s, e->logits, P(e->mbias), NR, V, Vp);
		if (bf) {
			CU_TRY(cudaMemcpyAsync(e->word16, e->params16 + e->word, (size_t)V * E * sizeof(bf16),
			                       cudaMemcpyDeviceToDevice, s),
			       "copying the word embedding for the head");
			CUBLAS_TRY(cu_gemm_bf16(&e->gx, false, true, NR, Vp, E, 1.0f, e->mout16, E, e->word16,
			                        E, 1.0f, e->logits, Vp),
			           "a matrix product");
		} else {
			CUBLAS_TRY(cu_gemm(&e->gx, false, true, NR, V, E, 1.0f, e->mout, E, 0, P(e->word), E,
			                   0, 1.0f, e->logits, Vp, 0, 1),
			           "a matrix product");
		}
		MARK(PROF_CE);
		cu_crossentropy_fwd(s, e->losses, e->lse, e->logits, e->targets, NR, V, Vp);
		cu_argmax_rows(s, e->amax, e->logits, NR, V, Vp);
	}
	/* the SOP head on the [CLS] rows: pooler (tanh), then two logits */
	MARK(PROF_CE);
	cu_first_rows(s, e->cls, x, B, T, H);
	cu_rows_bias(s, e->pooled, NULL, P(e->poolb), B, H);
	PROD(false, false, B, H, H, e->cls, NULL, H, P(e->poolw), P16(e->poolw), H, 1.0f, e->pooled, H);
	cu_tanh(s, e->pooled, (long)B * H);
	cu_rows_bias(s, e->sopl, NULL, P(e->sopb), B, 2);
	PROD(false, false, B, 2, H, e->pooled, NULL, H, P(e->sopw), P16(e->sopw), 2, 1.0f, e->sopl, 2);
	cu_crossentropy_fwd(s, e->sop_losses, e->sop_lse, e->sopl, e->sop, B, 2, 2);
	/* the losses and counts to the host */
	MARK(PROF_EMBEDDING);
	float *hl = e->h_losses.data(), *hs = e->h_sopl.data();
	if (NR > 0) {
		CU_TRY(cudaMemcpyAsync(hl, e->losses, NR * sizeof(float), cudaMemcpyDeviceToHost, s),
		       "copying the losses");
		CU_TRY(cudaMemcpyAsync(e->h_amax.data(), e->amax, NR * sizeof(int32_t),
		                       cudaMemcpyDeviceToHost, s),
		       "copying the predictions");
	}
	CU_TRY(cudaMemcpyAsync(hs, e->sopl, 2 * B * sizeof(float), cudaMemcpyDeviceToHost, s),
	       "copying the losses");
	CU_TRY(cudaMemcpyAsync(hs + 2 * B, e->sop_losses, B * sizeof(float), cudaMemcpyDeviceToHost, s),
	       "copying the losses");
	CU_SYNC(s, "the encoder's forward pass");
	double mlm = 0, sopl = 0;
	int mc = 0, sc = 0;
	for (int i = 0; i < NR; i++) {
		mlm += hl[i];
		mc += e->h_amax[(size_t)i] == e->h_targets[(size_t)i];
	}
	for (int b = 0; b < B; b++) {
		sopl += hs[2 * B + b];
		sc += (hs[2 * b + 1] > hs[2 * b] ? 1 : 0) == sop[b];
	}
	res[1] = NR > 0 ? mlm / NR : 0;
	res[2] = sopl / B;
	res[0] = res[1] + res[2];
	res[3] = NR;
	res[4] = mc;
	res[5] = sc;
	e->NR = NR;
	e->B = B;
	return KERN_GPU_OK;
}

int cu_enc_backward(cu_encoder *e, float scale, char *err, size_t errlen)
{
	const kern_config *c = &e->c;
	if (e->B == 0)
		return cu_fail(err, errlen, KERN_GPU_EINVAL, "CUDA encoder backward",
		               "no forward pass with labels preceded it");
	int B = e->B, T = c->seq_len, H = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab,
	    E = c->d_embed, BT = B * T, NR = e->NR, Vp = e->Vp, L = c->n_layer;
	cudaStream_t s = e->s;
	bool bf = e->params16 != NULL;
	e->B = 0; /* the logits become their gradient */
	MARK(PROF_CE);
	CU_TRY(cudaMemsetAsync(e->dx, 0, (size_t)BT * H * sizeof(float), s), "zeroing a gradient");
	/* the MLM head: dx's predicted rows */
	if (NR > 0) {
		cu_crossentropy_bwd(s, e->logits, e->lse, e->targets, NR, V, Vp, scale / (float)NR);
		CU_TRY(cudaMemsetAsync(e->colv, 0, (size_t)Vp * sizeof(float), s), "zeroing a gradient");
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, e->colv, e->logits, NR, Vp, e->scratch);
		cu_rows_bias(s, G(e->mbias), G(e->mbias), e->colv, 1, V);
		if (bf) {
			MARK(PROF_ELEMENTWISE);
			cu_to_bf16(s, e->dlogits16, e->logits, (long)NR * Vp);
			MARK(PROF_HEAD_DX);
			CUBLAS_TRY(cu_gemm_bf16(&e->gx, false, false, NR, E, Vp, 1.0f, e->dlogits16, Vp,
			                        e->word16, E, 0.0f, e->dmout, E),
			           "a matrix product");
			MARK(PROF_HEAD_DW);
			CUBLAS_TRY(cu_gemm_bf16(&e->gx, true, false, V, E, NR, 1.0f, e->dlogits16, Vp,
			                        e->mout16, E, 1.0f, G(e->word), E),
			           "a matrix product");
		} else {
			MARK(PROF_HEAD_DX);
			CUBLAS_TRY(cu_gemm(&e->gx, false, false, NR, E, V, 1.0f, e->logits, Vp, 0, P(e->word),
			                   E, 0, 0.0f, e->dmout, E, 0, 1),
			           "a matrix product");
			MARK(PROF_HEAD_DW);
			CUBLAS_TRY(cu_gemm(&e->gx, true, false, V, E, NR, 1.0f, e->logits, Vp, 0, e->mout, E,
			                   0, 1.0f, G(e->word), E, 0, 1),
			           "a matrix product");
		}
		MARK(PROF_LAYERNORM);
		CU_TRY(cudaMemsetAsync(e->dmact, 0, (size_t)NR * E * sizeof(float), s), "zeroing a gradient");
		cu_layernorm_bwd(s, e->dmact, NULL, G(e->mlnw), G(e->mlnb), e->dmout, e->mact, P(e->mlnw),
		                 e->mmean, e->mrstd, NR, E, e->scratch);
		MARK(PROF_ELEMENTWISE);
		if (e->erf)
			cu_gelu_erf_bwd(s, e->dmpre, NULL, e->mpre, e->dmact, (long)NR * E);
		else
			cu_gelu_bwd(s, e->dmpre, NULL, e->mpre, e->dmact, (long)NR * E);
		MARK(PROF_PRODUCTS);
		PROD(false, true, NR, H, E, e->dmpre, NULL, E, P(e->mdw), P16(e->mdw), E, 0.0f, e->dxg, H);
		PROD(true, false, H, E, NR, e->xg, e->xg16, H, e->dmpre, NULL, E, 1.0f, G(e->mdw), E);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(e->mdb), e->dmpre, NR, E, e->scratch);
		cu_scatter_rows(s, e->dx, e->dxg, e->rows, NR, H);
	}
	/* the SOP head: dx's [CLS] rows */
	MARK(PROF_CE);
	cu_crossentropy_bwd(s, e->sopl, e->sop_lse, e->sop, B, 2, 2, scale / (float)B);
	PROD(false, true, B, H, 2, e->sopl, NULL, 2, P(e->sopw), P16(e->sopw), 2, 0.0f, e->dpooled, H);
	PROD(true, false, H, 2, B, e->pooled, NULL, H, e->sopl, NULL, 2, 1.0f, G(e->sopw), 2);
	cu_colsum_add(s, G(e->sopb), e->sopl, B, 2, e->scratch);
	cu_tanh_bwd(s, e->dpooled, e->pooled, (long)B * H);
	PROD(false, true, B, H, H, e->dpooled, NULL, H, P(e->poolw), P16(e->poolw), H, 0.0f, e->dcls, H);
	PROD(true, false, H, H, B, e->cls, NULL, H, e->dpooled, NULL, H, 1.0f, G(e->poolw), H);
	cu_colsum_add(s, G(e->poolb), e->dpooled, B, H, e->scratch);
	cu_first_rows_add(s, e->dx, e->dcls, B, T, H);

	/* the blocks, last first: dx holds d(block output) */
	size_t bth = (size_t)BT * H * sizeof(float);
	for (int l = L - 1; l >= 0; l--) {
		const enc_set &p = e->sets[(size_t)((long)l * c->n_shared / c->n_layer)];
		enc_layer &a = e->L[(size_t)l];
		const float *x_in = l > 0 ? e->L[(size_t)l - 1].h2 : e->albert ? e->x0 : e->embln;
		const bf16 *x_in16 = l > 0 ? e->L[(size_t)l - 1].h2_16 : e->albert ? e->x0_16 : e->embln16;
		/* dy = d r2 through the block's last LayerNorm */
		MARK(PROF_LAYERNORM);
		CU_TRY(cudaMemsetAsync(e->dy, 0, bth, s), "zeroing a gradient");
		cu_layernorm_bwd(s, e->dy, e->dy16, G(p.ln2w), G(p.ln2b), e->dx, a.r2, P(p.ln2w), a.mean2,
		                 a.rstd2, BT, H, e->scratch);
		/* the FFN; dy += d h1 through it (the residual carries dy itself) */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, F, H, e->dy, e->dy16, H, P(p.fcow), P16(p.fcow), H, 0.0f, e->dfchg, F);
		PROD(true, false, F, H, BT, a.fchg, a.fchg16, F, e->dy, e->dy16, H, 1.0f, G(p.fcow), H);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(p.fcob), e->dy, BT, H, e->scratch);
		if (e->erf)
			cu_gelu_erf_bwd(s, e->dfch, e->dfch16, a.fch, e->dfchg, (long)BT * F);
		else
			cu_gelu_bwd(s, e->dfch, e->dfch16, a.fch, e->dfchg, (long)BT * F);
		/* (dy16 is spent: dy now takes the FFN's share) */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, H, F, e->dfch, e->dfch16, F, P(p.fcw), P16(p.fcw), F, 1.0f, e->dy, H);
		PROD(true, false, H, F, BT, a.h1, a.h1_16, H, e->dfch, e->dfch16, F, 1.0f, G(p.fcw), F);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(p.fcb), e->dfch, BT, F, e->scratch);
		/* dx = d r1 through the attention's LayerNorm */
		MARK(PROF_LAYERNORM);
		CU_TRY(cudaMemsetAsync(e->dx, 0, bth, s), "zeroing a gradient");
		cu_layernorm_bwd(s, e->dx, e->dx16, G(p.ln1w), G(p.ln1b), e->dy, a.r1, P(p.ln1w), a.mean1,
		                 a.rstd1, BT, H, e->scratch);
		/* the attention; dx += d x_in through it */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, H, H, e->dx, e->dx16, H, P(p.outw), P16(p.outw), H, 0.0f, e->datty, H);
		PROD(true, false, H, H, BT, a.atty, a.atty16, H, e->dx, e->dx16, H, 1.0f, G(p.outw), H);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(p.outb), e->dx, BT, H, e->scratch);
		MARK(PROF_ATTENTION_BWD);
		if (e->flash)
			cu_flash_bwd(s, e->dqkv, e->datty, a.atty, (const bf16 *)a.qkvp, (const float *)a.att,
			             (float *)e->datt, (bf16 *)e->dyp, B, T, H, NH, false);
		else if (e->rel)
			CUBLAS_TRY(cu_attention_rel_bwd(&e->gx, e->dqkv, G(p.dist), e->datty, a.qkvp, a.att, e->dyp,
			                                e->datt, e->dqkvp, P(p.dist), P16(p.dist), e->drel, B, T, H,
			                                NH, e->rs, e->key_query),
			           "the attention's backward");
		else
			CUBLAS_TRY(cu_attention_bwd(&e->gx, e->dqkv, e->datty, a.qkvp, a.att, e->dyp, e->datt,
			                            e->dqkvp, B, T, H, NH, false),
			           "the attention's backward");
		if (bf)
			MARK(PROF_ELEMENTWISE);
			cu_to_bf16(s, e->dqkv16, e->dqkv, 3L * BT * H);
		/* (dx16 is spent: dx now takes the attention's share) */
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, H, 3 * H, e->dqkv, e->dqkv16, 3 * H, P(p.qkvw), P16(p.qkvw), 3 * H, 1.0f,
		     e->dx, H);
		PROD(true, false, H, 3 * H, BT, x_in, x_in16, H, e->dqkv, e->dqkv16, 3 * H, 1.0f, G(p.qkvw),
		     3 * H);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(p.qkvb), e->dqkv, BT, 3 * H, e->scratch);
	}

	/* the embeddings: dx is d x0 */
	const float *demb = e->dx;
	if (e->albert) {
		MARK(PROF_PRODUCTS);
		PROD(false, true, BT, E, H, e->dx, NULL, H, P(e->projw), P16(e->projw), H, 0.0f, e->de1, E);
		PROD(true, false, E, H, BT, e->embln, e->embln16, E, e->dx, NULL, H, 1.0f, G(e->projw), H);
		MARK(PROF_ELEMENTWISE);
		cu_colsum_add(s, G(e->projb), e->dx, BT, H, e->scratch);
		demb = e->de1;
	}
	MARK(PROF_LAYERNORM);
	CU_TRY(cudaMemsetAsync(e->de2, 0, (size_t)BT * E * sizeof(float), s), "zeroing a gradient");
	cu_layernorm_bwd(s, e->de2, NULL, G(e->elnw), G(e->elnb), demb, e->emb, P(e->elnw), e->emb_mean,
	                 e->emb_rstd, BT, E, e->scratch);
	MARK(PROF_EMBEDDING);
	cu_embedding_bwd(s, G(e->word), e->rel ? NULL : G(e->pos), e->de2, e->uniq, e->offs, e->pos_list, e->n_uniq, B, T, E);
	cu_embedding_type_bwd(s, G(e->type), e->de2, e->segs, BT, E, c->type_vocab, e->type_scratch);
	CU_SYNC(s, "the encoder's backward pass");
	return KERN_GPU_OK;
}
