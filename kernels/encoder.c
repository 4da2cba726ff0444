/* cotrain kernels: the ALBERT / BERT encoders.  See encoder.h. */
#include "kernels/encoder.h"

#include "kernels/attention_full.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/masking.h"
#include "kernels/matmul.h"
#include "kernels/mlm_head.h"
#include "kernels/sop_head.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
	VIEWS_PER_SET = 12, /* and a 13th, the distance embedding, with relative positions */
	TAIL_VIEWS = 9,     /* pooler 2, sop 2, mlm 5 */
};

/* Saved activations of one block (sized for max_batch). */
typedef struct {
	float *qkv;           /* [B,T,3H] */
	float *atty;          /* [B,T,H] attention output */
	float *att;           /* [B,NH,T,T] probabilities */
	float *r1, *h1;       /* [B,T,H] attention residual sum, after its LayerNorm */
	float *mean1, *rstd1; /* [B,T] */
	float *fch, *fchg;    /* [B,T,F] before and after GELU */
	float *r2, *h2;       /* [B,T,H] FFN residual sum, after its LayerNorm (block output) */
	float *mean2, *rstd2;
} enc_layer_acts;

struct kern_enc_acts {
	int B;                                      /* batch of the last forward, 0 before any */
	int have_targets;                           /* the last forward had labels */
	int n_rows;                                 /* rows of the MLM head in the last forward */
	float *mem;                                 /* one allocation for every float buffer below */
	int32_t *ids, *segs, *rows, *targets, *sop; /* [B,T] x4, [B] */
	int32_t *s_ids, *s_segs, *s_labels, *s_sop; /* kern_enc_train_stream's batch */
	int32_t *lens;                              /* [B] sample lengths */
	float *emb, *embln, *emb_mean, *emb_rstd;   /* [B,T,E] x2, [B,T] x2 */
	float *x0;                                  /* [B,T,H] (ALBERT; BERT: embln) */
	enc_layer_acts *layer;                      /* n_layer */
	float *xg;                                  /* [B*T,H] the MLM head's rows */
	kern_mlm_acts mlm;
	float *mlm_losses;                             /* [B*T] */
	float *cls, *pooled, *sop_logits, *sop_losses; /* [B,H] x2, [B,2], [B] */
	/* backward scratch */
	float *dx, *dy, *dqkv, *datty, *dfch, *dfchg, *datt, *dlogits, *dxg, *de1, *de2;
	float *dcls, *dpooled, *dsop;
};

/* Pointers to one parameter set (in params or grads). */
typedef struct {
	float *qkvw, *qkvb, *outw, *outb, *ln1w, *ln1b, *fcw, *fcb, *fcow, *fcob, *ln2w, *ln2b;
	float *dist; /* [2T-1, H/NH] with relative positions, else NULL */
} set_ptrs;

/* Pointers to the views outside the sets. */
typedef struct {
	float *word, *pos, *type, *elnw, *elnb, *projw, *projb;
	float *poolw, *poolb, *sopw, *sopb, *mdw, *mdb, *mlnw, *mlnb, *mbias;
} outer_ptrs;

static int is_albert(const kern_config *c) { return c->arch == KERN_ARCH_ALBERT; }
static int head_views(const kern_config *c) { return is_albert(c) ? 7 : 5; }
static int is_relative(const kern_config *c) { return c->position != KERN_POS_ABSOLUTE; }
static int set_views(const kern_config *c) { return VIEWS_PER_SET + is_relative(c); }

/* The relative term's scale: Hugging Face's AlbertAttention adds
 * q . D[i-j] after dividing q . k by sqrt(head width), BertSelfAttention
 * before, so an exported model computes what it trained on. */
static float rel_scale(const kern_config *c)
{
	return is_albert(c) ? 1.0f : 1.0f / sqrtf((float)(c->d_model / c->n_head));
}

static size_t set_numel(const kern_config *c)
{
	size_t H = c->d_model, F = c->d_ff;
	size_t n = H * 3 * H + 3 * H + H * H + H + 2 * H + H * F + F + F * H + H + 2 * H;
	if (is_relative(c))
		n += (2 * (size_t)c->seq_len - 1) * (H / c->n_head);
	return n;
}

