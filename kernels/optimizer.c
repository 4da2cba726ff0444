/* cotrain kernels: optimizers.  See optimizer.h for the rules and why every
 * sum here runs over fixed blocks. */
#include "kernels/optimizer.h"

#include "kernels/backend.h"
#include "kernels/gpu.h"
#include "kernels/vecmath.h"

#include <math.h>
#include <stdlib.h>

_Static_assert(KERN_OPT_BLOCK == KERN_GPU_OPT_BLOCK, "the GPU's step cuts the parameters as the CPU's does");

void kern_opt_default(kern_opt_config *o, kern_opt_kind kind)
{
	o->kind = kind;
	if (kind == KERN_OPT_LAMB) {
		o->lr = 1e-3f;
		o->beta1 = 0.9f;
		o->beta2 = 0.999f;
		o->eps = 1e-6f;
		o->weight_decay = 0.01f;
	} else {
		o->lr = 3e-4f;
		o->beta1 = 0.9f;
		o->beta2 = 0.95f;
		o->eps = 1e-8f;
		o->weight_decay = 0.1f;
	}
	o->clip_norm = 1.0f;
	o->warmup_steps = 0;
	o->total_steps = 0;
	o->decay = KERN_DECAY_NONE;
	o->min_lr_ratio = 0.1f;
}

