/* cotrain kernels: the model, its layout and its passes.  See model.h. */
#include "kernels/model.h"

#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/gpu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Saved activations of one block for a batch of B (sized for max_batch). */
typedef struct {
	float *ln1, *ln1_mean, *ln1_rstd; /* [B,T,C], [B,T], [B,T] */
	float *qkv;                       /* [B,T,3C] */
	float *atty;                      /* [B,T,C] attention output */
	float *att;                       /* [B,NH,T,T] probabilities */
	float *res2;                      /* [B,T,C] after the attention residual */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fchg; /* [B,T,F] before and after GELU */
	float *res3;       /* [B,T,C] block output */
} layer_acts;

struct kern_acts {
	int B; /* batch of the last forward, 0 before any */
	int have_targets;
	float *mem;                /* one allocation for everything below */
	int32_t *tokens, *targets; /* [B,T] copies for the backward */
	float *encoded;            /* [B,T,C] */
	layer_acts *layer;         /* n_layer */
	float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
	/* backward scratch, reused by every block */
	float *dres, *dln, *dqkv, *datty, *dfch, *dfchg, *datt, *dlogits;
};

/* Pointers to one parameter set (in params, grads or a moment). */
typedef struct {
	float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
	float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} set_ptrs;

enum { VIEWS_PER_SET = 12 };

void kern_config_default(kern_config *c)
{
	memset(c, 0, sizeof *c);
	c->n_layer = 4;
	c->n_shared = 4;
	c->n_head = 4;
	c->d_model = 256;
	c->seq_len = 256;
	c->vocab = 256;
	c->d_ff = 1024;
}

static size_t set_numel(const kern_config *c)
{
	size_t C = c->d_model, F = c->d_ff;
	return 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * F + F + F * C + C;
}

const char *kern_arch_name(int arch)
{
	switch (arch) {
	case KERN_ARCH_GPT:
		return "gpt";
	case KERN_ARCH_ALBERT:
		return "albert";
	case KERN_ARCH_BERT:
		return "bert";
	}
	return NULL;
}

int kern_arch_parse(const char *name)
{
	for (int a = KERN_ARCH_GPT; a <= KERN_ARCH_BERT; a++)
		if (name && strcmp(name, kern_arch_name(a)) == 0)
			return a;
	return -1;
}

const char *kern_position_name(int position)
{
	switch (position) {
	case KERN_POS_ABSOLUTE:
		return "absolute";
	case KERN_POS_RELATIVE_KEY:
		return "relative_key";
	case KERN_POS_RELATIVE_KEY_QUERY:
		return "relative_key_query";
	}
	return NULL;
}

int kern_position_parse(const char *name)
{
	for (int p = KERN_POS_ABSOLUTE; p <= KERN_POS_RELATIVE_KEY_QUERY; p++)
		if (name && strcmp(name, kern_position_name(p)) == 0)
			return p;
	return -1;
}

size_t kern_param_count(const kern_config *c)
{
	if (c->arch != KERN_ARCH_GPT)
		return kern_enc_param_count(c);
	size_t C = c->d_model;
	return (size_t)c->vocab * C + (size_t)c->seq_len * C + (size_t)c->n_shared * set_numel(c) + 2 * C;
}

cot_err kern_config_validate(const kern_config *c, cot_errbuf *eb)
{
	if (!c)
		return cot_seterr(eb, COT_ERR_INVALID, "model config is missing");
#define RANGE(f, lo, hi) \
	if (c->f < (lo) || c->f > (hi)) \
		return cot_seterr(eb, COT_ERR_INVALID, \
		                  "model config field " #f " is %d; it must lie in %d..%d", c->f, (int)(lo), \
		                  (int)(hi));
	RANGE(n_layer, 1, KERN_MAX_LAYERS)
	RANGE(n_shared, 1, c->n_layer)
	RANGE(d_model, 1, KERN_MAX_DIM)
	RANGE(n_head, 1, c->d_model)
	RANGE(seq_len, 1, KERN_MAX_SEQ)
	RANGE(vocab, 2, KERN_MAX_VOCAB)
	RANGE(d_ff, 1, KERN_MAX_DIM)
#undef RANGE
	if (c->d_model % c->n_head != 0)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config d_model %d is not a multiple of n_head %d", c->d_model,
		                  c->n_head);
	if (c->arch != KERN_ARCH_GPT) {
		cot_err rc = kern_enc_config_validate(c, eb);
		if (rc)
			return rc;
	} else if (c->d_embed || c->type_vocab || c->cls_id || c->sep_id || c->mask_id || c->pad_id ||
	           c->unk_id || c->position) {
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config of a gpt has encoder fields (d_embed, type_vocab, special "
		                  "ids, position)");
	}
	if (kern_param_count(c) > KERN_MAX_PARAMS)
		return cot_seterr(eb, COT_ERR_INVALID, "model config has %zu parameters; the limit is %zu",
		                  kern_param_count(c), KERN_MAX_PARAMS);
	return COT_OK;
}