size_t kern_enc_param_count(const kern_config *c)
{
	size_t V = c->vocab, T = c->seq_len, E = c->d_embed, H = c->d_model;
	size_t n = V * E + T * E + (size_t)c->type_vocab * E + 2 * E;
	if (is_albert(c))
		n += E * H + H;
	n += (size_t)c->n_shared * set_numel(c);
	n += H * H + H + 2 * H + 2 + H * E + E + 2 * E + V;
	return n;
}

cot_err kern_enc_config_validate(const kern_config *c, cot_errbuf *eb)
{
	if (c->arch != KERN_ARCH_ALBERT && c->arch != KERN_ARCH_BERT)
		return cot_seterr(eb, COT_ERR_INVALID, "model config arch %d is not an encoder", c->arch);
	if (c->d_embed < 1 || c->d_embed > KERN_MAX_DIM)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config field d_embed is %d; it must lie in 1..%d", c->d_embed,
		                  KERN_MAX_DIM);
	if (c->type_vocab < 2 || c->type_vocab > 16)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config field type_vocab is %d; it must lie in 2..16", c->type_vocab);
	if (c->seq_len < 5)
		return cot_seterr(eb, COT_ERR_INVALID, "model config seq_len %d is too short for an encoder",
		                  c->seq_len); /* [CLS] a [SEP] b [SEP] */
	const int ids[4] = { c->cls_id, c->sep_id, c->mask_id, c->pad_id };
	static const char *const names[4] = { "cls_id", "sep_id", "mask_id", "pad_id" };
	for (int i = 0; i < 4; i++) {
		if (ids[i] < 0 || ids[i] >= c->vocab)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "model config field %s is %d; it must lie in 0..%d", names[i],
			                  ids[i], c->vocab - 1);
		for (int j = 0; j < i; j++)
			if (ids[i] == ids[j])
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "model config fields %s and %s are both %d", names[j],
				                  names[i], ids[i]);
	}
	if (!kern_position_name(c->position))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config field position is %d; it must lie in 0..%d", c->position,
		                  KERN_POS_RELATIVE_KEY_QUERY);
	if (c->unk_id < -1 || c->unk_id >= c->vocab)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config field unk_id is %d; it must lie in -1..%d", c->unk_id,
		                  c->vocab - 1);
	if (c->vocab < 5)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config vocab %d leaves no ordinary token beside the four special "
		                  "ones",
		                  c->vocab);
	if (c->arch == KERN_ARCH_BERT) {
		if (c->d_embed != c->d_model)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "model config d_embed %d differs from d_model %d", c->d_embed,
			                  c->d_model);
		if (c->n_shared != c->n_layer)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "model config n_shared %d differs from n_layer %d", c->n_shared,
			                  c->n_layer);
	} else if (c->n_layer % c->n_shared != 0) {
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "model config n_layer %d is not a multiple of n_shared %d", c->n_layer,
		                  c->n_shared);
	}
	return COT_OK;
}

int kern_enc_predicted_per_sample(const kern_config *c)
{
	int n = (int)lround(0.15 * (c->seq_len - 3));
	return n < 1 ? 1 : n;
}

/* Matrix products only, 2 FLOPs per multiply-add, forward
 *   2TEH (ALBERT's projection) + L (2T(3H^2 + H^2 + 2HF) + 4T^2 H)
 *   + 2P(HE + EV) (the MLM head on the P predicted positions) + 2(H^2 + 2H)
 * and the backward twice that: 3 times in all. */
double kern_enc_flops_per_sample(const kern_config *c)
{
	double L = c->n_layer, T = c->seq_len, H = c->d_model, F = c->d_ff, V = c->vocab, E = c->d_embed,
	       P = kern_enc_predicted_per_sample(c);
	double fwd = L * (2 * T * (3 * H * H + H * H + 2 * H * F) + 4 * T * T * H) + 2 * P * (H * E + E * V) +
	             2 * (H * H + 2 * H);
	if (is_relative(c)) /* q . D (and k . D) for every score */
		fwd += L * 2 * T * T * H * (c->position == KERN_POS_RELATIVE_KEY_QUERY ? 2 : 1);
	if (is_albert(c))
		fwd += 2 * T * E * H;
	return 3 * fwd;
}