cot_err kern_opt_validate(const kern_opt_config *o, cot_errbuf *eb)
{
	if (o->kind != KERN_OPT_ADAMW && o->kind != KERN_OPT_LAMB)
		return cot_seterr(eb, COT_ERR_INVALID, "unknown optimizer %d", (int)o->kind);
#define CHECK(cond, field) \
	if (!(cond)) \
		return cot_seterr(eb, COT_ERR_INVALID, "optimizer setting " #field " is out of range");
	CHECK(isfinite(o->lr) && o->lr >= 0 && o->lr <= 10, lr)
	CHECK(o->beta1 >= 0 && o->beta1 < 1, beta1)
	CHECK(o->beta2 >= 0 && o->beta2 < 1, beta2)
	CHECK(isfinite(o->eps) && o->eps > 0, eps)
	CHECK(isfinite(o->weight_decay) && o->weight_decay >= 0 && o->weight_decay < 10, weight_decay)
	CHECK(isfinite(o->clip_norm) && o->clip_norm >= 0, clip_norm)
	CHECK(o->warmup_steps >= 0, warmup_steps)
	CHECK(o->total_steps >= 0, total_steps)
	CHECK(o->decay >= KERN_DECAY_NONE && o->decay <= KERN_DECAY_COSINE, decay)
	CHECK(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1, min_lr_ratio)
#undef CHECK
	return COT_OK;
}

/* cos(x) for x in [0, pi] by its Taylor series (error < 1e-17): basic
 * operations only, so the schedule is the same with every libm. */
static double portable_cos(double x)
{
	double x2 = x * x, sum = 1, term = 1;
	for (int k = 1; k <= 20; k++) {
		term *= -x2 / ((2.0 * k - 1) * (2.0 * k));
		sum += term;
	}
	return sum;
}

/* b^n by squaring (only multiplications: deterministic). */
static double powi(double b, long n)
{
	double r = 1;
	while (n > 0) {
		if (n & 1)
			r *= b;
		b *= b;
		n >>= 1;
	}
	return r;
}

float kern_opt_lr(const kern_opt_config *o, long s)
{
	double lr = o->lr;
	if (s < 0)
		s = 0;
	if (s < o->warmup_steps)
		return (float)(lr * (double)(s + 1) / (double)o->warmup_steps);
	if (o->decay == KERN_DECAY_NONE || o->total_steps <= o->warmup_steps)
		return (float)lr;
	double q = (double)(s - o->warmup_steps) / (double)(o->total_steps - o->warmup_steps);
	if (q > 1)
		q = 1;
	double mn = o->min_lr_ratio, ratio;
	if (o->decay == KERN_DECAY_LINEAR)
		ratio = 1 - q * (1 - mn);
	else
		ratio = mn + (1 - mn) * (1 + portable_cos(3.14159265358979323846 * q)) / 2;
	return (float)(lr * ratio);
}

bool kern_opt_decays(const kern_view *v) { return v->ndim >= 2; }

/* The scalars of a step, one function each so that the CPU's step and the
 * GPU's (kern_opt_step_gpu) compute them alike. */

/* The factor clip_grad_norm_ applies for a global norm `norm`. */
static float clip_coef(const kern_opt_config *o, double norm)
{
	if (!(o->clip_norm > 0))
		return 1.0f;
	float c = (float)(o->clip_norm / (norm + 1e-6));
	return c < 1.0f ? c : 1.0f;
}

/* AdamW's decoupled decay of view v's parameters: p *= this. */
static float adamw_keep(const kern_opt_config *o, const kern_view *v, float lr)
{
	return kern_opt_decays(v) ? 1.0f - lr * o->weight_decay : 1.0f;
}

/* LAMB's decay added into view v's update. */
static float lamb_wd(const kern_opt_config *o, const kern_view *v)
{
	return kern_opt_decays(v) ? o->weight_decay : 0.0f;
}

/* LAMB's lr r of view v, from ||p||^2 and ||u||^2 over it. */
static float lamb_scale(const kern_view *v, double p2, double u2, float lr)
{
	double r = 1;
	if (kern_opt_decays(v) && p2 > 0 && u2 > 0)
		r = sqrt(p2) / sqrt(u2);
	return (float)(lr * r);
}

/* Sum of squares of x[0..n) in double, in a fixed order (8 interleaved
 * partial sums combined pairwise) that the compiler may vectorise without
 * changing it. */
KERN_SIMD static double sumsq(const float *x, size_t n)
{
	double acc[8] = { 0 }, tail = 0;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += (double)x[i + j] * x[i + j];
	for (; i < n; i++)
		tail += (double)x[i] * x[i];
	for (int w = 4; w >= 1; w /= 2)
		for (int j = 0; j < w; j++)
			acc[j] += acc[j + w];
	return acc[0] + tail;
}

double kern_grad_norm(const kern_model *m)
{
	size_t n = m->n_params;
	long nblocks = (long)((n + KERN_OPT_BLOCK - 1) / KERN_OPT_BLOCK);
	double total = 0;
	int nt = kern_threads();
	/* blocks in parallel, each summed serially; partials added in order */
	enum { GROUP = 256 };
	double part[GROUP];
	for (long g0 = 0; g0 < nblocks; g0 += GROUP) {
		long ng = nblocks - g0 < GROUP ? nblocks - g0 : GROUP;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && ng > 1)
		for (long b = 0; b < ng; b++) {
			size_t lo = (size_t)(g0 + b) * KERN_OPT_BLOCK;
			size_t len = n - lo < KERN_OPT_BLOCK ? n - lo : KERN_OPT_BLOCK;
			part[b] = sumsq(m->grads + lo, len);
		}
		for (long b = 0; b < ng; b++)
			total += part[b];
	}
	return sqrt(total);
}

/* A run of at most KERN_OPT_BLOCK elements inside one tensor. */
typedef struct {
	int view;
	size_t lo, len;
	double p2, u2; /* LAMB: ||p||^2 and ||u||^2 over the segment */
} segment;

static segment *make_segments(const kern_model *m, long *count)
{
	long n = 0;
	for (int i = 0; i < m->n_views; i++)
		n += (long)((m->views[i].numel + KERN_OPT_BLOCK - 1) / KERN_OPT_BLOCK);
	segment *s = calloc((size_t)(n ? n : 1), sizeof *s);
	if (!s)
		return NULL;
	long k = 0;
	for (int i = 0; i < m->n_views; i++)
		for (size_t lo = 0; lo < m->views[i].numel; lo += KERN_OPT_BLOCK) {
			size_t left = m->views[i].numel - lo;
			s[k].view = i;
			s[k].lo = m->views[i].offset + lo;
			s[k].len = left < KERN_OPT_BLOCK ? left : KERN_OPT_BLOCK;
			k++;
		}
	*count = k;
	return s;
}

