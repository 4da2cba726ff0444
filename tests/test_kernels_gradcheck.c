/* Finite-difference checks of every layer's backward and of the whole
 * model's loss gradient.
 *
 * Each layer check takes a random linear functional of the layer's output,
 * J = sum_i w_i out_i, evaluated in double, runs the backward with dout = w,
 * and compares the analytic gradient of J with central differences
 * (J(x+h) - J(x-h)) / (2h) at every coordinate of small inputs, or a random
 * sample of them.  A coordinate passes when
 *   |fd - analytic| <= RTOL * max(|fd|, |analytic|) + ATOL * scale
 * where scale is the largest analytic gradient of that input: float
 * rounding makes the differences noisy at the 1e-5 level, a wrong backward
 * is off by far more.  The backward is also run a second time to check that
 * it accumulates (+=) rather than overwrites. */
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/model.h"
#include "kernels/rng.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RTOL 2e-2
#define ATOL 2e-3

static kern_rng rng;

static float *randv(size_t n, double std)
{
	float *x = malloc(n * sizeof *x);
	if (!x)
		bail_out("out of memory");
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * kern_rng_normal(&rng));
	return x;
}

static float *zerov(size_t n)
{
	float *x = calloc(n ? n : 1, sizeof *x);
	if (!x)
		bail_out("out of memory");
	return x;
}

static double dotd(const float *a, const float *b, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

static double maxabs(const float *x, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fabs(x[i]) > m ? fabs(x[i]) : m;
	return m;
}

typedef double (*objective)(void *ctx);

/* Compare grad[] with central differences of f over x[] (all coordinates
 * when n <= samples, else a random sample).  Reports one TAP line. */
static void check(const char *what, objective f, void *ctx, float *x,
                  const float *grad, size_t n, int samples, float h)
{
	double scale = maxabs(grad, n), worst = 0;
	size_t worst_i = 0;
	double worst_fd = 0, worst_an = 0;
	int count = n <= (size_t)samples ? (int)n : samples;
	for (int k = 0; k < count; k++) {
		size_t i = n <= (size_t)samples ? (size_t)k
		           : (size_t)(kern_rng_next(&rng) % n);
		float old = x[i], xp = old + h, xm = old - h;
		x[i] = xp;
		double fp = f(ctx);
		x[i] = xm;
		double fm = f(ctx);
		x[i] = old;
		double fd = (fp - fm) / ((double)xp - (double)xm), an = grad[i];
		double tol = RTOL * fmax(fabs(fd), fabs(an)) + ATOL * scale;
		double r = fabs(fd - an) / (tol > 0 ? tol : 1e-30);
		if (r > worst) {
			worst = r;
			worst_i = i;
			worst_fd = fd;
			worst_an = an;
		}
	}
	ok(worst <= 1 && scale > 0, "%s: %d coordinates, max |grad| %.3g, worst error "
	   "%.3g of tolerance", what, count, scale, worst);
	if (worst > 1)
		diag("  at %zu: finite difference %.8g, analytic %.8g", worst_i,
		     worst_fd, worst_an);
}

/* The backward run twice must give twice the gradient. */
static void check_accumulates(const char *what, const float *once,
                              const float *twice, size_t n)
{
	double scale = maxabs(once, n), worst = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)twice[i] - 2.0 * once[i]);
		worst = d > worst ? d : worst;
	}
	ok(worst <= 1e-5 * scale && scale > 0, "%s accumulates: max |twice - 2 once| %.3g",
	   what, worst);
}

/* ---- linear -------------------------------------------------------------- */
typedef struct { float *out, *inp, *W, *b, *w; int M, K, N; } lin_ctx;

static double lin_obj(void *p)
{
	lin_ctx *c = p;
	kern_linear_forward(c->out, c->inp, c->W, c->b, c->M, c->K, c->N);
	return dotd(c->out, c->w, (size_t)c->M * c->N);
}

