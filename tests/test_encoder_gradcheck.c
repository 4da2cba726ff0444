/* Finite-difference checks of the encoders' layers and of their whole
 * loss (kernels/encoder.h), against oracles in double precision written
 * out below, with tests/fd_check.c's method and tolerances (see
 * tests/test_kernels_gradcheck.c for why they are tight): layers RTOL
 * 5e-5, ATOL 5e-6; the whole model RTOL 2e-4, ATOL 2e-5.
 *
 * Layers: the bidirectional attention, the token+position+segment
 * embedding, the exact (erf) GELU, LayerNorm with BERT's eps 1e-12, the MLM
 * head with either GELU, the SOP head.  The backward kernels that write
 * ("_set") get NaN in their output first, so a kernel that read its old
 * contents would fail.  Models: a tiny ALBERT (one set shared by 2 blocks,
 * factorised embedding, tanh GELU) and a tiny BERT (2 sets, exact GELU),
 * every tensor's gradient.  The same for relative positions: the attention
 * with a distance embedding (relative_key and relative_key_query, at
 * ALBERT's and BERT's scales, d qkv and d distance, which accumulates and
 * is the same bits at 1 and 2 threads) and both models with it. */
#include "kernels/attention_full.h"
#include "kernels/backend.h"
#include "kernels/embedding.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/mlm_head.h"
#include "kernels/model.h"
#include "kernels/sop_head.h"
#include "tests/fd_check.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYER_RTOL 5e-5
#define LAYER_ATOL 5e-6
#define MODEL_RTOL 2e-4
#define MODEL_ATOL 2e-5
#define ENC_EPS 1e-12

static float *nanv(size_t n)
{
	float *x = fd_zerov(n);
	for (size_t i = 0; i < n; i++)
		x[i] = NAN;
	return x;
}

/* ---- oracles ------------------------------------------------------------- */

/* Unmasked attention, qkv [B,T,3C] -> out [B,T,C], sample b seeing the keys
 * [0, lens[b]) (lens NULL: all T); p is [T] scratch.  dist [2T-1, C/NH]
 * (NULL: none) adds rs (q_t . D[t-j+T-1] [+ k_j . D[t-j+T-1]] when kq) to
 * score (t, j), as kernels/attention_full.h states. */
static void att_full_d(double *out, const double *qkv, const int32_t *lens, int B, int T, int C, int NH,
                       double *p, const double *dist, double rs, int kq)
{
	int hd = C / NH;
	double scale = 1 / sqrt((double)hd);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hd;
				double mx = -INFINITY, sum = 0;
				int n = lens ? lens[b] : T;
				for (int j = 0; j < n; j++) {
					const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hd;
					double s = 0, r = 0;
					for (int i = 0; i < hd; i++)
						s += q[i] * k[i];
					if (dist) {
						const double *d = dist + (size_t)(t - j + T - 1) * hd;
						for (int i = 0; i < hd; i++)
							r += (q[i] + (kq ? k[i] : 0)) * d[i];
					}
					p[j] = s * scale + rs * r;
					mx = fmax(mx, p[j]);
				}
				for (int j = 0; j < n; j++)
					sum += p[j] = exp(p[j] - mx);
				double *y = out + ((size_t)b * T + t) * C + h * hd;
				for (int i = 0; i < hd; i++)
					y[i] = 0;
				for (int j = 0; j < n; j++) {
					const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hd;
					for (int i = 0; i < hd; i++)
						y[i] += p[j] / sum * v[i];
				}
			}
}