int kern_layer_set(const kern_config *c, int l) { return (int)((long)l * c->n_shared / c->n_layer); }

double kern_flops_per_sample(const kern_config *c)
{
	if (c->arch != KERN_ARCH_GPT)
		return kern_enc_flops_per_sample(c);
	double L = c->n_layer, T = c->seq_len, C = c->d_model, F = c->d_ff, V = c->vocab;
	double fwd = L * (2 * T * (3 * C * C + C * C + 2 * C * F) + 2 * C * T * (T + 1)) + 2 * T * C * V;
	return 3 * fwd;
}

void kern_view_append(kern_view *out, int max, int *k, size_t *off, const char *name, int ndim, int d0,
                      int d1)
{
	kern_view tmp, *v = out && *k < max ? &out[*k] : &tmp;
	memset(v, 0, sizeof *v);
	snprintf(v->name, sizeof v->name, "%s", name);
	v->offset = *off;
	v->ndim = ndim;
	v->shape[0] = d0;
	v->numel = (size_t)d0;
	if (ndim == 2) {
		v->shape[1] = d1;
		v->numel *= (size_t)d1;
	}
	*off += v->numel;
	(*k)++;
}

int kern_param_views(const kern_config *c, kern_view *out, int max)
{
	if (c->arch != KERN_ARCH_GPT)
		return kern_enc_param_views(c, out, max);
	static const struct {
		const char *suffix;
		int ndim;
	} names[VIEWS_PER_SET] = {
		{ "ln_1.weight", 1 },      { "ln_1.bias", 1 },          { "attn.c_attn.weight", 2 },
		{ "attn.c_attn.bias", 1 }, { "attn.c_proj.weight", 2 }, { "attn.c_proj.bias", 1 },
		{ "ln_2.weight", 1 },      { "ln_2.bias", 1 },          { "mlp.c_fc.weight", 2 },
		{ "mlp.c_fc.bias", 1 },    { "mlp.c_proj.weight", 2 },  { "mlp.c_proj.bias", 1 },
	};
	int C = c->d_model, F = c->d_ff, k = 0;
	const int shapes[VIEWS_PER_SET][2] = {
		{ C, 0 }, { C, 0 }, { C, 3 * C }, { 3 * C, 0 }, { C, C }, { C, 0 },
		{ C, 0 }, { C, 0 }, { C, F },     { F, 0 },     { F, C }, { C, 0 },
	};
	size_t off = 0;
	char nm[64];
	kern_view_append(out, max, &k, &off, "wte", 2, c->vocab, C);
	kern_view_append(out, max, &k, &off, "wpe", 2, c->seq_len, C);
	for (int s = 0; s < c->n_shared; s++)
		for (int i = 0; i < VIEWS_PER_SET; i++) {
			snprintf(nm, sizeof nm, "h.%d.%s", s, names[i].suffix);
			kern_view_append(out, max, &k, &off, nm, names[i].ndim, shapes[i][0], shapes[i][1]);
		}
	kern_view_append(out, max, &k, &off, "ln_f.weight", 1, C, 0);
	kern_view_append(out, max, &k, &off, "ln_f.bias", 1, C, 0);
	return k;
}

static set_ptrs set_at(const kern_model *m, float *base, int s)
{
	const kern_view *v = m->views + 2 + VIEWS_PER_SET * s;
	set_ptrs p = {
		base + v[0].offset, base + v[1].offset, base + v[2].offset,  base + v[3].offset,
		base + v[4].offset, base + v[5].offset, base + v[6].offset,  base + v[7].offset,
		base + v[8].offset, base + v[9].offset, base + v[10].offset, base + v[11].offset,
	};
	return p;
}