static void test_linear(void)
{
	lin_ctx c = { .M = 300, .K = 20, .N = 12 };  /* M > a tile: split GEMMs */
	size_t mk = (size_t)c.M * c.K, kn = (size_t)c.K * c.N, mn = (size_t)c.M * c.N;
	c.inp = randv(mk, 1); c.W = randv(kn, 0.5); c.b = randv(c.N, 0.5);
	c.w = randv(mn, 1); c.out = zerov(mn);
	float *dinp = zerov(mk), *dW = zerov(kn), *db = zerov(c.N);
	lin_obj(&c);
	kern_linear_backward(dinp, dW, db, c.w, c.inp, c.W, c.M, c.K, c.N);
	check("linear d input", lin_obj, &c, c.inp, dinp, mk, 300, 1e-2f);
	check("linear d weight", lin_obj, &c, c.W, dW, kn, 300, 1e-2f);
	check("linear d bias", lin_obj, &c, c.b, db, c.N, 300, 1e-2f);
	float *dinp2 = zerov(mk), *dW2 = zerov(kn), *db2 = zerov(c.N);
	memcpy(dinp2, dinp, mk * 4); memcpy(dW2, dW, kn * 4); memcpy(db2, db, c.N * 4);
	kern_linear_backward(dinp2, dW2, db2, c.w, c.inp, c.W, c.M, c.K, c.N);
	check_accumulates("linear d input", dinp, dinp2, mk);
	check_accumulates("linear d weight", dW, dW2, kn);
	check_accumulates("linear d bias", db, db2, c.N);
	free(c.inp); free(c.W); free(c.b); free(c.w); free(c.out);
	free(dinp); free(dW); free(db); free(dinp2); free(dW2); free(db2);
}

/* ---- embedding ----------------------------------------------------------- */
typedef struct { float *out, *wte, *wpe, *w; int32_t *tok; int B, T, C; } emb_ctx;