/* LAMB's per-view lr r (lamb_scale) into scale[n_views], each view's
 * segments' sums (p2, u2) added in order. */
static void lamb_scales(const kern_model *m, const segment *segs, long nseg, float lr, float *scale)
{
	long k = 0;
	for (int v = 0; v < m->n_views; v++) {
		double p2 = 0, u2 = 0;
		for (; k < nseg && segs[k].view == v; k++) {
			p2 += segs[k].p2;
			u2 += segs[k].u2;
		}
		scale[v] = lamb_scale(&m->views[v], p2, u2, lr);
	}
}

KERN_SIMD static void adamw_segment(kern_model *m, float *mom1, float *mom2, const kern_opt_config *o,
                                    const segment *sg, float lr, float coef, float step_size, float bc2_sqrt)
{
	float *p = m->params + sg->lo, *mm = mom1 + sg->lo, *vv = mom2 + sg->lo;
	const float *g = m->grads + sg->lo;
	float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
	float keep = adamw_keep(o, &m->views[sg->view], lr);
	for (size_t i = 0; i < sg->len; i++) {
		float gi = g[i] * coef;
		float pi = p[i] * keep;
		float mi = mm[i] * b1 + (1.0f - b1) * gi;
		float vi = vv[i] * b2 + (1.0f - b2) * gi * gi;
		float denom = sqrtf(vi) / bc2_sqrt + eps;
		p[i] = pi + -step_size * (mi / denom);
		mm[i] = mi;
		vv[i] = vi;
	}
}

/* LAMB pass 1: update the moments, sum ||p||^2 and ||u||^2. */
KERN_SIMD static void lamb_moments(kern_model *m, float *mom1, float *mom2, const kern_opt_config *o,
                                   segment *sg, float coef, float bc1, float bc2)
{
	float *p = m->params + sg->lo, *mm = mom1 + sg->lo, *vv = mom2 + sg->lo;
	const float *g = m->grads + sg->lo;
	float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
	float wd = lamb_wd(o, &m->views[sg->view]);
	double pa[8] = { 0 }, ua[8] = { 0 };
	/* lanes of 8: element i always lands in sum i % 8, in order; whole
	 * groups of 8 first (a fixed-width loop the compiler vectorises), then
	 * the tail, which continues the same lanes */
	size_t full = sg->len / 8 * 8, i0 = 0;
	for (; i0 < full; i0 += 8)
		for (size_t j = 0; j < 8; j++) {
			size_t i = i0 + j;
			float gi = g[i] * coef;
			float mi = mm[i] * b1 + (1.0f - b1) * gi;
			float vi = vv[i] * b2 + (1.0f - b2) * gi * gi;
			float u = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i];
			mm[i] = mi;
			vv[i] = vi;
			pa[j] += (double)p[i] * p[i];
			ua[j] += (double)u * u;
		}
	for (size_t j = 0; i0 + j < sg->len; j++) {
		size_t i = i0 + j;
		float gi = g[i] * coef;
		float mi = mm[i] * b1 + (1.0f - b1) * gi;
		float vi = vv[i] * b2 + (1.0f - b2) * gi * gi;
		float u = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i];
		mm[i] = mi;
		vv[i] = vi;
		pa[j] += (double)p[i] * p[i];
		ua[j] += (double)u * u;
	}
	for (int w = 4; w >= 1; w /= 2)
		for (int j = 0; j < w; j++) {
			pa[j] += pa[j + w];
			ua[j] += ua[j + w];
		}
	sg->p2 = pa[0];
	sg->u2 = ua[0];
}

/* LAMB pass 2: recompute u from the new moments (same bits) and apply. */
KERN_SIMD static void lamb_apply(kern_model *m, const float *mom1, const float *mom2,
                                 const kern_opt_config *o, const segment *sg, float scale, float bc1,
                                 float bc2)
{
	float *p = m->params + sg->lo;
	const float *mm = mom1 + sg->lo, *vv = mom2 + sg->lo;
	float eps = o->eps;
	float wd = lamb_wd(o, &m->views[sg->view]);
	for (size_t i = 0; i < sg->len; i++) {
		float u = (mm[i] / bc1) / (sqrtf(vv[i] / bc2) + eps) + wd * p[i];
		p[i] = p[i] - scale * u;
	}
}