/* Lay the activations out in one allocation (mem NULL: only count floats). */
static size_t acts_layout(struct kern_acts *a, float *mem, const kern_config *c, int B)
{
	size_t BT = (size_t)B * c->seq_len, C = c->d_model, F = c->d_ff, V = c->vocab, NH = c->n_head,
	       T = c->seq_len, off = 0;
#define TAKE(ptr, n) \
	do { \
		if (mem) \
			(ptr) = mem + off; \
		off += (n); \
		off = (off + 15) & ~(size_t)15; \
	} while (0)
	TAKE(a->encoded, BT * C);
	for (int l = 0; l < c->n_layer; l++) {
		layer_acts *la = &a->layer[l];
		TAKE(la->ln1, BT * C);
		TAKE(la->ln1_mean, BT);
		TAKE(la->ln1_rstd, BT);
		TAKE(la->qkv, BT * 3 * C);
		TAKE(la->atty, BT * C);
		TAKE(la->att, (size_t)B * NH * T * T);
		TAKE(la->res2, BT * C);
		TAKE(la->ln2, BT * C);
		TAKE(la->ln2_mean, BT);
		TAKE(la->ln2_rstd, BT);
		TAKE(la->fch, BT * F);
		TAKE(la->fchg, BT * F);
		TAKE(la->res3, BT * C);
	}
	TAKE(a->lnf, BT * C);
	TAKE(a->lnf_mean, BT);
	TAKE(a->lnf_rstd, BT);
	TAKE(a->logits, BT * V);
	TAKE(a->losses, BT);
	TAKE(a->dres, BT * C);
	TAKE(a->dln, BT * C);
	TAKE(a->dqkv, BT * 3 * C);
	TAKE(a->datty, BT * C);
	TAKE(a->dfch, BT * F);
	TAKE(a->dfchg, BT * F);
	TAKE(a->datt, (size_t)B * NH * T * T);
	TAKE(a->dlogits, BT * V);
#undef TAKE
	return off;
}

static void acts_free(struct kern_acts *a)
{
	if (!a)
		return;
	free(a->mem);
	free(a->tokens);
	free(a->targets);
	free(a->layer);
	free(a);
}

cot_err kern_model_create(const kern_config *c, int max_batch, kern_model **out, cot_errbuf *eb)
{
	*out = NULL;
	cot_err rc = kern_config_validate(c, eb);
	if (rc)
		return rc;
	if (max_batch < 0 || max_batch > 65536)
		return cot_seterr(eb, COT_ERR_INVALID, "max_batch %d is outside 0..65536", max_batch);
	/* every B*T*width product handed to BLAS must fit an int */
	long widest = c->vocab;
	if (3L * c->d_model > widest)
		widest = 3L * c->d_model;
	if (c->d_ff > widest)
		widest = c->d_ff;
	if ((double)max_batch * c->seq_len * widest > 2147483647.0 ||
	    (double)max_batch * c->n_head * c->seq_len * c->seq_len > 2147483647.0 * 8)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "max_batch %d is too large for this model",
		                  max_batch);

	kern_model *m = calloc(1, sizeof *m);
	if (!m)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for a model");
	m->config = *c;
	m->n_params = kern_param_count(c);
	m->n_views = kern_param_views(c, NULL, 0);
	m->views = calloc((size_t)m->n_views, sizeof *m->views);
	m->params = calloc(m->n_params, sizeof(float));
	m->grads = calloc(m->n_params, sizeof(float));
	m->m = calloc(m->n_params, sizeof(float));
	m->v = calloc(m->n_params, sizeof(float));
	m->max_batch = max_batch;
	if (!m->views || !m->params || !m->grads || !m->m || !m->v)
		goto nomem;
	kern_param_views(c, m->views, m->n_views);
	if (max_batch > 0 && c->arch != KERN_ARCH_GPT) {
		cot_err erc = kern_enc_acts_create(c, max_batch, &m->enc_acts, eb);
		if (erc) {
			kern_model_free(m);
			return erc;
		}
	} else if (max_batch > 0) {
		struct kern_acts *a = m->acts = calloc(1, sizeof *a);
		if (!a)
			goto nomem;
		size_t BT = (size_t)max_batch * c->seq_len;
		a->layer = calloc((size_t)c->n_layer, sizeof *a->layer);
		a->tokens = calloc(BT, sizeof(int32_t));
		a->targets = calloc(BT, sizeof(int32_t));
		if (!a->layer || !a->tokens || !a->targets)
			goto nomem;
		size_t n = acts_layout(a, NULL, c, max_batch);
		a->mem = calloc(n, sizeof(float));
		if (!a->mem)
			goto nomem;
		acts_layout(a, a->mem, c, max_batch);
	}
	*out = m;
	return COT_OK;