/* A view of d0 [x d1] (d1 0: one dimension). */
static void add_view(kern_view *out, int max, int *k, size_t *off, const char *name, int d0, int d1)
{
	kern_view_append(out, max, k, off, name, d1 ? 2 : 1, d0, d1);
}

int kern_enc_param_views(const kern_config *c, kern_view *out, int max)
{
	static const char *const suffix[VIEWS_PER_SET] = {
		"attn.qkv.weight", "attn.qkv.bias", "attn.out.weight", "attn.out.bias",
		"attn.ln.weight",  "attn.ln.bias",  "ffn.weight",      "ffn.bias",
		"ffn_out.weight",  "ffn_out.bias",  "ln.weight",       "ln.bias",
	};
	int H = c->d_model, F = c->d_ff, E = c->d_embed, V = c->vocab, k = 0;
	const int shapes[VIEWS_PER_SET][2] = {
		{ H, 3 * H }, { 3 * H, 0 }, { H, H }, { H, 0 }, { H, 0 }, { H, 0 },
		{ H, F },     { F, 0 },     { F, H }, { H, 0 }, { H, 0 }, { H, 0 },
	};
	size_t off = 0;
	char nm[64];
	add_view(out, max, &k, &off, "emb.word", V, E);
	add_view(out, max, &k, &off, "emb.position", c->seq_len, E);
	add_view(out, max, &k, &off, "emb.token_type", c->type_vocab, E);
	add_view(out, max, &k, &off, "emb.ln.weight", E, 0);
	add_view(out, max, &k, &off, "emb.ln.bias", E, 0);
	if (is_albert(c)) {
		add_view(out, max, &k, &off, "emb.proj.weight", E, H);
		add_view(out, max, &k, &off, "emb.proj.bias", H, 0);
	}
	for (int s = 0; s < c->n_shared; s++) {
		for (int i = 0; i < VIEWS_PER_SET; i++) {
			snprintf(nm, sizeof nm, "layer.%d.%s", s, suffix[i]);
			add_view(out, max, &k, &off, nm, shapes[i][0], shapes[i][1]);
		}
		if (is_relative(c)) {
			snprintf(nm, sizeof nm, "layer.%d.attn.distance.weight", s);
			add_view(out, max, &k, &off, nm, 2 * c->seq_len - 1, H / c->n_head);
		}
	}
	add_view(out, max, &k, &off, "pooler.weight", H, H);
	add_view(out, max, &k, &off, "pooler.bias", H, 0);
	add_view(out, max, &k, &off, "sop.weight", H, 2);
	add_view(out, max, &k, &off, "sop.bias", 2, 0);
	add_view(out, max, &k, &off, "mlm.dense.weight", H, E);
	add_view(out, max, &k, &off, "mlm.dense.bias", E, 0);
	add_view(out, max, &k, &off, "mlm.ln.weight", E, 0);
	add_view(out, max, &k, &off, "mlm.ln.bias", E, 0);
	add_view(out, max, &k, &off, "mlm.bias", V, 0);
	return k;
}

static set_ptrs set_at(const kern_model *m, float *base, int s)
{
	const kern_view *v = m->views + head_views(&m->config) + set_views(&m->config) * s;
	set_ptrs p = {
		base + v[0].offset,
		base + v[1].offset,
		base + v[2].offset,
		base + v[3].offset,
		base + v[4].offset,
		base + v[5].offset,
		base + v[6].offset,
		base + v[7].offset,
		base + v[8].offset,
		base + v[9].offset,
		base + v[10].offset,
		base + v[11].offset,
		is_relative(&m->config) ? base + v[12].offset : NULL,
	};
	return p;
}

