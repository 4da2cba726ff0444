/* Finite-difference checks of every layer's backward and of the whole
 * model's loss gradient, against an oracle in double precision.
 *
 * The oracle: each layer (and the whole model) is written out again below,
 * plainly, in double.  A layer check takes a random linear functional of
 * the layer's output, J = sum_i w_i out_i, runs the float backward with
 * dout = w, and compares the analytic gradient of J with central
 * differences (J(x+h) - J(x-h)) / (2h) of the double forward, at every
 * coordinate of small inputs or a random sample of large ones (no
 * coordinate twice).  The model check does the same with the mean
 * cross-entropy.  Each double forward is first checked against the float
 * forward (FWD_TOL), so that the oracle differentiates the function the
 * kernels compute.
 *
 * Why this is tight: with h = 1e-5 in double the differences are exact to
 * about 1e-9 relative (truncation h^2 f''' ~ 1e-10, rounding
 * 1e-16 |J| / h ~ 1e-10 |J|), so what remains is the float backward's own
 * rounding, a few 1e-7 relative to the tensor's largest gradient, a few
 * 1e-6 through the whole model.  A coordinate passes when
 *   |fd - analytic| <= RTOL * |fd| + ATOL * scale
 * with scale the largest |fd| of the coordinates checked (the oracle's,
 * not the kernel's, so a backward that is uniformly too large cannot widen
 * its own tolerance).  Layers: RTOL 5e-5, ATOL 5e-6; the model (float
 * rounding through several layers): RTOL 2e-4, ATOL 2e-5.  On correct
 * kernels the worst coordinate uses under a fifth of its tolerance (GELU,
 * at 9e-7 of its largest gradient; the model's at 2.4e-6).  The tolerance
 * sits well below the slips a backward realistically has: with them
 * injected this test fails for an attention backward scale off by 0.01%,
 * a GELU derivative with kappa 0.0448 for 0.044715 or sqrt(2/pi) rounded
 * to 0.8, a cross-entropy target term off by 0.1%, a LayerNorm mean over
 * C+1 channels, a missing diagonal in the softmax backward, a bias
 * gradient missing a row; the former check (float differences, h 1e-2,
 * 2% tolerance, 12 coordinates) passed the attention (even at 0.1%) and
 * GELU ones.  The backward is also run a second time to check that it
 * accumulates (+=) rather than overwrites. */
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/model.h"
#include "kernels/rng.h"
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
#define LN_EPS 1e-5

/* Causal attention, qkv [B,T,3C] -> out [B,T,C]; p is [T] scratch. */
static void att_d(double *out, const double *qkv, int B, int T, int C, int NH, double *p)
{
	int hd = C / NH;
	double scale = 1 / sqrt((double)hd);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hd;
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j <= t; j++) {
					const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hd;
					double s = 0;
					for (int i = 0; i < hd; i++)
						s += q[i] * k[i];
					p[j] = s * scale;
					mx = fmax(mx, p[j]);
				}
				for (int j = 0; j <= t; j++)
					sum += p[j] = exp(p[j] - mx);
				double *y = out + ((size_t)b * T + t) * C + h * hd;
				for (int i = 0; i < hd; i++)
					y[i] = 0;
				for (int j = 0; j <= t; j++) {
					const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hd;
					for (int i = 0; i < hd; i++)
						y[i] += p[j] / sum * v[i];
				}
			}
}