cot_err kern_opt_step_with(kern_model *m, const kern_opt_config *o, float *mom1, float *mom2, long lr_step,
                           long t, kern_opt_stats *st, cot_errbuf *eb)
{
	cot_err rc = kern_opt_validate(o, eb);
	if (rc)
		return rc;
	if (t < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "optimizer step count %ld is below 1", t);
	double norm = kern_grad_norm(m);
	if (!isfinite(norm))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "cannot take an optimizer step: the gradient is not finite");
	float coef = clip_coef(o, norm);
	float lr = kern_opt_lr(o, lr_step);
	double bc1 = 1 - powi(o->beta1, t), bc2 = 1 - powi(o->beta2, t);
	long nseg;
	segment *segs = make_segments(m, &nseg);
	float *scale = malloc(sizeof(float) * (size_t)m->n_views);
	if (!segs || !scale) {
		free(segs);
		free(scale);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for an optimizer step");
	}
	int nt = kern_threads();
	if (o->kind == KERN_OPT_ADAMW) {
		float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1)
		for (long i = 0; i < nseg; i++)
			adamw_segment(m, mom1, mom2, o, &segs[i], lr, coef, step_size, bc2_sqrt);
	} else {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1)
		for (long i = 0; i < nseg; i++)
			lamb_moments(m, mom1, mom2, o, &segs[i], coef, (float)bc1, (float)bc2);
		lamb_scales(m, segs, nseg, lr, scale);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1)
		for (long i = 0; i < nseg; i++)
			lamb_apply(m, mom1, mom2, o, &segs[i], scale[segs[i].view], (float)bc1, (float)bc2);
	}
	free(scale);
	free(segs);
	if (st) {
		st->grad_norm = norm;
		st->clip_coef = coef;
		st->lr = lr;
	}
	kern_gpu_params_changed(m);
	return COT_OK;
}

cot_err kern_opt_step_gpu(kern_model *m, const kern_opt_config *o, float *mom1, float *mom2, int moments,
                          long lr_step, long t, double divisor, kern_opt_stats *st, cot_errbuf *eb)
{
	cot_err rc = kern_opt_validate(o, eb);
	if (rc)
		return rc;
	if (t < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "optimizer step count %ld is below 1", t);
	if (!(divisor > 0))
		return cot_seterr(eb, COT_ERR_INVALID, "a gradient of %g samples cannot be averaged",
		                  divisor);
	if (!kern_gpu_can_step(m))
		return cot_seterr(eb, COT_ERR_CONFLICT, "the gradient is not all on the GPU");
	long nblocks = (long)((m->n_params + KERN_OPT_BLOCK - 1) / KERN_OPT_BLOCK), nseg = 0;
	segment *segs = make_segments(m, &nseg);
	long nparts = nblocks > 2 * nseg ? nblocks : 2 * nseg;
	double *part = malloc(sizeof(double) * (size_t)(nparts ? nparts : 1));
	float *per_view = malloc(sizeof(float) * (size_t)(m->n_views ? m->n_views : 1));
	if (!segs || !part || !per_view) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for an optimizer step");
		goto out;
	}
	if (moments != KERN_GPU_MOM_KEEP && (rc = kern_gpu_opt_moments(m, mom1, mom2, moments, eb)))
		goto out;
	if ((rc = kern_gpu_opt_norm(m, divisor, part, eb)))
		goto out;
	double total = 0;
	for (long b = 0; b < nblocks; b++)
		total += part[b];
	double norm = sqrt(total);
	if (!isfinite(norm)) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "cannot take an optimizer step: the gradient is not finite");
		goto out;
	}
	float coef = clip_coef(o, norm), lr = kern_opt_lr(o, lr_step);
	double bc1 = 1 - powi(o->beta1, t), bc2 = 1 - powi(o->beta2, t);
	kern_gpu_opt_pass p = { .per_view = per_view,
		                .n_views = m->n_views,
		                .coef = coef,
		                .beta1 = o->beta1,
		                .beta2 = o->beta2,
		                .eps = o->eps,
		                .step_size = (float)(lr / bc1),
		                .bc2_sqrt = (float)sqrt(bc2),
		                .bc1 = (float)bc1,
		                .bc2 = (float)bc2,
		                .host_p2 = part,
		                .host_u2 = part + nseg };
	if (o->kind == KERN_OPT_ADAMW) {
		p.pass = KERN_GPU_PASS_ADAMW;
		for (int v = 0; v < m->n_views; v++)
			per_view[v] = adamw_keep(o, &m->views[v], lr);
		rc = kern_gpu_opt_run(m, &p, eb);
	} else {
		p.pass = KERN_GPU_PASS_LAMB_MOMENTS;
		for (int v = 0; v < m->n_views; v++)
			per_view[v] = lamb_wd(o, &m->views[v]);
		if ((rc = kern_gpu_opt_run(m, &p, eb)))
			goto out;
		for (long k = 0; k < nseg; k++) {
			segs[k].p2 = part[k];
			segs[k].u2 = part[nseg + k];
		}
		lamb_scales(m, segs, nseg, lr, per_view);
		p.pass = KERN_GPU_PASS_LAMB_APPLY;
		rc = kern_gpu_opt_run(m, &p, eb);
	}
	if (!rc && st) {
		st->grad_norm = norm;
		st->clip_coef = coef;
		st->lr = lr;
	}