static outer_ptrs outer_at(const kern_model *m, float *base)
{
	const kern_view *v = m->views, *t = m->views + m->n_views - TAIL_VIEWS;
	outer_ptrs p = { 0 };
	p.word = base + v[0].offset;
	p.pos = base + v[1].offset;
	p.type = base + v[2].offset;
	p.elnw = base + v[3].offset;
	p.elnb = base + v[4].offset;
	if (is_albert(&m->config)) {
		p.projw = base + v[5].offset;
		p.projb = base + v[6].offset;
	}
	p.poolw = base + t[0].offset;
	p.poolb = base + t[1].offset;
	p.sopw = base + t[2].offset;
	p.sopb = base + t[3].offset;
	p.mdw = base + t[4].offset;
	p.mdb = base + t[5].offset;
	p.mlnw = base + t[6].offset;
	p.mlnb = base + t[7].offset;
	p.mbias = base + t[8].offset;
	return p;
}

/* Lay the float buffers out in one allocation (mem NULL: only count). */
static size_t acts_layout(struct kern_enc_acts *a, float *mem, const kern_config *c, int B)
{
	size_t BT = (size_t)B * c->seq_len, H = c->d_model, F = c->d_ff, V = c->vocab, NH = c->n_head,
	       T = c->seq_len, E = c->d_embed, off = 0;
#define TAKE(ptr, n) \
	do { \
		if (mem) \
			(ptr) = mem + off; \
		off += (n); \
		off = (off + 15) & ~(size_t)15; \
	} while (0)
	TAKE(a->emb, BT * E);
	TAKE(a->embln, BT * E);
	TAKE(a->emb_mean, BT);
	TAKE(a->emb_rstd, BT);
	if (is_albert(c))
		TAKE(a->x0, BT * H);
	else if (mem)
		a->x0 = a->embln;
	for (int l = 0; l < c->n_layer; l++) {
		enc_layer_acts *la = &a->layer[l];
		TAKE(la->qkv, BT * 3 * H);
		TAKE(la->atty, BT * H);
		TAKE(la->att, (size_t)B * NH * T * T);
		TAKE(la->r1, BT * H);
		TAKE(la->h1, BT * H);
		TAKE(la->mean1, BT);
		TAKE(la->rstd1, BT);
		TAKE(la->fch, BT * F);
		TAKE(la->fchg, BT * F);
		TAKE(la->r2, BT * H);
		TAKE(la->h2, BT * H);
		TAKE(la->mean2, BT);
		TAKE(la->rstd2, BT);
	}
	TAKE(a->xg, BT * H);
	TAKE(a->mlm.pre, BT * E);
	TAKE(a->mlm.act, BT * E);
	TAKE(a->mlm.out, BT * E);
	TAKE(a->mlm.mean, BT);
	TAKE(a->mlm.rstd, BT);
	TAKE(a->mlm.logits, BT * V);
	TAKE(a->mlm_losses, BT);
	TAKE(a->cls, (size_t)B * H);
	TAKE(a->pooled, (size_t)B * H);
	TAKE(a->sop_logits, (size_t)B * 2);
	TAKE(a->sop_losses, (size_t)B);
	TAKE(a->dx, BT * H);
	TAKE(a->dy, BT * H);
	TAKE(a->dqkv, BT * 3 * H);
	TAKE(a->datty, BT * H);
	TAKE(a->dfch, BT * F);
	TAKE(a->dfchg, BT * F);
	TAKE(a->datt, (size_t)B * NH * T * T);
	TAKE(a->dlogits, BT * V);
	TAKE(a->dxg, BT * H);
	TAKE(a->de1, BT * (E > H ? E : H));
	TAKE(a->de2, BT * E);
	TAKE(a->dcls, (size_t)B * H);
	TAKE(a->dpooled, (size_t)B * H);
	TAKE(a->dsop, (size_t)B * 2);
#undef TAKE
	return off;
}

void kern_enc_acts_free(struct kern_enc_acts *a)
{
	if (!a)
		return;
	free(a->mem);
	free(a->ids);
	free(a->segs);
	free(a->rows);
	free(a->targets);
	free(a->sop);
	free(a->s_ids);
	free(a->s_segs);
	free(a->s_labels);
	free(a->s_sop);
	free(a->lens);
	free(a->layer);
	free(a);
}