nomem:
	kern_model_free(m);
	return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for a model of %zu parameters and batch %d",
	                  kern_param_count(c), max_batch);
}

void kern_model_free(kern_model *m)
{
	if (!m)
		return;
	acts_free(m->acts);
	kern_gpu_unbind(m);
	kern_enc_acts_free(m->enc_acts);
	free(m->views);
	free(m->params);
	free(m->grads);
	free(m->m);
	free(m->v);
	free(m);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

void kern_model_init(kern_model *m, uint64_t seed)
{
	kern_rng rng;
	kern_rng_seed(&rng, seed);
	double resid_std = 0.02 / sqrt(2.0 * m->config.n_layer);
	for (int i = 0; i < m->n_views; i++) {
		const kern_view *v = &m->views[i];
		float *p = m->params + v->offset;
		if (v->ndim == 1) {
			float val = ends_with(v->name, ".weight") ? 1.0f : 0.0f;
			for (size_t j = 0; j < v->numel; j++)
				p[j] = val;
			continue;
		}
		double std = ends_with(v->name, "c_proj.weight") ? resid_std : 0.02;
		for (size_t j = 0; j < v->numel; j++)
			p[j] = (float)(std * kern_rng_normal(&rng));
	}
	memset(m->grads, 0, m->n_params * sizeof(float));
	memset(m->m, 0, m->n_params * sizeof(float));
	memset(m->v, 0, m->n_params * sizeof(float));
	m->step = 0;
	kern_gpu_params_changed(m);
}

static cot_err check_ids(const int32_t *ids, size_t n, int V, const char *what, cot_errbuf *eb)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "%s %d at position %zu is outside the vocabulary 0..%d", what,
			                  (int)ids[i], i, V - 1);
	return COT_OK;
}

cot_err kern_forward(kern_model *m, const int32_t *tokens, const int32_t *targets, int B, float *loss_out,
                     cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	struct kern_acts *a = m->acts;
	if (loss_out)
		*loss_out = 0;
	if (c->arch != KERN_ARCH_GPT)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "cannot run a gpt pass on an encoder model (it trains through "
		                  "kern_enc_forward)");
	if (!a)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "cannot run a forward pass on a model created without activations");
	if (B < 1 || B > m->max_batch)
		return cot_seterr(eb, COT_ERR_INVALID, "batch size %d is outside 1..%d", B, m->max_batch);
	int T = c->seq_len, C = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab, L = c->n_layer,
	    BT = B * T;
	cot_err rc = check_ids(tokens, (size_t)BT, V, "token", eb);
	if (!rc && targets)
		rc = check_ids(targets, (size_t)BT, V, "target", eb);
	if (rc)
		return rc;
	a->B = 0; /* invalid until the pass completes */
	memcpy(a->tokens, tokens, sizeof(int32_t) * (size_t)BT);
	if (targets)
		memcpy(a->targets, targets, sizeof(int32_t) * (size_t)BT);

	const float *wte = m->params + m->views[0].offset;
	const float *wpe = m->params + m->views[1].offset;
	const kern_view *lnf = &m->views[m->n_views - 2];
	kern_embedding_forward(a->encoded, a->tokens, wte, wpe, B, T, C);
	const float *res = a->encoded;
	for (int l = 0; l < L; l++) {
		set_ptrs p = set_at(m, m->params, kern_layer_set(c, l));
		layer_acts *la = &a->layer[l];
		kern_layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, res, p.ln1w, p.ln1b, BT, C);
		kern_linear_forward(la->qkv, la->ln1, p.qkvw, p.qkvb, BT, C, 3 * C);
		kern_attention_forward(la->atty, la->att, la->qkv, B, T, C, NH);
		kern_linear_forward_residual(la->res2, res, la->atty, p.attprojw, p.attprojb, BT, C, C);
		kern_layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, p.ln2w, p.ln2b, BT, C);
		kern_linear_forward_gelu(la->fch, la->fchg, la->ln2, p.fcw, p.fcb, BT, C, F);
		kern_linear_forward_residual(la->res3, la->res2, la->fchg, p.fcprojw, p.fcprojb, BT, F, C);
		res = la->res3;
	}
	kern_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, res, m->params + lnf[0].offset,
	                       m->params + lnf[1].offset, BT, C);
	kern_head_forward(a->logits, a->lnf, wte, BT, C, V);
	a->have_targets = targets != NULL;
	if (targets) {
		double loss = kern_crossentropy_forward(a->losses, a->logits, a->targets, BT, V);
		if (loss_out)
			*loss_out = (float)loss;
	}
	a->B = B;
	return COT_OK;
}