out:
	free(per_view);
	free(part);
	free(segs);
	return rc;
}

cot_err kern_opt_step(kern_model *m, const kern_opt_config *o, kern_opt_stats *st, cot_errbuf *eb)
{
	cot_err rc = kern_opt_step_with(m, o, m->m, m->v, m->step, m->step + 1, st, eb);
	if (!rc)
		m->step++;
	return rc;
}

/* ---- the outer optimizer of local mode ---- */

void kern_outer_default(kern_outer_config *o)
{
	o->lr = (float)KERN_OUTER_LR_DEFAULT;
	o->momentum = (float)KERN_OUTER_MOMENTUM_DEFAULT;
	o->nesterov = KERN_OUTER_NESTEROV_DEFAULT;
}

cot_err kern_outer_validate(const kern_outer_config *o, cot_errbuf *eb)
{
	if (!(isfinite(o->lr) && o->lr > 0 && o->lr <= 10))
		return cot_seterr(eb, COT_ERR_INVALID, "outer optimizer setting lr is out of range");
	if (!(o->momentum >= 0 && o->momentum < 1))
		return cot_seterr(eb, COT_ERR_INVALID, "outer optimizer setting momentum is out of range");
	return COT_OK;
}

/* Elements [lo, lo + len) of the outer step; see optimizer.h. */
KERN_SIMD static void outer_segment(float *p, float *mom, const float *d, size_t len, float lr, float mu,
                                    bool nesterov)
{
	for (size_t i = 0; i < len; i++) {
		float mi = mu * mom[i] + d[i];
		float u = nesterov ? d[i] + mu * mi : mi;
		p[i] = p[i] - lr * u;
		mom[i] = mi;
	}
}

cot_err kern_opt_outer_step(kern_model *m, const kern_outer_config *o, cot_errbuf *eb)
{
	cot_err rc = kern_outer_validate(o, eb);
	if (rc)
		return rc;
	size_t n = m->n_params;
	long nblocks = (long)((n + KERN_OPT_BLOCK - 1) / KERN_OPT_BLOCK);
	int bad = 0;
	for (size_t i = 0; i < n && !bad; i++)
		bad = !isfinite(m->grads[i]);
	if (bad)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "cannot take an outer step: the pseudo-gradient is not finite");
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nblocks > 1)
	for (long b = 0; b < nblocks; b++) {
		size_t lo = (size_t)b * KERN_OPT_BLOCK;
		size_t len = n - lo < KERN_OPT_BLOCK ? n - lo : KERN_OPT_BLOCK;
		outer_segment(m->params + lo, m->m + lo, m->grads + lo, len, o->lr, o->momentum, o->nesterov);
	}
	m->step++;
	kern_gpu_params_changed(m);
	return COT_OK;
}