cot_err kern_enc_acts_create(const kern_config *c, int max_batch, struct kern_enc_acts **out, cot_errbuf *eb)
{
	*out = NULL;
	struct kern_enc_acts *a = calloc(1, sizeof *a);
	if (!a)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for encoder activations");
	size_t BT = (size_t)max_batch * c->seq_len;
	a->layer = calloc((size_t)c->n_layer, sizeof *a->layer);
	a->ids = calloc(BT, sizeof(int32_t));
	a->segs = calloc(BT, sizeof(int32_t));
	a->rows = calloc(BT, sizeof(int32_t));
	a->targets = calloc(BT, sizeof(int32_t));
	a->sop = calloc((size_t)max_batch, sizeof(int32_t));
	a->s_ids = calloc(BT, sizeof(int32_t));
	a->s_segs = calloc(BT, sizeof(int32_t));
	a->s_labels = calloc(BT, sizeof(int32_t));
	a->s_sop = calloc((size_t)max_batch, sizeof(int32_t));
	a->lens = calloc((size_t)max_batch, sizeof(int32_t));
	if (a->lens && a->layer && a->ids && a->segs && a->rows && a->targets && a->sop && a->s_ids &&
	    a->s_segs && a->s_labels && a->s_sop) {
		size_t n = acts_layout(a, NULL, c, max_batch);
		a->mem = calloc(n, sizeof(float));
		if (a->mem) {
			acts_layout(a, a->mem, c, max_batch);
			*out = a;
			return COT_OK;
		}
	}
	kern_enc_acts_free(a);
	return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for encoder activations of batch %d", max_batch);
}

/* Each of n values must lie in [lo, hi], or be ignore when ignore_ok. */
static cot_err check_range(const int32_t *x, size_t n, int lo, int hi, int ignore_ok, const char *what,
                           cot_errbuf *eb)
{
	for (size_t i = 0; i < n; i++)
		if ((x[i] < lo || x[i] > hi) && !(ignore_ok && x[i] == KERN_ENC_IGNORE))
			return cot_seterr(eb, COT_ERR_INVALID, "%s %d at position %zu is outside %d..%d",
			                  what, (int)x[i], i, lo, hi);
	return COT_OK;
}

/* rows [n, width] = src rows idx[i] (row stride width). */
static void gather_rows(float *dst, const float *src, const int32_t *idx, int n, int width)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16) if (nt > 1 && n > 64)
	for (int i = 0; i < n; i++)
		memcpy(dst + (size_t)i * width, src + (size_t)idx[i] * width, (size_t)width * sizeof(float));
}

/* The first index of the largest of x[0..n). */
static int argmax(const float *x, int n)
{
	int best = 0;
	for (int j = 1; j < n; j++)
		if (x[j] > x[best])
			best = j;
	return best;
}