static double gelu_d(double x, int erf_form)
{
	if (erf_form)
		return 0.5 * x * (1 + erf(x / sqrt(2.0)));
	return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* MLM head: logits[N,V] from x[N,H]; pre, act [N,E] scratch. */
static void mlm_d(double *logits, double *pre, double *act, const double *x, const double *dw,
                  const double *db, const double *lw, const double *lb, const double *dec, const double *bias,
                  int N, int H, int E, int V, int erf_form)
{
	fd_lin(pre, x, dw, db, N, H, E);
	for (size_t i = 0; i < (size_t)N * E; i++)
		pre[i] = gelu_d(pre[i], erf_form);
	fd_ln(act, pre, lw, lb, N, E, ENC_EPS);
	for (int n = 0; n < N; n++)
		for (int v = 0; v < V; v++) {
			double s = bias[v];
			for (int e = 0; e < E; e++)
				s += act[(size_t)n * E + e] * dec[(size_t)v * E + e];
			logits[(size_t)n * V + v] = s;
		}
}

/* SOP head: logits[B,2] from cls[B,H]; pooled [B,H] scratch. */
static void sop_d(double *logits, double *pooled, const double *cls, const double *wp, const double *bp,
                  const double *ws, const double *bs, int B, int H)
{
	fd_lin(pooled, cls, wp, bp, B, H, H);
	for (size_t i = 0; i < (size_t)B * H; i++)
		pooled[i] = tanh(pooled[i]);
	fd_lin(logits, pooled, ws, bs, B, H, 2);
}

/* Cross-entropy of one row of logits l[V] at target t. */
static double ce_d(const double *l, int V, int t)
{
	double mx = -INFINITY, s = 0;
	for (int v = 0; v < V; v++)
		mx = fmax(mx, l[v]);
	for (int v = 0; v < V; v++)
		s += exp(l[v] - mx);
	return mx + log(s) - l[t];
}

/* ---- layers -------------------------------------------------------------- */

typedef struct {
	double *out, *qkv, *p;
	float *w;
	int B, T, C, NH;
	const int32_t *lens;
	double *dist, rs; /* relative positions: the distance embedding, its scale */
	int kq;
} att_ctx;

static double att_obj(void *p)
{
	att_ctx *c = p;
	att_full_d(c->out, c->qkv, c->lens, c->B, c->T, c->C, c->NH, c->p, c->dist, c->rs, c->kq);
	return fd_dot(c->w, c->out, (size_t)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int NH, size_t samples, const int32_t *lens)
{
	size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
	float *qkv = fd_randv(n3, 1), *out = fd_zerov(n1), *att = fd_zerov(na);
	att_ctx c = {
		fd_zerod(n1), fd_tod(qkv, n3), fd_zerod(T), fd_randv(n1, 1), B, T, C, NH, lens, NULL, 0, 0
	};
	kern_attention_full_forward(out, att, qkv, lens, B, T, C, NH);
	att_obj(&c);
	char what[96], w2[128];
	snprintf(what, sizeof what, "full attention B%d T%d C%d NH%d%s", B, T, C, NH,
	         lens ? " with lengths" : "");
	fd_check_forward(what, out, c.out, n1);
	float *dqkv = nanv(n3), *datt = nanv(na);
	kern_attention_full_backward_set(dqkv, datt, c.w, qkv, att, B, T, C, NH);
	snprintf(w2, sizeof w2, "%s d qkv", what);
	fd_check(w2, att_obj, &c, c.qkv, dqkv, n3, samples, LAYER_RTOL, LAYER_ATOL);
	/* no causal mask: the first token's output depends on the last token,
	 * unless the last is padding */
	float *o1 = fd_zerov(n1);
	memcpy(o1, out, n1 * 4);
	for (int k = 2 * C; k < 3 * C; k++)
		qkv[(size_t)(T - 1) * 3 * C + k] += 1.0f; /* v of sample 0's last token */
	kern_attention_full_forward(out, att, qkv, lens, B, T, C, NH);
	if (lens && lens[0] < T)
		ok(memcmp(out, o1, n1 * 4) == 0, "%s: padding after a sample's length is not seen", what);
	else
		ok(memcmp(out, o1, (size_t)C * 4) != 0, "%s: the first token sees the last", what);
	free(qkv);
	free(out);
	free(att);
	free(o1);
	free(c.out);
	free(c.qkv);
	free(c.p);
	free(c.w);
	free(dqkv);
	free(datt);
}

/* The attention with relative positions: forward against the oracle, d qkv
 * and d distance by finite differences, the distance gradient accumulating
 * and bit-identical at 1 and 2 threads, and the score really reading the
 * distance (moving D[T-1], distance 0, changes the output). */
static void test_attention_rel(int B, int T, int C, int NH, size_t samples, const int32_t *lens, float rs,
                               int kq)
{
	int hd = C / NH, R = 2 * T - 1;
	size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T,
	       nd = (size_t)R * hd;
	float *qkv = fd_randv(n3, 1), *dist = fd_randv(nd, 1), *out = fd_zerov(n1), *att = fd_zerov(na);
	att_ctx c = { fd_zerod(n1),
		      fd_tod(qkv, n3),
		      fd_zerod(T),
		      fd_randv(n1, 1),
		      B,
		      T,
		      C,
		      NH,
		      lens,
		      fd_tod(dist, nd),
		      rs,
		      kq };
	kern_attention_full_rel_forward(out, att, qkv, dist, lens, B, T, C, NH, rs, kq);
	att_obj(&c);
	char what[128], w2[160];
	snprintf(what, sizeof what, "relative_key%s attention B%d T%d C%d NH%d scale %.3g%s",
	         kq ? "_query" : "", B, T, C, NH, rs, lens ? " with lengths" : "");
	fd_check_forward(what, out, c.out, n1);
	float *dqkv = nanv(n3), *datt = nanv(na), *dd = fd_zerov(nd), *dd2 = fd_zerov(nd);
	kern_attention_full_rel_backward(dqkv, dd, datt, c.w, qkv, dist, att, B, T, C, NH, rs, kq);
	snprintf(w2, sizeof w2, "%s d qkv", what);
	fd_check(w2, att_obj, &c, c.qkv, dqkv, n3, samples, LAYER_RTOL, LAYER_ATOL);
	snprintf(w2, sizeof w2, "%s d distance", what);
	fd_check(w2, att_obj, &c, c.dist, dd, nd, samples, LAYER_RTOL, LAYER_ATOL);
	memcpy(dd2, dd, nd * 4);
	kern_attention_full_rel_backward(dqkv, dd2, datt, c.w, qkv, dist, att, B, T, C, NH, rs, kq);
	fd_check_accumulates(w2, dd, dd2, nd);
	/* one thread: the same bits */
	float *dq1 = nanv(n3), *dd1 = fd_zerov(nd), *o1 = fd_zerov(n1);
	kern_set_threads(1);
	kern_attention_full_rel_forward(o1, att, qkv, dist, lens, B, T, C, NH, rs, kq);
	kern_attention_full_rel_backward(dq1, dd1, datt, c.w, qkv, dist, att, B, T, C, NH, rs, kq);
	kern_set_threads(2);
	ok(!memcmp(o1, out, n1 * 4) && !memcmp(dq1, dqkv, n3 * 4) && !memcmp(dd1, dd, nd * 4),
	   "%s: the same bits at 1 and 2 threads", what);
	for (int i = 0; i < hd; i++)
		dist[(size_t)(T - 1) * hd + i] += 1.0f;
	kern_attention_full_rel_forward(o1, att, qkv, dist, lens, B, T, C, NH, rs, kq);
	ok(memcmp(o1, out, n1 * 4) != 0, "%s: the output reads the distance embedding", what);
	float *bufs[] = { qkv, dist, out, att, c.w, dqkv, datt, dd, dd2, dq1, dd1, o1 };
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		free(bufs[i]);
	free(c.out);
	free(c.qkv);
	free(c.p);
	free(c.dist);
}

typedef struct {
	double *out, *wte, *wpe, *wtt;
	const int32_t *tok, *seg;
	float *w;
	int B, T, C;
} emb_ctx;

static double emb_obj(void *p)
{
	emb_ctx *c = p;
	for (int bt = 0; bt < c->B * c->T; bt++)
		for (int j = 0; j < c->C; j++)
			c->out[(size_t)bt * c->C + j] = c->wte[(size_t)c->tok[bt] * c->C + j] +
			                                c->wtt[(size_t)c->seg[bt] * c->C + j] +
			                                c->wpe[(size_t)(bt % c->T) * c->C + j];
	return fd_dot(c->w, c->out, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void)
{
	int B = 2, T = 5, C = 40, V = 4; /* C above one 32-channel block */
	int32_t tok[10], seg[10];
	for (int i = 0; i < B * T; i++) {
		tok[i] = (int32_t)(kern_rng_next(&fd_rng) % V); /* repeats on purpose */
		seg[i] = i % T >= 2;
	}
	size_t n = (size_t)B * T * C;
	float *wte = fd_randv((size_t)V * C, 1), *wpe = fd_randv((size_t)T * C, 1), *wtt = fd_randv(2 * C, 1);
	float *out = fd_zerov(n);
	emb_ctx c = { fd_zerod(n),
		      fd_tod(wte, V * C),
		      fd_tod(wpe, T * C),
		      fd_tod(wtt, 2 * C),
		      tok,
		      seg,
		      fd_randv(n, 1),
		      B,
		      T,
		      C };
	kern_embedding_seg_forward(out, tok, seg, wte, wpe, wtt, B, T, C);
	emb_obj(&c);
	fd_check_forward("segment embedding", out, c.out, n);
	float *dte = fd_zerov((size_t)V * C), *dpe = fd_zerov((size_t)T * C), *dtt = fd_zerov(2 * C);
	kern_embedding_seg_backward(dte, dpe, dtt, c.w, tok, seg, B, T, C);
	fd_check("segment embedding d token", emb_obj, &c, c.wte, dte, (size_t)V * C, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	fd_check("segment embedding d position", emb_obj, &c, c.wpe, dpe, (size_t)T * C, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	fd_check("segment embedding d segment", emb_obj, &c, c.wtt, dtt, 2 * C, 1000, LAYER_RTOL, LAYER_ATOL);
	float *dtt2 = fd_zerov(2 * C), *dte2 = fd_zerov((size_t)V * C), *dpe2 = fd_zerov((size_t)T * C);
	memcpy(dtt2, dtt, 2 * C * 4);
	memcpy(dte2, dte, (size_t)V * C * 4);
	memcpy(dpe2, dpe, (size_t)T * C * 4);
	kern_embedding_seg_backward(dte2, dpe2, dtt2, c.w, tok, seg, B, T, C);
	fd_check_accumulates("segment embedding d segment", dtt, dtt2, 2 * C);
	free(wte);
	free(wpe);
	free(wtt);
	free(out);
	free(c.out);
	free(c.wte);
	free(c.wpe);
	free(c.wtt);
	free(c.w);
	free(dte);
	free(dpe);
	free(dtt);
	free(dte2);
	free(dpe2);
	free(dtt2);
}

typedef struct {
	double *x, *out;
	float *w;
	size_t n;
} gelu_ctx;

static double gelu_obj(void *p)
{
	gelu_ctx *c = p;
	for (size_t i = 0; i < c->n; i++)
		c->out[i] = gelu_d(c->x[i], 1);
	return fd_dot(c->w, c->out, c->n);
}

static void test_gelu_erf(void)
{
	size_t n = 5000; /* more than one 4096 chunk */
	float *x = fd_randv(n, 2), *out = fd_zerov(n), *dx = nanv(n);
	gelu_ctx c = { fd_tod(x, n), fd_zerod(n), fd_randv(n, 1), n };
	kern_gelu_erf_forward(out, x, n);
	gelu_obj(&c);
	fd_check_forward("erf gelu", out, c.out, n);
	kern_gelu_erf_backward_set(dx, x, c.w, n);
	fd_check("erf gelu d input", gelu_obj, &c, c.x, dx, n, 1000, LAYER_RTOL, LAYER_ATOL);
	free(x);
	free(out);
	free(dx);
	free(c.x);
	free(c.out);
	free(c.w);
}

typedef struct {
	double *out, *inp, *wt, *b;
	float *w;
	int N, C;
} ln_ctx;

static double ln_obj(void *p)
{
	ln_ctx *c = p;
	fd_ln(c->out, c->inp, c->wt, c->b, c->N, c->C, ENC_EPS);
	return fd_dot(c->w, c->out, (size_t)c->N * c->C);
}

static void test_layernorm_eps(void)
{
	int N = 6, C = 24;
	size_t nc = (size_t)N * C;
	float *inp = fd_randv(nc, 1), *wt = fd_randv(C, 1), *b = fd_randv(C, 1);
	float *out = fd_zerov(nc), *mean = fd_zerov(N), *rstd = fd_zerov(N);
	/* a row of variance 2e-4, where eps 1e-5 would change the output by 2% */
	for (int j = 0; j < C; j++)
		inp[j] = 1e-2f * (float)(j % 5 - 2);
	ln_ctx c = { fd_zerod(nc), fd_tod(inp, nc), fd_tod(wt, C), fd_tod(b, C), fd_randv(nc, 1), N, C };
	kern_layernorm_forward_eps(out, mean, rstd, inp, wt, b, N, C, (float)ENC_EPS);
	ln_obj(&c);
	fd_check_forward("layernorm eps 1e-12", out, c.out, nc);
	float *dinp = fd_zerov(nc), *dwt = fd_zerov(C), *db = fd_zerov(C);
	kern_layernorm_backward(dinp, dwt, db, c.w, inp, wt, mean, rstd, N, C);
	fd_check("layernorm eps 1e-12 d input", ln_obj, &c, c.inp, dinp, nc, 1000, LAYER_RTOL, LAYER_ATOL);
	free(inp);
	free(wt);
	free(b);
	free(out);
	free(mean);
	free(rstd);
	free(c.out);
	free(c.inp);
	free(c.wt);
	free(c.b);
	free(c.w);
	free(dinp);
	free(dwt);
	free(db);
}

/* The MLM head's weights and input, in double, perturbed by fd_check. */
typedef struct {
	double *x, *dw, *db, *lw, *lb, *dec, *bias;
	double *logits, *pre, *act;
	float *w;
	int N, H, E, V, erf_form;
} mlm_ctx;

static double mlm_obj(void *p)
{
	mlm_ctx *c = p;
	mlm_d(c->logits, c->pre, c->act, c->x, c->dw, c->db, c->lw, c->lb, c->dec, c->bias, c->N, c->H, c->E,
	      c->V, c->erf_form);
	return fd_dot(c->w, c->logits, (size_t)c->N * c->V);
}

static void test_mlm_head(int erf_form)
{
	int N = 5, H = 12, E = 8, V = 10;
	float *x = fd_randv((size_t)N * H, 1), *dw = fd_randv((size_t)H * E, 0.5), *db = fd_randv(E, 0.5);
	float *lw = fd_randv(E, 1), *lb = fd_randv(E, 1), *dec = fd_randv((size_t)V * E, 1),
	      *bias = fd_randv(V, 1);
	kern_mlm_weights wts = { dw, db, lw, lb, dec, bias };
	kern_mlm_acts a = { fd_zerov((size_t)N * E),
		            fd_zerov((size_t)N * E),
		            fd_zerov((size_t)N * E),
		            fd_zerov(N),
		            fd_zerov(N),
		            fd_zerov((size_t)N * V) };
	mlm_ctx c = { fd_tod(x, (size_t)N * H),
		      fd_tod(dw, (size_t)H * E),
		      fd_tod(db, E),
		      fd_tod(lw, E),
		      fd_tod(lb, E),
		      fd_tod(dec, (size_t)V * E),
		      fd_tod(bias, V),
		      fd_zerod((size_t)N * V),
		      fd_zerod((size_t)N * E),
		      fd_zerod((size_t)N * E),
		      fd_randv((size_t)N * V, 1),
		      N,
		      H,
		      E,
		      V,
		      erf_form };
	kern_mlm_head_forward(&a, &wts, x, N, H, E, V, erf_form, (float)ENC_EPS);
	mlm_obj(&c);
	const char *name = erf_form ? "MLM head (erf gelu)" : "MLM head (tanh gelu)";
	char w2[96];
	snprintf(w2, sizeof w2, "%s", name);
	fd_check_forward(w2, a.logits, c.logits, (size_t)N * V);
	kern_mlm_grads g = { fd_zerov((size_t)H * E), fd_zerov(E), fd_zerov(E), fd_zerov(E),
		             fd_zerov((size_t)V * E), fd_zerov(V) };
	float *dx = nanv((size_t)N * H), *s1 = nanv((size_t)N * E), *s2 = nanv((size_t)N * E);
	kern_mlm_head_backward_set(dx, &g, c.w, s1, s2, &a, &wts, x, N, H, E, V, erf_form);
	struct {
		const char *what;
		double *x;
		const float *g;
		size_t n;
	} parts[] = {
		{ "d input", c.x, dx, (size_t)N * H },
		{ "d dense weight", c.dw, g.dense_w, (size_t)H * E },
		{ "d dense bias", c.db, g.dense_b, E },
		{ "d ln weight", c.lw, g.ln_w, E },
		{ "d ln bias", c.lb, g.ln_b, E },
		{ "d decoder (tied)", c.dec, g.decoder, (size_t)V * E },
		{ "d output bias", c.bias, g.bias, V },
	};
	for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
		snprintf(w2, sizeof w2, "%s %s", name, parts[i].what);
		fd_check(w2, mlm_obj, &c, parts[i].x, parts[i].g, parts[i].n, 1000, LAYER_RTOL, LAYER_ATOL);
	}
	free(x);
	free(dw);
	free(db);
	free(lw);
	free(lb);
	free(dec);
	free(bias);
	free(a.pre);
	free(a.act);
	free(a.out);
	free(a.mean);
	free(a.rstd);
	free(a.logits);
	free(c.x);
	free(c.dw);
	free(c.db);
	free(c.lw);
	free(c.lb);
	free(c.dec);
	free(c.bias);
	free(c.logits);
	free(c.pre);
	free(c.act);
	free(c.w);
	free(g.dense_w);
	free(g.dense_b);
	free(g.ln_w);
	free(g.ln_b);
	free(g.decoder);
	free(g.bias);
	free(dx);
	free(s1);
	free(s2);
}

typedef struct {
	double *cls, *wp, *bp, *ws, *bs, *logits, *pooled;
	float *w;
	int B, H;
} sop_ctx;

static double sop_obj(void *p)
{
	sop_ctx *c = p;
	sop_d(c->logits, c->pooled, c->cls, c->wp, c->bp, c->ws, c->bs, c->B, c->H);
	return fd_dot(c->w, c->logits, (size_t)c->B * 2);
}

static void test_sop_head(void)
{
	int B = 3, H = 10;
	float *cls = fd_randv((size_t)B * H, 1), *wp = fd_randv((size_t)H * H, 0.4), *bp = fd_randv(H, 0.5);
	float *ws = fd_randv((size_t)H * 2, 1), *bs = fd_randv(2, 1);
	float *pooled = fd_zerov((size_t)B * H), *logits = fd_zerov((size_t)B * 2);
	sop_ctx c = { fd_tod(cls, (size_t)B * H),
		      fd_tod(wp, (size_t)H * H),
		      fd_tod(bp, H),
		      fd_tod(ws, (size_t)H * 2),
		      fd_tod(bs, 2),
		      fd_zerod((size_t)B * 2),
		      fd_zerod((size_t)B * H),
		      fd_randv((size_t)B * 2, 1),
		      B,
		      H };
	kern_sop_head_forward(pooled, logits, cls, wp, bp, ws, bs, B, H);
	sop_obj(&c);
	fd_check_forward("SOP head", logits, c.logits, (size_t)B * 2);
	float *dcls = nanv((size_t)B * H), *dpooled = nanv((size_t)B * H), *dwp = fd_zerov((size_t)H * H),
	      *dbp = fd_zerov(H), *dws = fd_zerov((size_t)H * 2), *dbs = fd_zerov(2);
	kern_sop_head_backward_set(dcls, dwp, dbp, dws, dbs, dpooled, c.w, pooled, cls, wp, ws, B, H);
	fd_check("SOP head d cls", sop_obj, &c, c.cls, dcls, (size_t)B * H, 1000, LAYER_RTOL, LAYER_ATOL);
	fd_check("SOP head d pooler weight", sop_obj, &c, c.wp, dwp, (size_t)H * H, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	fd_check("SOP head d pooler bias", sop_obj, &c, c.bp, dbp, H, 1000, LAYER_RTOL, LAYER_ATOL);
	fd_check("SOP head d classifier weight", sop_obj, &c, c.ws, dws, (size_t)H * 2, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	fd_check("SOP head d classifier bias", sop_obj, &c, c.bs, dbs, 2, 1000, LAYER_RTOL, LAYER_ATOL);
	free(cls);
	free(wp);
	free(bp);
	free(ws);
	free(bs);
	free(pooled);
	free(logits);
	free(c.cls);
	free(c.wp);
	free(c.bp);
	free(c.ws);
	free(c.bs);
	free(c.logits);
	free(c.pooled);
	free(c.w);
	free(dcls);
	free(dpooled);
	free(dwp);
	free(dbp);
	free(dws);
	free(dbs);
}

/* ---- the whole model ----------------------------------------------------- */
typedef struct {
	const kern_model *m;
	double *p; /* the parameters, in double */
	const int32_t *ids, *seg, *lab, *sop;
	int B;
	double *e, *x, *qkv, *y, *t, *f, *rows, *logits, *pre, *act, *cls, *pooled, *sl, *scr;
} model_ctx;

static const double *param(const model_ctx *c, const char *name) { return fd_view(c->m, c->p, name); }

static const double *sparam(const model_ctx *c, int s, const char *name)
{
	char full[64];
	snprintf(full, sizeof full, "layer.%d.%s", s, name);
	return param(c, full);
}

/* The loss of kernels/encoder.h's model, in double, from c->p. */
static double model_obj(void *p)
{
	model_ctx *c = p;
	const kern_config *k = &c->m->config;
	int T = k->seq_len, H = k->d_model, F = k->d_ff, V = k->vocab, E = k->d_embed, N = c->B * T,
	    erf_form = k->arch == KERN_ARCH_BERT;
	size_t nh = (size_t)N * H;
	const double *word = param(c, "emb.word"), *pos = param(c, "emb.position"),
	             *type = param(c, "emb.token_type");
	int rel = k->position != KERN_POS_ABSOLUTE, kq = k->position == KERN_POS_RELATIVE_KEY_QUERY;
	/* relative positions: no position row; the scale of the distance
	 * term is 1 for ALBERT, 1/sqrt(head width) for BERT */
	double rs = k->arch == KERN_ARCH_ALBERT ? 1 : 1 / sqrt((double)(H / k->n_head));
	for (int n = 0; n < N; n++)
		for (int j = 0; j < E; j++)
			c->t[(size_t)n * E + j] = word[(size_t)c->ids[n] * E + j] +
			                          type[(size_t)c->seg[n] * E + j] +
			                          (rel ? 0 : pos[(size_t)(n % T) * E + j]);
	fd_ln(c->e, c->t, param(c, "emb.ln.weight"), param(c, "emb.ln.bias"), N, E, ENC_EPS);
	if (k->arch == KERN_ARCH_ALBERT)
		fd_lin(c->x, c->e, param(c, "emb.proj.weight"), param(c, "emb.proj.bias"), N, E, H);
	else
		memcpy(c->x, c->e, nh * sizeof(double));
	for (int l = 0; l < k->n_layer; l++) {
		int s = kern_layer_set(k, l);
		fd_lin(c->qkv, c->x, sparam(c, s, "attn.qkv.weight"), sparam(c, s, "attn.qkv.bias"), N, H,
		       3 * H);
		att_full_d(c->y, c->qkv, NULL, c->B, T, H, k->n_head, c->scr,
		           rel ? sparam(c, s, "attn.distance.weight") : NULL, rs, kq);
		fd_lin(c->t, c->y, sparam(c, s, "attn.out.weight"), sparam(c, s, "attn.out.bias"), N, H, H);
		for (size_t i = 0; i < nh; i++)
			c->t[i] += c->x[i];
		fd_ln(c->x, c->t, sparam(c, s, "attn.ln.weight"), sparam(c, s, "attn.ln.bias"), N, H,
		      ENC_EPS);
		fd_lin(c->f, c->x, sparam(c, s, "ffn.weight"), sparam(c, s, "ffn.bias"), N, H, F);
		for (size_t i = 0; i < (size_t)N * F; i++)
			c->f[i] = gelu_d(c->f[i], erf_form);
		fd_lin(c->t, c->f, sparam(c, s, "ffn_out.weight"), sparam(c, s, "ffn_out.bias"), N, F, H);
		for (size_t i = 0; i < nh; i++)
			c->t[i] += c->x[i];
		fd_ln(c->x, c->t, sparam(c, s, "ln.weight"), sparam(c, s, "ln.bias"), N, H, ENC_EPS);
	}
	int nr = 0;
	for (int n = 0; n < N; n++)
		if (c->lab[n] != KERN_ENC_IGNORE)
			memcpy(c->rows + (size_t)nr++ * H, c->x + (size_t)n * H, (size_t)H * sizeof(double));
	mlm_d(c->logits, c->pre, c->act, c->rows, param(c, "mlm.dense.weight"), param(c, "mlm.dense.bias"),
	      param(c, "mlm.ln.weight"), param(c, "mlm.ln.bias"), word, param(c, "mlm.bias"), nr, H, E, V,
	      erf_form);
	double mlm = 0;
	for (int n = 0, r = 0; n < N; n++)
		if (c->lab[n] != KERN_ENC_IGNORE)
			mlm += ce_d(c->logits + (size_t)r++ * V, V, c->lab[n]);
	for (int b = 0; b < c->B; b++)
		memcpy(c->cls + (size_t)b * H, c->x + (size_t)b * T * H, (size_t)H * sizeof(double));
	sop_d(c->sl, c->pooled, c->cls, param(c, "pooler.weight"), param(c, "pooler.bias"),
	      param(c, "sop.weight"), param(c, "sop.bias"), c->B, H);
	double sop = 0;
	for (int b = 0; b < c->B; b++)
		sop += ce_d(c->sl + 2 * b, 2, c->sop[b]);
	return mlm / nr + sop / c->B;
}

static void test_model(int arch, int position)
{
	kern_config cfg = { .n_layer = 2,
		            .n_shared = arch == KERN_ARCH_ALBERT ? 1 : 2,
		            .n_head = 2,
		            .d_model = 8,
		            .seq_len = 7,
		            .vocab = 11,
		            .d_ff = 12,
		            .arch = arch,
		            .d_embed = arch == KERN_ARCH_ALBERT ? 6 : 8,
		            .type_vocab = 2,
		            .cls_id = 0,
		            .sep_id = 1,
		            .mask_id = 2,
		            .pad_id = 3,
		            .unk_id = -1,
		            .position = position };
	kern_model *m;
	cot_errbuf eb;
	int B = 2, T = cfg.seq_len, N = B * T;
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 42);
	/* larger weights than the init's, so that every gradient is far from 0 */
	for (int v = 0; v < m->n_views; v++) {
		float *p = m->params + m->views[v].offset;
		for (size_t i = 0; i < m->views[v].numel; i++)
			p[i] += (float)((m->views[v].ndim == 1 ? 0.2 : 0.4) * kern_rng_normal(&fd_rng));
	}
	int32_t ids[14], seg[14], lab[14], sop[2] = { 0, 1 };
	for (int i = 0; i < N; i++) {
		ids[i] = (int32_t)(4 + kern_rng_next(&fd_rng) % 7);
		seg[i] = i % T >= 3;
		lab[i] = KERN_ENC_IGNORE;
	}
	for (int b = 0; b < B; b++) {
		ids[b * T] = cfg.cls_id;
		ids[b * T + 2] = ids[b * T + 6] = cfg.sep_id;
		lab[b * T + 1] = ids[b * T + 1];
		ids[b * T + 1] = cfg.mask_id;
		lab[b * T + 4 + b] = 5 + b;
	}
	size_t nh = (size_t)N * cfg.d_model, ne = (size_t)N * cfg.d_embed;
	model_ctx c = { m,
		        fd_tod(m->params, m->n_params),
		        ids,
		        seg,
		        lab,
		        sop,
		        B,
		        fd_zerod(ne),
		        fd_zerod(nh),
		        fd_zerod(3 * nh),
		        fd_zerod(nh),
		        fd_zerod(nh > ne ? nh : ne),
		        fd_zerod((size_t)N * cfg.d_ff),
		        fd_zerod(nh),
		        fd_zerod((size_t)N * cfg.vocab),
		        fd_zerod(ne),
		        fd_zerod(ne),
		        fd_zerod((size_t)B * cfg.d_model),
		        fd_zerod((size_t)B * cfg.d_model),
		        fd_zerod((size_t)B * 2),
		        fd_zerod(T) };
	kern_enc_batch batch = { ids, seg, lab, sop, NULL };
	kern_enc_result res;
	kern_zero_grad(m);
	if (kern_enc_forward(m, &batch, B, &res, &eb) || kern_enc_backward_scaled(m, 1, &eb))
		bail_out("model pass: %s", eb.msg);
	double dl = model_obj(&c);
	char what[64];
	snprintf(what, sizeof what, "%s L2 S%d %s", kern_arch_name(arch), cfg.n_shared,
	         kern_position_name(position));
	int rows;
	const float *lg = kern_enc_mlm_logits(m, &rows, NULL);
	fd_check_forward(what, lg, c.logits, (size_t)rows * cfg.vocab);
	ok(fabs(res.loss - dl) < 1e-6 * dl, "%s: float loss %.9f, double %.9f", what, res.loss, dl);
	for (int v = 0; v < m->n_views; v++) {
		char w2[160];
		snprintf(w2, sizeof w2, "%s d %s", what, m->views[v].name);
		if (position != KERN_POS_ABSOLUTE && !strcmp(m->views[v].name, "emb.position")) {
			/* unused: exported for Hugging Face's layout, never trained */
			ok(fd_maxabs(m->grads + m->views[v].offset, m->views[v].numel) == 0,
			   "%s: no gradient (not read)", w2);
			continue;
		}
		fd_check(w2, model_obj, &c, c.p + m->views[v].offset, m->grads + m->views[v].offset,
		         m->views[v].numel, 256, MODEL_RTOL, MODEL_ATOL);
	}
	double *bufs[] = { c.p,      c.e,   c.x,   c.qkv, c.y,      c.t,  c.f,  c.rows,
		           c.logits, c.pre, c.act, c.cls, c.pooled, c.sl, c.scr };
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		free(bufs[i]);
	kern_model_free(m);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	plan_lazy();
	kern_rng_seed(&fd_rng, 24);
	kern_set_threads(2);
	test_attention(2, 5, 8, 2, 1000, NULL);
	test_attention(1, 70, 8, 2, 300, NULL); /* more than one 64-row block */
	const int32_t lens[2] = { 3, 5 };
	test_attention(2, 5, 8, 2, 1000, lens);
	test_embedding();
	test_gelu_erf();
	test_layernorm_eps();
	test_mlm_head(0);
	test_mlm_head(1);
	test_sop_head();
	test_model(KERN_ARCH_ALBERT, KERN_POS_ABSOLUTE);
	test_model(KERN_ARCH_BERT, KERN_POS_ABSOLUTE);
	test_attention_rel(2, 5, 8, 2, 1000, NULL, 1.0f, 0);
	test_attention_rel(2, 5, 8, 2, 1000, lens, 0.5f, 1);
	test_attention_rel(1, 70, 8, 2, 300, NULL, 1.0f, 1); /* more than one 64-row block */
	test_model(KERN_ARCH_ALBERT, KERN_POS_RELATIVE_KEY);
	test_model(KERN_ARCH_BERT, KERN_POS_RELATIVE_KEY_QUERY);
	done_testing();
	return exit_status();
}