static double gelu1(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/* Mean cross-entropy of logits[N,V] = x[N,C] wte[V,C]^T; logits is scratch
 * (and holds them afterwards). */
static double head_ce_d(double *logits, const double *x, const double *wte, const int32_t *tg, int N, int C,
                        int V)
{
	double total = 0;
	for (int n = 0; n < N; n++) {
		double *l = logits + (size_t)n * V, mx = -INFINITY, s = 0;
		for (int v = 0; v < V; v++) {
			double a = 0;
			for (int c = 0; c < C; c++)
				a += x[(size_t)n * C + c] * wte[(size_t)v * C + c];
			l[v] = a;
			mx = fmax(mx, a);
		}
		for (int v = 0; v < V; v++)
			s += exp(l[v] - mx);
		total += mx + log(s) - l[tg[n]];
	}
	return total / N;
}

/* ---- linear -------------------------------------------------------------- */
typedef struct {
	double *out, *inp, *W, *b;
	float *w;
	int M, K, N;
} lin_ctx;

static double lin_obj(void *p)
{
	lin_ctx *c = p;
	fd_lin(c->out, c->inp, c->W, c->b, c->M, c->K, c->N);
	return fd_dot(c->w, c->out, (size_t)c->M * c->N);
}

static void test_linear(void)
{
	int M = 300, K = 20, N = 12; /* M > a tile: split GEMMs */
	size_t mk = (size_t)M * K, kn = (size_t)K * N, mn = (size_t)M * N;
	float *inp = fd_randv(mk, 1), *W = fd_randv(kn, 0.5), *b = fd_randv(N, 0.5), *out = fd_zerov(mn);
	lin_ctx c = { fd_zerod(mn), fd_tod(inp, mk), fd_tod(W, kn), fd_tod(b, N), fd_randv(mn, 1), M, K, N };
	float *dinp = fd_zerov(mk), *dW = fd_zerov(kn), *db = fd_zerov(N);
	kern_linear_forward(out, inp, W, b, M, K, N);
	lin_obj(&c);
	fd_check_forward("linear", out, c.out, mn);
	kern_linear_backward(dinp, dW, db, c.w, inp, W, M, K, N);
	fd_check("linear d input", lin_obj, &c, c.inp, dinp, mk, 512, LAYER_RTOL, LAYER_ATOL);
	fd_check("linear d weight", lin_obj, &c, c.W, dW, kn, 512, LAYER_RTOL, LAYER_ATOL);
	fd_check("linear d bias", lin_obj, &c, c.b, db, N, 512, LAYER_RTOL, LAYER_ATOL);
	float *dinp2 = fd_zerov(mk), *dW2 = fd_zerov(kn), *db2 = fd_zerov(N);
	memcpy(dinp2, dinp, mk * 4);
	memcpy(dW2, dW, kn * 4);
	memcpy(db2, db, N * 4);
	kern_linear_backward(dinp2, dW2, db2, c.w, inp, W, M, K, N);
	fd_check_accumulates("linear d input", dinp, dinp2, mk);
	fd_check_accumulates("linear d weight", dW, dW2, kn);
	fd_check_accumulates("linear d bias", db, db2, N);
	free(inp);
	free(W);
	free(b);
	free(out);
	free(c.out);
	free(c.inp);
	free(c.W);
	free(c.b);
	free(c.w);
	free(dinp);
	free(dW);
	free(db);
	free(dinp2);
	free(dW2);
	free(db2);
}

/* ---- embedding ----------------------------------------------------------- */
typedef struct {
	double *out, *wte, *wpe;
	float *w;
	int32_t *tok;
	int B, T, C;
} emb_ctx;

static double emb_obj(void *p)
{
	emb_ctx *c = p;
	for (int b = 0; b < c->B; b++)
		for (int t = 0; t < c->T; t++)
			for (int k = 0; k < c->C; k++)
				c->out[((size_t)b * c->T + t) * c->C + k] =
				        c->wte[(size_t)c->tok[b * c->T + t] * c->C + k] +
				        c->wpe[(size_t)t * c->C + k];
	return fd_dot(c->w, c->out, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void)
{
	enum { V = 7 };
	int B = 3, T = 5, C = 40;
	size_t btc = (size_t)B * T * C;
	int32_t *tok = fd_xcalloc((size_t)B * T, sizeof *tok);
	for (int i = 0; i < B * T; i++)
		tok[i] = (int32_t)(kern_rng_next(&fd_rng) % 4); /* repeats on purpose */
	float *wte = fd_randv((size_t)V * C, 1), *wpe = fd_randv((size_t)T * C, 1), *out = fd_zerov(btc);
	emb_ctx c = { fd_zerod(btc),
		      fd_tod(wte, (size_t)V * C),
		      fd_tod(wpe, (size_t)T * C),
		      fd_randv(btc, 1),
		      tok,
		      B,
		      T,
		      C };
	kern_embedding_forward(out, tok, wte, wpe, B, T, C);
	emb_obj(&c);
	fd_check_forward("embedding", out, c.out, btc);
	float *dwte = fd_zerov((size_t)V * C), *dwpe = fd_zerov((size_t)T * C);
	kern_embedding_backward(dwte, dwpe, c.w, tok, B, T, C);
	/* the 4 rows of wte that tokens use */
	fd_check("embedding d wte", emb_obj, &c, c.wte, dwte, (size_t)4 * C, 1000, LAYER_RTOL, LAYER_ATOL);
	fd_check("embedding d wpe", emb_obj, &c, c.wpe, dwpe, (size_t)T * C, 1000, LAYER_RTOL, LAYER_ATOL);
	ok(fd_maxabs(dwte + 4 * C, (size_t)(V - 4) * C) == 0,
	   "embedding: rows of unused tokens get no gradient");
	float *dwte2 = fd_zerov((size_t)V * C), *dwpe2 = fd_zerov((size_t)T * C);
	memcpy(dwte2, dwte, (size_t)V * C * 4);
	memcpy(dwpe2, dwpe, (size_t)T * C * 4);
	kern_embedding_backward(dwte2, dwpe2, c.w, tok, B, T, C);
	fd_check_accumulates("embedding d wte", dwte, dwte2, (size_t)V * C);
	fd_check_accumulates("embedding d wpe", dwpe, dwpe2, (size_t)T * C);
	free(tok);
	free(wte);
	free(wpe);
	free(out);
	free(c.out);
	free(c.wte);
	free(c.wpe);
	free(c.w);
	free(dwte);
	free(dwpe);
	free(dwte2);
	free(dwpe2);
}

/* ---- layernorm ----------------------------------------------------------- */
typedef struct {
	double *out, *inp, *wt, *b;
	float *w;
	int N, C;
} ln_ctx;

static double ln_obj(void *p)
{
	ln_ctx *c = p;
	fd_ln(c->out, c->inp, c->wt, c->b, c->N, c->C, LN_EPS);
	return fd_dot(c->w, c->out, (size_t)c->N * c->C);
}

static void test_layernorm(int N, int C)
{
	size_t nc = (size_t)N * C;
	float *inp = fd_randv(nc, 1), *wt = fd_randv(C, 1), *b = fd_randv(C, 1);
	for (size_t i = 0; i < nc; i++)
		inp[i] += 0.5f;
	float *out = fd_zerov(nc), *mean = fd_zerov(N), *rstd = fd_zerov(N);
	ln_ctx c = { fd_zerod(nc), fd_tod(inp, nc), fd_tod(wt, C), fd_tod(b, C), fd_randv(nc, 1), N, C };
	kern_layernorm_forward(out, mean, rstd, inp, wt, b, N, C);
	ln_obj(&c);
	char what[64];
	snprintf(what, sizeof what, "layernorm N%d C%d", N, C);
	fd_check_forward(what, out, c.out, nc);
	float *dinp = fd_zerov(nc), *dwt = fd_zerov(C), *db = fd_zerov(C);
	kern_layernorm_backward(dinp, dwt, db, c.w, inp, wt, mean, rstd, N, C);
	char w2[96];
	snprintf(w2, sizeof w2, "%s d input", what);
	fd_check(w2, ln_obj, &c, c.inp, dinp, nc, 1000, LAYER_RTOL, LAYER_ATOL);
	snprintf(w2, sizeof w2, "%s d weight", what);
	fd_check(w2, ln_obj, &c, c.wt, dwt, C, 1000, LAYER_RTOL, LAYER_ATOL);
	snprintf(w2, sizeof w2, "%s d bias", what);
	fd_check(w2, ln_obj, &c, c.b, db, C, 1000, LAYER_RTOL, LAYER_ATOL);
	float *dinp2 = fd_zerov(nc), *dwt2 = fd_zerov(C), *db2 = fd_zerov(C);
	memcpy(dinp2, dinp, nc * 4);
	memcpy(dwt2, dwt, C * 4);
	memcpy(db2, db, C * 4);
	kern_layernorm_backward(dinp2, dwt2, db2, c.w, inp, wt, mean, rstd, N, C);
	fd_check_accumulates("layernorm d input", dinp, dinp2, nc);
	fd_check_accumulates("layernorm d weight", dwt, dwt2, C);
	fd_check_accumulates("layernorm d bias", db, db2, C);
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
	free(dinp2);
	free(dwt2);
	free(db2);
}

/* ---- attention ----------------------------------------------------------- */
typedef struct {
	double *out, *qkv, *p;
	float *w;
	int B, T, C, NH;
} att_ctx;

static double att_obj(void *p)
{
	att_ctx *c = p;
	att_d(c->out, c->qkv, c->B, c->T, c->C, c->NH, c->p);
	return fd_dot(c->w, c->out, (size_t)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int NH, size_t samples)
{
	size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
	float *qkv = fd_randv(n3, 1), *out = fd_zerov(n1), *att = fd_zerov(na);
	att_ctx c = { fd_zerod(n1), fd_tod(qkv, n3), fd_zerod(T), fd_randv(n1, 1), B, T, C, NH };
	kern_attention_forward(out, att, qkv, B, T, C, NH);
	att_obj(&c);
	char what[96];
	snprintf(what, sizeof what, "attention B%d T%d C%d NH%d", B, T, C, NH);
	fd_check_forward(what, out, c.out, n1);
	float *dqkv = fd_zerov(n3), *datt = fd_zerov(na);
	kern_attention_backward(dqkv, datt, c.w, qkv, att, B, T, C, NH);
	char w2[128];
	snprintf(w2, sizeof w2, "%s d qkv", what);
	fd_check(w2, att_obj, &c, c.qkv, dqkv, n3, samples, LAYER_RTOL, LAYER_ATOL);
	/* causality: the output at t must not depend on tokens after t */
	float *o1 = fd_zerov(n1);
	memcpy(o1, out, n1 * 4);
	for (int k = 0; k < 3 * C; k++)
		qkv[(size_t)(T - 1) * 3 * C + k] += 1.0f; /* last token of sample 0 */
	kern_attention_forward(out, att, qkv, B, T, C, NH);
	ok(memcmp(o1, out, (size_t)(T - 1) * C * 4) == 0,
	   "attention T%d: earlier positions ignore a later token", T);
	for (int k = 0; k < 3 * C; k++)
		qkv[(size_t)(T - 1) * 3 * C + k] -= 1.0f;
	kern_attention_forward(out, att, qkv, B, T, C, NH);
	float *dqkv2 = fd_zerov(n3);
	memcpy(dqkv2, dqkv, n3 * 4);
	kern_attention_backward(dqkv2, datt, c.w, qkv, att, B, T, C, NH);
	fd_check_accumulates(w2, dqkv, dqkv2, n3);
	free(qkv);
	free(out);
	free(att);
	free(c.out);
	free(c.qkv);
	free(c.p);
	free(c.w);
	free(dqkv);
	free(datt);
	free(o1);
	free(dqkv2);
}

/* ---- gelu ---------------------------------------------------------------- */
typedef struct {
	double *inp;
	float *w;
	size_t n;
} gelu_ctx;

static double gelu_obj(void *p)
{
	gelu_ctx *c = p;
	double s = 0;
	for (size_t i = 0; i < c->n; i++)
		s += c->w[i] * gelu1(c->inp[i]);
	return s;
}

static void test_gelu(void)
{
	size_t n = 9000; /* > one chunk */
	float *inp = fd_randv(n, 2), *out = fd_zerov(n), *dinp = fd_zerov(n);
	gelu_ctx c = { fd_tod(inp, n), fd_randv(n, 1), n };
	kern_gelu_forward(out, inp, n);
	double *want = fd_zerod(n);
	for (size_t i = 0; i < n; i++)
		want[i] = gelu1(inp[i]);
	fd_check_forward("gelu", out, want, n);
	kern_gelu_backward(dinp, inp, c.w, n);
	/* J is a sum of one term per input: differences of it are exact enough
	 * for every coordinate, and each coordinate is gelu' at one point */
	fd_check("gelu d input", gelu_obj, &c, c.inp, dinp, n, 2000, LAYER_RTOL, LAYER_ATOL);
	free(inp);
	free(out);
	free(dinp);
	free(c.inp);
	free(c.w);
	free(want);
}

/* ---- head and cross-entropy ---------------------------------------------- */
typedef struct {
	double *logits, *x, *wte;
	int32_t *tg;
	int N, C, V;
} ce_ctx;

static double ce_obj(void *p)
{
	ce_ctx *c = p;
	return head_ce_d(c->logits, c->x, c->wte, c->tg, c->N, c->C, c->V);
}

static void test_crossentropy(void)
{
	int N = 10, C = 12, V = 37;
	float *x = fd_randv((size_t)N * C, 1), *wte = fd_randv((size_t)V * C, 0.5),
	      *logits = fd_zerov((size_t)N * V), *losses = fd_zerov(N);
	int32_t *tg = fd_xcalloc(N, sizeof *tg);
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(kern_rng_next(&fd_rng) % V);
	ce_ctx c = {
		fd_zerod((size_t)N * V), fd_tod(x, (size_t)N * C), fd_tod(wte, (size_t)V * C), tg, N, C, V
	};
	kern_head_forward(logits, x, wte, N, C, V);
	double loss = kern_crossentropy_forward(losses, logits, tg, N, V);
	double want = ce_obj(&c);
	fd_check_forward("head", logits, c.logits, (size_t)N * V);
	ok(fabs(loss - want) < 1e-6 * want, "cross-entropy %.9f matches double %.9f", loss, want);
	float *dlog = fd_zerov((size_t)N * V), *dx = fd_zerov((size_t)N * C), *dwte = fd_zerov((size_t)V * C);
	kern_crossentropy_backward(dlog, logits, tg, 1.0f / N, N, V);
	kern_head_backward(dx, dwte, dlog, x, wte, N, C, V);
	fd_check("head + cross-entropy d x", ce_obj, &c, c.x, dx, (size_t)N * C, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	fd_check("head + cross-entropy d wte", ce_obj, &c, c.wte, dwte, (size_t)V * C, 1000, LAYER_RTOL,
	         LAYER_ATOL);
	free(x);
	free(wte);
	free(logits);
	free(losses);
	free(tg);
	free(c.logits);
	free(c.x);
	free(c.wte);
	free(dlog);
	free(dx);
	free(dwte);
}

/* ---- the whole model ----------------------------------------------------- */
typedef struct {
	const kern_model *m;
	double *p; /* the parameters, in double */
	const int32_t *tok, *tg;
	int B;
	double *x, *h, *qkv, *y, *t, *f, *logits, *scr; /* activations */
} model_ctx;

static const double *param(const model_ctx *c, const char *name) { return fd_view(c->m, c->p, name); }

static const double *sparam(const model_ctx *c, int s, const char *name)
{
	char full[64];
	snprintf(full, sizeof full, "h.%d.%s", s, name);
	return param(c, full);
}

/* The mean loss of kernels/model.h's GPT, in double, from c->p. */
static double model_obj(void *p)
{
	model_ctx *c = p;
	const kern_config *k = &c->m->config;
	int T = k->seq_len, C = k->d_model, F = k->d_ff, V = k->vocab, N = c->B * T;
	size_t nc = (size_t)N * C;
	const double *wte = param(c, "wte"), *wpe = param(c, "wpe");
	for (int n = 0; n < N; n++)
		for (int j = 0; j < C; j++)
			c->x[(size_t)n * C + j] =
			        wte[(size_t)c->tok[n] * C + j] + wpe[(size_t)(n % T) * C + j];
	for (int l = 0; l < k->n_layer; l++) {
		int s = kern_layer_set(k, l);
		fd_ln(c->h, c->x, sparam(c, s, "ln_1.weight"), sparam(c, s, "ln_1.bias"), N, C, LN_EPS);
		fd_lin(c->qkv, c->h, sparam(c, s, "attn.c_attn.weight"), sparam(c, s, "attn.c_attn.bias"), N,
		       C, 3 * C);
		att_d(c->y, c->qkv, c->B, T, C, k->n_head, c->scr);
		fd_lin(c->t, c->y, sparam(c, s, "attn.c_proj.weight"), sparam(c, s, "attn.c_proj.bias"), N, C,
		       C);
		for (size_t i = 0; i < nc; i++)
			c->x[i] += c->t[i];
		fd_ln(c->h, c->x, sparam(c, s, "ln_2.weight"), sparam(c, s, "ln_2.bias"), N, C, LN_EPS);
		fd_lin(c->f, c->h, sparam(c, s, "mlp.c_fc.weight"), sparam(c, s, "mlp.c_fc.bias"), N, C, F);
		for (size_t i = 0; i < (size_t)N * F; i++)
			c->f[i] = gelu1(c->f[i]);
		fd_lin(c->t, c->f, sparam(c, s, "mlp.c_proj.weight"), sparam(c, s, "mlp.c_proj.bias"), N, F,
		       C);
		for (size_t i = 0; i < nc; i++)
			c->x[i] += c->t[i];
	}
	fd_ln(c->h, c->x, param(c, "ln_f.weight"), param(c, "ln_f.bias"), N, C, LN_EPS);
	return head_ce_d(c->logits, c->h, wte, c->tg, N, C, V);
}

static void test_model(int L, int S, int T)
{
	kern_config cfg = {
		.n_layer = L, .n_shared = S, .n_head = 2, .d_model = 8, .seq_len = T, .vocab = 11, .d_ff = 12
	};
	kern_model *m;
	cot_errbuf eb;
	int B = 2, N = B * T;
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 42);
	/* larger weights than the init's, so that every gradient is far from 0 */
	for (int v = 0; v < m->n_views; v++) {
		float *p = m->params + m->views[v].offset;
		for (size_t i = 0; i < m->views[v].numel; i++)
			p[i] += (float)((m->views[v].ndim == 1 ? 0.2 : 0.4) * kern_rng_normal(&fd_rng));
	}
	int32_t *tok = fd_xcalloc(N, sizeof *tok), *tg = fd_xcalloc(N, sizeof *tg);
	for (int i = 0; i < N; i++) {
		tok[i] = (int32_t)(kern_rng_next(&fd_rng) % cfg.vocab);
		tg[i] = (int32_t)(kern_rng_next(&fd_rng) % cfg.vocab);
	}
	size_t nc = (size_t)N * cfg.d_model;
	model_ctx c = { m,
		        fd_tod(m->params, m->n_params),
		        tok,
		        tg,
		        B,
		        fd_zerod(nc),
		        fd_zerod(nc),
		        fd_zerod(3 * nc),
		        fd_zerod(nc),
		        fd_zerod(nc),
		        fd_zerod((size_t)N * cfg.d_ff),
		        fd_zerod((size_t)N * cfg.vocab),
		        fd_zerod(T) };
	float loss;
	kern_zero_grad(m);
	if (kern_forward(m, tok, tg, B, &loss, &eb) || kern_backward(m, &eb))
		bail_out("model pass: %s", eb.msg);
	double dl = model_obj(&c);
	char what[64];
	snprintf(what, sizeof what, "model L%d S%d T%d", L, S, T);
	fd_check_forward(what, kern_logits(m), c.logits, (size_t)N * cfg.vocab);
	ok(fabs(loss - dl) < 1e-6 * dl, "%s: float loss %.9f, double %.9f", what, loss, dl);
	for (int v = 0; v < m->n_views; v++) {
		char w2[160];
		snprintf(w2, sizeof w2, "%s d %s", what, m->views[v].name);
		fd_check(w2, model_obj, &c, c.p + m->views[v].offset, m->grads + m->views[v].offset,
		         m->views[v].numel, 256, MODEL_RTOL, MODEL_ATOL);
	}
	free(c.p);
	free(c.x);
	free(c.h);
	free(c.qkv);
	free(c.y);
	free(c.t);
	free(c.f);
	free(c.logits);
	free(c.scr);
	free(tok);
	free(tg);
	kern_model_free(m);
}

int main(void)
{
	plan_lazy();
	kern_rng_seed(&fd_rng, 7);
	kern_set_threads(2);
	test_linear();
	test_embedding();
	test_layernorm(6, 37); /* C not a multiple of 16: the tails */
	test_layernorm(4, 80); /* two channel blocks of the backward */
	test_attention(2, 9, 8, 2, 1000);
	test_attention(1, 150, 8, 2, 1000); /* three row blocks of 64 */
	test_gelu();
	test_crossentropy();
	test_model(2, 2, 8);
	test_model(3, 1, 8);  /* ALBERT sharing: one set for 3 blocks */
	test_model(2, 1, 70); /* attention over two row blocks */
	done_testing();
	return exit_status();
}