cot_err kern_enc_forward(kern_model *m, const kern_enc_batch *batch, int B, kern_enc_result *res,
                         cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	struct kern_enc_acts *a = m->enc_acts;
	if (res)
		memset(res, 0, sizeof *res);
	if (c->arch == KERN_ARCH_GPT)
		return cot_seterr(eb, COT_ERR_CONFLICT, "cannot run an encoder pass on a gpt model");
	if (!a)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "cannot run a forward pass on a model created without activations");
	if (B < 1 || B > m->max_batch)
		return cot_seterr(eb, COT_ERR_INVALID, "batch size %d is outside 1..%d", B, m->max_batch);
	if (!batch || !batch->ids || !batch->segments)
		return cot_seterr(eb, COT_ERR_INVALID, "an encoder batch needs token ids and segment ids");
	if (!batch->labels != !batch->sop)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "an encoder batch needs both MLM labels and SOP labels, or neither");
	int T = c->seq_len, H = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab, E = c->d_embed,
	    L = c->n_layer, BT = B * T, erf = c->arch == KERN_ARCH_BERT;
	cot_err rc = check_range(batch->ids, (size_t)BT, 0, V - 1, 0, "token", eb);
	if (!rc)
		rc = check_range(batch->segments, (size_t)BT, 0, c->type_vocab - 1, 0, "segment", eb);
	if (!rc && batch->labels)
		rc = check_range(batch->labels, (size_t)BT, 0, V - 1, 1, "label", eb);
	if (!rc && batch->sop)
		rc = check_range(batch->sop, (size_t)B, 0, 1, 0, "sentence-order label", eb);
	if (!rc && batch->lengths)
		rc = check_range(batch->lengths, (size_t)B, 1, T, 0, "sample length", eb);
	if (rc)
		return rc;
	a->B = 0; /* invalid until the pass completes */
	memcpy(a->ids, batch->ids, sizeof(int32_t) * (size_t)BT);
	memcpy(a->segs, batch->segments, sizeof(int32_t) * (size_t)BT);
	a->n_rows = 0;
	for (int i = 0; i < BT; i++)
		if (!batch->labels || batch->labels[i] != KERN_ENC_IGNORE) {
			a->rows[a->n_rows] = i;
			a->targets[a->n_rows++] = batch->labels ? batch->labels[i] : 0;
		}
	if (batch->sop)
		memcpy(a->sop, batch->sop, sizeof(int32_t) * (size_t)B);
	for (int b = 0; b < B; b++)
		a->lens[b] = batch->lengths ? batch->lengths[b] : T;

	outer_ptrs o = outer_at(m, m->params);
	/* relative positions: emb.position is not added (Hugging Face's
	 * embeddings skip it unless position_embedding_type is absolute) */
	kern_embedding_seg_forward(a->emb, a->ids, a->segs, o.word, is_relative(c) ? NULL : o.pos, o.type, B,
	                           T, E);
	kern_layernorm_forward_eps(a->embln, a->emb_mean, a->emb_rstd, a->emb, o.elnw, o.elnb, BT, E,
	                           KERN_ENC_LN_EPS);
	if (is_albert(c))
		kern_linear_forward(a->x0, a->embln, o.projw, o.projb, BT, E, H);
	const float *x = a->x0;
	for (int l = 0; l < L; l++) {
		set_ptrs p = set_at(m, m->params, kern_layer_set(c, l));
		enc_layer_acts *la = &a->layer[l];
		kern_linear_forward(la->qkv, x, p.qkvw, p.qkvb, BT, H, 3 * H);
		if (p.dist)
			kern_attention_full_rel_forward(la->atty, la->att, la->qkv, p.dist, a->lens, B, T, H,
			                                NH, rel_scale(c),
			                                c->position == KERN_POS_RELATIVE_KEY_QUERY);
		else
			kern_attention_full_forward(la->atty, la->att, la->qkv, a->lens, B, T, H, NH);
		kern_linear_forward_residual(la->r1, x, la->atty, p.outw, p.outb, BT, H, H);
		kern_layernorm_forward_eps(la->h1, la->mean1, la->rstd1, la->r1, p.ln1w, p.ln1b, BT, H,
		                           KERN_ENC_LN_EPS);
		if (erf) {
			kern_linear_forward(la->fch, la->h1, p.fcw, p.fcb, BT, H, F);
			kern_gelu_erf_forward(la->fchg, la->fch, (size_t)BT * F);
		} else {
			kern_linear_forward_gelu(la->fch, la->fchg, la->h1, p.fcw, p.fcb, BT, H, F);
		}
		kern_linear_forward_residual(la->r2, la->h1, la->fchg, p.fcow, p.fcob, BT, F, H);
		kern_layernorm_forward_eps(la->h2, la->mean2, la->rstd2, la->r2, p.ln2w, p.ln2b, BT, H,
		                           KERN_ENC_LN_EPS);
		x = la->h2;
	}

	/* MLM head on its rows */
	kern_mlm_weights mw = { o.mdw, o.mdb, o.mlnw, o.mlnb, o.word, o.mbias };
	if (a->n_rows > 0) {
		gather_rows(a->xg, x, a->rows, a->n_rows, H);
		kern_mlm_head_forward(&a->mlm, &mw, a->xg, a->n_rows, H, E, V, erf, KERN_ENC_LN_EPS);
	}
	/* SOP head on the [CLS] rows */
	for (int b = 0; b < B; b++)
		memcpy(a->cls + (size_t)b * H, x + (size_t)b * T * H, (size_t)H * sizeof(float));
	kern_sop_head_forward(a->pooled, a->sop_logits, a->cls, o.poolw, o.poolb, o.sopw, o.sopb, B, H);

	a->have_targets = batch->labels != NULL;
	if (a->have_targets && res) {
		if (a->n_rows > 0)
			res->mlm_loss = kern_crossentropy_forward(a->mlm_losses, a->mlm.logits, a->targets,
			                                          a->n_rows, V);
		res->sop_loss = kern_crossentropy_forward(a->sop_losses, a->sop_logits, a->sop, B, 2);
		res->loss = res->mlm_loss + res->sop_loss;
		res->n_predicted = a->n_rows;
		for (int i = 0; i < a->n_rows; i++)
			res->mlm_correct += argmax(a->mlm.logits + (size_t)i * V, V) == a->targets[i];
		for (int b = 0; b < B; b++)
			res->sop_correct += argmax(a->sop_logits + 2 * b, 2) == a->sop[b];
	}
	a->B = B;
	return COT_OK;
}