static double emb_obj(void *p)
{
	emb_ctx *c = p;
	kern_embedding_forward(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
	return dotd(c->out, c->w, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void)
{
	enum { V = 7 };
	emb_ctx c = { .B = 3, .T = 5, .C = 40 };
	size_t btc = (size_t)c.B * c.T * c.C;
	c.tok = malloc(sizeof(int32_t) * c.B * c.T);
	for (int i = 0; i < c.B * c.T; i++)
		c.tok[i] = (int32_t)(kern_rng_next(&rng) % 4);  /* repeats on purpose */
	c.wte = randv((size_t)V * c.C, 1); c.wpe = randv((size_t)c.T * c.C, 1);
	c.w = randv(btc, 1); c.out = zerov(btc);
	float *dwte = zerov((size_t)V * c.C), *dwpe = zerov((size_t)c.T * c.C);
	kern_embedding_backward(dwte, dwpe, c.w, c.tok, c.B, c.T, c.C);
	check("embedding d wte", emb_obj, &c, c.wte, dwte, (size_t)4 * c.C, 1000, 1e-2f);
	check("embedding d wpe", emb_obj, &c, c.wpe, dwpe, (size_t)c.T * c.C, 1000, 1e-2f);
	float *dwte2 = zerov((size_t)V * c.C), *dwpe2 = zerov((size_t)c.T * c.C);
	memcpy(dwte2, dwte, (size_t)V * c.C * 4); memcpy(dwpe2, dwpe, (size_t)c.T * c.C * 4);
	kern_embedding_backward(dwte2, dwpe2, c.w, c.tok, c.B, c.T, c.C);
	check_accumulates("embedding d wte", dwte, dwte2, (size_t)V * c.C);
	free(c.tok); free(c.wte); free(c.wpe); free(c.w); free(c.out);
	free(dwte); free(dwpe); free(dwte2); free(dwpe2);
}

/* ---- layernorm ----------------------------------------------------------- */
typedef struct { float *out, *mean, *rstd, *inp, *wt, *b, *w; int N, C; } ln_ctx;

static double ln_obj(void *p)
{
	ln_ctx *c = p;
	kern_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->wt, c->b, c->N, c->C);
	return dotd(c->out, c->w, (size_t)c->N * c->C);
}

static void test_layernorm(void)
{
	ln_ctx c = { .N = 6, .C = 37 };  /* C not a multiple of 16: the tails */
	size_t nc = (size_t)c.N * c.C;
	c.inp = randv(nc, 1); c.wt = randv(c.C, 1); c.b = randv(c.C, 1);
	for (size_t i = 0; i < nc; i++)
		c.inp[i] += 0.5f;
	c.w = randv(nc, 1); c.out = zerov(nc); c.mean = zerov(c.N); c.rstd = zerov(c.N);
	float *dinp = zerov(nc), *dwt = zerov(c.C), *db = zerov(c.C);
	ln_obj(&c);
	kern_layernorm_backward(dinp, dwt, db, c.w, c.inp, c.wt, c.mean, c.rstd, c.N, c.C);
	check("layernorm d input", ln_obj, &c, c.inp, dinp, nc, 1000, 1e-3f);
	check("layernorm d weight", ln_obj, &c, c.wt, dwt, c.C, 1000, 1e-2f);
	check("layernorm d bias", ln_obj, &c, c.b, db, c.C, 1000, 1e-2f);
	float *dinp2 = zerov(nc), *dwt2 = zerov(c.C), *db2 = zerov(c.C);
	memcpy(dinp2, dinp, nc * 4); memcpy(dwt2, dwt, c.C * 4); memcpy(db2, db, c.C * 4);
	ln_obj(&c);
	kern_layernorm_backward(dinp2, dwt2, db2, c.w, c.inp, c.wt, c.mean, c.rstd, c.N, c.C);
	check_accumulates("layernorm d input", dinp, dinp2, nc);
	check_accumulates("layernorm d weight", dwt, dwt2, c.C);
	free(c.inp); free(c.wt); free(c.b); free(c.w); free(c.out); free(c.mean);
	free(c.rstd); free(dinp); free(dwt); free(db); free(dinp2); free(dwt2); free(db2);
}

/* ---- attention ----------------------------------------------------------- */
typedef struct { float *out, *att, *qkv, *w; int B, T, C, NH; } att_ctx;

static double att_obj(void *p)
{
	att_ctx *c = p;
	kern_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
	return dotd(c->out, c->w, (size_t)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int NH, int samples)
{
	att_ctx c = { .B = B, .T = T, .C = C, .NH = NH };
	size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C,
	       na = (size_t)B * NH * T * T;
	c.qkv = randv(n3, 1); c.w = randv(n1, 1); c.out = zerov(n1); c.att = zerov(na);
	float *dqkv = zerov(n3), *datt = zerov(na);
	att_obj(&c);
	kern_attention_backward(dqkv, datt, c.w, c.qkv, c.att, B, T, C, NH);
	char what[96];
	snprintf(what, sizeof what, "attention B%d T%d C%d NH%d d qkv", B, T, C, NH);
	check(what, att_obj, &c, c.qkv, dqkv, n3, samples, 1e-2f);
	/* causality: the output at t must not depend on tokens after t */
	float *o1 = zerov(n1);
	att_obj(&c);
	memcpy(o1, c.out, n1 * 4);
	for (int k = 0; k < 3 * C; k++)
		c.qkv[(size_t)(T - 1) * 3 * C + k] += 1.0f;  /* last token of sample 0 */
	att_obj(&c);
	ok(memcmp(o1, c.out, (size_t)(T - 1) * C * 4) == 0,
	   "attention T%d: earlier positions ignore a later token", T);
	float *dqkv2 = zerov(n3);
	for (int k = 0; k < 3 * C; k++)
		c.qkv[(size_t)(T - 1) * 3 * C + k] -= 1.0f;
	att_obj(&c);
	memcpy(dqkv2, dqkv, n3 * 4);
	kern_attention_backward(dqkv2, datt, c.w, c.qkv, c.att, B, T, C, NH);
	check_accumulates(what, dqkv, dqkv2, n3);
	free(c.qkv); free(c.w); free(c.out); free(c.att); free(dqkv); free(datt);
	free(o1); free(dqkv2);
}

/* ---- gelu ---------------------------------------------------------------- */
typedef struct { float *out, *inp, *w; size_t n; } gelu_ctx;

static double gelu_obj(void *p)
{
	gelu_ctx *c = p;
	kern_gelu_forward(c->out, c->inp, c->n);
	return dotd(c->out, c->w, c->n);
}

static void test_gelu(void)
{
	gelu_ctx c = { .n = 9000 };  /* > one chunk */
	c.inp = randv(c.n, 2); c.w = randv(c.n, 1); c.out = zerov(c.n);
	float *dinp = zerov(c.n);
	kern_gelu_backward(dinp, c.inp, c.w, c.n);
	check("gelu d input", gelu_obj, &c, c.inp, dinp, c.n, 500, 1e-3f);
	/* the forward against the formula in double */
	kern_gelu_forward(c.out, c.inp, c.n);
	double worst = 0;
	for (size_t i = 0; i < c.n; i++) {
		double x = c.inp[i];
		double y = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
		worst = fmax(worst, fabs(y - c.out[i]));
	}
	ok(worst < 1e-6, "gelu matches the tanh formula: max error %.3g", worst);
	free(c.inp); free(c.w); free(c.out); free(dinp);
}

/* ---- head and cross-entropy ---------------------------------------------- */
typedef struct { float *logits, *losses, *x, *wte; int32_t *tg; int N, C, V; } ce_ctx;

static double ce_obj(void *p)
{
	ce_ctx *c = p;
	kern_head_forward(c->logits, c->x, c->wte, c->N, c->C, c->V);
	return kern_crossentropy_forward(c->losses, c->logits, c->tg, c->N, c->V);
}

static void test_crossentropy(void)
{
	ce_ctx c = { .N = 10, .C = 12, .V = 37 };
	c.x = randv((size_t)c.N * c.C, 1); c.wte = randv((size_t)c.V * c.C, 0.5);
	c.logits = zerov((size_t)c.N * c.V); c.losses = zerov(c.N);
	c.tg = malloc(sizeof(int32_t) * c.N);
	for (int i = 0; i < c.N; i++)
		c.tg[i] = (int32_t)(kern_rng_next(&rng) % c.V);
	double loss = ce_obj(&c);
	/* the loss against log-softmax in double */
	double want = 0;
	for (int n = 0; n < c.N; n++) {
		const float *l = c.logits + (size_t)n * c.V;
		double mx = l[0], s = 0;
		for (int j = 1; j < c.V; j++)
			mx = fmax(mx, l[j]);
		for (int j = 0; j < c.V; j++)
			s += exp(l[j] - mx);
		want += mx + log(s) - l[c.tg[n]];
	}
	want /= c.N;
	ok(fabs(loss - want) < 1e-5 * want, "cross-entropy %.7f matches double %.7f",
	   loss, want);
	float *dlog = zerov((size_t)c.N * c.V), *dx = zerov((size_t)c.N * c.C),
	      *dwte = zerov((size_t)c.V * c.C);
	kern_crossentropy_backward(dlog, c.logits, c.tg, 1.0f / c.N, c.N, c.V);
	kern_head_backward(dx, dwte, dlog, c.x, c.wte, c.N, c.C, c.V);
	check("head + cross-entropy d x", ce_obj, &c, c.x, dx, (size_t)c.N * c.C, 1000, 1e-2f);
	check("head + cross-entropy d wte", ce_obj, &c, c.wte, dwte, (size_t)c.V * c.C, 1000, 1e-2f);
	free(c.x); free(c.wte); free(c.logits); free(c.losses); free(c.tg);
	free(dlog); free(dx); free(dwte);
}

/* ---- the whole model ----------------------------------------------------- */
typedef struct { kern_model *m; int32_t *tok, *tg; int B; } model_ctx;

/* Mean cross-entropy from the float logits, in double: smoother than the
 * model's float loss for finite differences. */
static double model_obj(void *p)
{
	model_ctx *c = p;
	const kern_config *k = &c->m->config;
	if (kern_forward(c->m, c->tok, c->tg, c->B, NULL, NULL))
		bail_out("forward failed");
	const float *lg = kern_logits(c->m);
	int N = c->B * k->seq_len, V = k->vocab;
	double total = 0;
	for (int n = 0; n < N; n++) {
		const float *l = lg + (size_t)n * V;
		double mx = l[0], s = 0;
		for (int j = 1; j < V; j++)
			mx = fmax(mx, l[j]);
		for (int j = 0; j < V; j++)
			s += exp(l[j] - mx);
		total += mx + log(s) - l[c->tg[n]];
	}
	return total / N;
}

static void test_model(int L, int S, int T)
{
	kern_config cfg = { .n_layer = L, .n_shared = S, .n_head = 2, .d_model = 8,
	                    .seq_len = T, .vocab = 11, .d_ff = 12 };
	kern_model *m;
	cot_errbuf eb;
	int B = 2;
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 42);
	/* larger weights than the init's, so that every gradient is far from 0 */
	for (int v = 0; v < m->n_views; v++) {
		float *p = m->params + m->views[v].offset;
		for (size_t i = 0; i < m->views[v].numel; i++)
			p[i] += (float)((m->views[v].ndim == 1 ? 0.2 : 0.4) * kern_rng_normal(&rng));
	}
	model_ctx c = { m, malloc(sizeof(int32_t) * B * T), malloc(sizeof(int32_t) * B * T), B };
	for (int i = 0; i < B * T; i++) {
		c.tok[i] = (int32_t)(kern_rng_next(&rng) % cfg.vocab);
		c.tg[i] = (int32_t)(kern_rng_next(&rng) % cfg.vocab);
	}
	float loss;
	kern_zero_grad(m);
	if (kern_forward(m, c.tok, c.tg, B, &loss, &eb) || kern_backward(m, &eb))
		bail_out("model pass: %s", eb.msg);
	double dl = model_obj(&c);
	ok(fabs(loss - dl) < 1e-5 * dl, "model L%d S%d: float loss %.7f, double %.7f",
	   L, S, loss, dl);
	float *grads = malloc(m->n_params * sizeof(float));
	memcpy(grads, m->grads, m->n_params * sizeof(float));
	for (int v = 0; v < m->n_views; v++) {
		char what[128];
		snprintf(what, sizeof what, "model L%d S%d T%d d %s", L, S, T, m->views[v].name);
		check(what, model_obj, &c, m->params + m->views[v].offset,
		      grads + m->views[v].offset, m->views[v].numel, 12, 1e-2f);
	}
	free(grads);
	free(c.tok);
	free(c.tg);
	kern_model_free(m);
}

int main(void)
{
	plan_lazy();
	kern_rng_seed(&rng, 7);
	kern_set_threads(2);
	test_linear();
	test_embedding();
	test_layernorm();
	test_attention(2, 9, 8, 2, 1000);
	test_attention(1, 150, 8, 2, 400);  /* three row blocks of 64 */
	test_gelu();
	test_crossentropy();
	test_model(2, 2, 8);
	test_model(3, 1, 8);                /* ALBERT sharing: one set for 3 blocks */
	test_model(2, 1, 70);               /* attention over two row blocks */
	done_testing();
	return exit_status();
}