const float *kern_logits(const kern_model *m) { return m->acts && m->acts->B > 0 ? m->acts->logits : NULL; }

cot_err kern_backward_scaled(kern_model *m, float scale, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	struct kern_acts *a = m->acts;
	if (!a || a->B == 0 || !a->have_targets)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "cannot run a backward pass without a forward pass with targets");
	int B = a->B, T = c->seq_len, C = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab,
	    L = c->n_layer, BT = B * T;
	size_t btc = (size_t)BT * C * sizeof(float);
	const kern_view *lnf = &m->views[m->n_views - 2];
	const float *wte = m->params + m->views[0].offset;
	float *gwte = m->grads + m->views[0].offset;
	float *gwpe = m->grads + m->views[1].offset;

	/* head: loss -> dlogits -> d(ln_f output) -> d(last residual) */
	kern_crossentropy_backward_set(a->dlogits, a->logits, a->targets, scale / (float)BT, BT, V);
	memset(a->dln, 0, btc);
	kern_head_backward(a->dln, gwte, a->dlogits, a->lnf, wte, BT, C, V);
	const float *res_last = a->layer[L - 1].res3;
	memset(a->dres, 0, btc);
	kern_layernorm_backward(a->dres, m->grads + lnf[0].offset, m->grads + lnf[1].offset, a->dln, res_last,
	                        m->params + lnf[0].offset, a->lnf_mean, a->lnf_rstd, BT, C);
	for (int l = L - 1; l >= 0; l--) {
		int s = kern_layer_set(c, l);
		set_ptrs p = set_at(m, m->params, s), g = set_at(m, m->grads, s);
		layer_acts *la = &a->layer[l];
		const float *res_in = l > 0 ? a->layer[l - 1].res3 : a->encoded;
		/* dres = d res3: through the MLP */
		kern_linear_backward_set_gelu(a->dfchg, a->dfch, la->fch, g.fcprojw, g.fcprojb, a->dres,
		                              la->fchg, p.fcprojw, BT, F, C);
		kern_linear_backward_set(a->dln, g.fcw, g.fcb, a->dfch, la->ln2, p.fcw, BT, C, F);
		kern_layernorm_backward(a->dres, g.ln2w, g.ln2b, a->dln, la->res2, p.ln2w, la->ln2_mean,
		                        la->ln2_rstd, BT, C);
		/* dres = d res2: through the attention */
		kern_linear_backward_set(a->datty, g.attprojw, g.attprojb, a->dres, la->atty, p.attprojw, BT,
		                         C, C);
		kern_attention_backward_set(a->dqkv, a->datt, a->datty, la->qkv, la->att, B, T, C, NH);
		kern_linear_backward_set(a->dln, g.qkvw, g.qkvb, a->dqkv, la->ln1, p.qkvw, BT, C, 3 * C);
		kern_layernorm_backward(a->dres, g.ln1w, g.ln1b, a->dln, res_in, p.ln1w, la->ln1_mean,
		                        la->ln1_rstd, BT, C);
	}
	kern_embedding_backward(gwte, gwpe, a->dres, a->tokens, B, T, C);
	return COT_OK;
}

cot_err kern_backward(kern_model *m, cot_errbuf *eb) { return kern_backward_scaled(m, 1.0f, eb); }

void kern_zero_grad(kern_model *m)
{
	/* in chunks over the threads: one thread's memset of a 19M-parameter
	 * gradient is a serial stretch of several milliseconds per step */
	enum { CHUNK = 1 << 18 };
	size_t n = m->n_params;
	long nchunks = (long)((n + CHUNK - 1) / CHUNK);
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && nchunks > 1)
	for (long c = 0; c < nchunks; c++) {
		size_t lo = (size_t)c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
		memset(m->grads + lo, 0, len * sizeof(float));
	}
	kern_gpu_host_grads_zeroed(m);
}

void kern_scale_grads(kern_model *m, float s)
{
	float *g = m->grads;
	size_t n = m->n_params;
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 65536) if (nt > 1 && n > 65536)
	for (size_t i = 0; i < n; i++)
		g[i] *= s;
}