const float *kern_enc_mlm_logits(const kern_model *m, int *rows, const int32_t **positions)
{
	const struct kern_enc_acts *a = m->enc_acts;
	if (!a || a->B == 0)
		return NULL;
	if (rows)
		*rows = a->n_rows;
	if (positions)
		*positions = a->rows;
	return a->mlm.logits;
}

const float *kern_enc_sop_logits(const kern_model *m)
{
	return m->enc_acts && m->enc_acts->B > 0 ? m->enc_acts->sop_logits : NULL;
}

cot_err kern_enc_backward_scaled(kern_model *m, float scale, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	struct kern_enc_acts *a = m->enc_acts;
	if (!a || a->B == 0 || !a->have_targets)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "cannot run a backward pass without a forward pass with labels");
	int B = a->B, T = c->seq_len, H = c->d_model, NH = c->n_head, F = c->d_ff, V = c->vocab,
	    E = c->d_embed, L = c->n_layer, BT = B * T, NR = a->n_rows, erf = c->arch == KERN_ARCH_BERT;
	size_t bth = (size_t)BT * H * sizeof(float);
	outer_ptrs o = outer_at(m, m->params), g = outer_at(m, m->grads);

	/* the heads: d(final hidden states) into dx */
	memset(a->dx, 0, bth);
	if (NR > 0) {
		kern_mlm_weights mw = { o.mdw, o.mdb, o.mlnw, o.mlnb, o.word, o.mbias };
		kern_mlm_grads mg = { g.mdw, g.mdb, g.mlnw, g.mlnb, g.word, g.mbias };
		kern_crossentropy_backward_set(a->dlogits, a->mlm.logits, a->targets, scale / (float)NR, NR,
		                               V);
		kern_mlm_head_backward_set(a->dxg, &mg, a->dlogits, a->de1, a->de2, &a->mlm, &mw, a->xg, NR,
		                           H, E, V, erf);
		for (int i = 0; i < NR; i++) /* distinct rows */
			memcpy(a->dx + (size_t)a->rows[i] * H, a->dxg + (size_t)i * H,
			       (size_t)H * sizeof(float));
	}
	kern_crossentropy_backward_set(a->dsop, a->sop_logits, a->sop, scale / (float)B, B, 2);
	kern_sop_head_backward_set(a->dcls, g.poolw, g.poolb, g.sopw, g.sopb, a->dpooled, a->dsop, a->pooled,
	                           a->cls, o.poolw, o.sopw, B, H);
	for (int b = 0; b < B; b++) {
		float *d = a->dx + (size_t)b * T * H;
		const float *s = a->dcls + (size_t)b * H;
		for (int j = 0; j < H; j++)
			d[j] += s[j];
	}

	/* the blocks, last first: dx holds d(block output) */
	for (int l = L - 1; l >= 0; l--) {
		int s = kern_layer_set(c, l);
		set_ptrs p = set_at(m, m->params, s), gs = set_at(m, m->grads, s);
		enc_layer_acts *la = &a->layer[l];
		const float *x_in = l > 0 ? a->layer[l - 1].h2 : a->x0;
		/* dy = d r2 through the block's last LayerNorm */
		memset(a->dy, 0, bth);
		kern_layernorm_backward(a->dy, gs.ln2w, gs.ln2b, a->dx, la->r2, p.ln2w, la->mean2, la->rstd2,
		                        BT, H);
		/* dy += d h1 through the FFN (the residual carries dy itself) */
		if (erf) {
			kern_linear_backward_set(a->dfchg, gs.fcow, gs.fcob, a->dy, la->fchg, p.fcow, BT, F,
			                         H);
			kern_gelu_erf_backward_set(a->dfch, la->fch, a->dfchg, (size_t)BT * F);
		} else {
			kern_linear_backward_set_gelu(a->dfchg, a->dfch, la->fch, gs.fcow, gs.fcob, a->dy,
			                              la->fchg, p.fcow, BT, F, H);
		}
		kern_linear_backward(a->dy, gs.fcw, gs.fcb, a->dfch, la->h1, p.fcw, BT, H, F);
		/* dx = d r1 through the attention's LayerNorm */
		memset(a->dx, 0, bth);
		kern_layernorm_backward(a->dx, gs.ln1w, gs.ln1b, a->dy, la->r1, p.ln1w, la->mean1, la->rstd1,
		                        BT, H);
		/* dx += d x_in through the attention */
		kern_linear_backward_set(a->datty, gs.outw, gs.outb, a->dx, la->atty, p.outw, BT, H, H);
		if (p.dist)
			kern_attention_full_rel_backward(a->dqkv, gs.dist, a->datt, a->datty, la->qkv, p.dist,
			                                 la->att, B, T, H, NH, rel_scale(c),
			                                 c->position == KERN_POS_RELATIVE_KEY_QUERY);
		else
			kern_attention_full_backward_set(a->dqkv, a->datt, a->datty, la->qkv, la->att, B, T,
			                                 H, NH);
		kern_linear_backward(a->dx, gs.qkvw, gs.qkvb, a->dqkv, x_in, p.qkvw, BT, H, 3 * H);
	}

	/* the embeddings */
	const float *demb_ln = a->dx;
	if (is_albert(c)) {
		kern_linear_backward_set(a->de1, g.projw, g.projb, a->dx, a->embln, o.projw, BT, E, H);
		demb_ln = a->de1;
	}
	memset(a->de2, 0, (size_t)BT * E * sizeof(float));
	kern_layernorm_backward(a->de2, g.elnw, g.elnb, demb_ln, a->emb, o.elnw, a->emb_mean, a->emb_rstd, BT,
	                        E);
	kern_embedding_seg_backward(g.word, is_relative(c) ? NULL : g.pos, g.type, a->de2, a->ids, a->segs, B,
	                            T, E);
	return COT_OK;
}

cot_err kern_enc_stream_batch(kern_model *m, const int32_t *raw, size_t raw_stride, int B, uint64_t seed,
                              int64_t epoch, int64_t microbatch, kern_enc_batch *batch, cot_errbuf *eb)
{
	struct kern_enc_acts *a = m->enc_acts;
	memset(batch, 0, sizeof *batch);
	if (m->config.arch == KERN_ARCH_GPT || !a)
		return cot_seterr(eb, COT_ERR_CONFLICT, "cannot train a %s model on encoder samples",
		                  a ? "gpt" : "model without activations");
	if (B < 1 || B > m->max_batch)
		return cot_seterr(eb, COT_ERR_INVALID, "batch size %d is outside 1..%d", B, m->max_batch);
	cot_err rc = kern_mask_build(&m->config, seed, epoch, microbatch, B, raw, raw_stride, a->s_ids,
	                             a->s_segs, a->s_labels, a->s_sop, eb);
	if (rc)
		return rc;
	*batch = (kern_enc_batch){ a->s_ids, a->s_segs, a->s_labels, a->s_sop, NULL };
	return COT_OK;
}

cot_err kern_enc_train_stream(kern_model *m, const int32_t *raw, size_t raw_stride, int B, uint64_t seed,
                              int64_t epoch, int64_t microbatch, float scale, kern_enc_result *res,
                              cot_errbuf *eb)
{
	kern_enc_batch batch;
	if (res)
		memset(res, 0, sizeof *res);
	cot_err rc = kern_enc_stream_batch(m, raw, raw_stride, B, seed, epoch, microbatch, &batch, eb);
	if (!rc)
		rc = kern_enc_forward(m, &batch, B, res, eb);
	if (!rc)
		rc = kern_enc_backward_scaled(m, scale, eb);
	return rc;
}
