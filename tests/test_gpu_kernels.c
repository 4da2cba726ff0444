/* The CUDA backend against the CPU backend, on a GPU (issue: GPU volunteers).
 *
 *   test_gpu_kernels [--quick | --probe]
 *
 * Each layer's forward and backward on the same random inputs: fp32 within
 * 1e-5 relative (max abs error over max abs value), bf16 (and tf32) within
 * 2e-2 with the gradient's cosine similarity >= 0.999; a whole model's loss
 * and gradient at the demo and sahaj shapes (GPT variants), every mode; ten
 * AdamW steps on the GPU against ten on the CPU from the same parameters,
 * loss curves within 1e-4 (fp32) / 1e-2 (tf32, bf16); the gradient kept on
 * the GPU across microbatches and sketched there (kern_gpu_keep_grads);
 * the encoders (ALBERT, BERT): the attention over every key, a whole
 * model's loss and gradient at a small shape of each (with absolute and
 * relative positions) and sahajBERT's, the counts a forward returns, and
 * ten LAMB steps; local mode's inner steps (AdamW, LAMB) on the GPU
 * against the same steps on the CPU from the same gradients: the same bits.
 * Every figure is printed (diag), so a run records the honest spread.
 *
 * Without a usable GPU (no backend built, no driver, no device: the CPU
 * machines of CI) it checks the CPU fallback instead: a bind refuses with a
 * clear message, the model stays on the CPU and still trains; the GPU checks
 * are skipped with that message as the reason.  --quick leaves out the
 * sahaj shape.  --probe tests nothing: it prints whether a GPU is usable
 * (or why not) and exits 0 when one is, for scripts that need one. */
#include "kernels/gpu.h"
#include "kernels/attention.h"
#include "kernels/attention_full.h"
#include "kernels/backend.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/local.h"
#include "kernels/matmul.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"
#include "kernels/stream_step.h"
#include "shared/common/sketch.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kern_rng rng;

static float *randn(size_t n, double sd)
{
	float *p = malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(sd * kern_rng_normal(&rng));
	return p;
}

static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

static float *copy(const float *a, size_t n)
{
	float *p = malloc(n * sizeof *p);
	memcpy(p, a, n * sizeof *p);
	return p;
}

static int32_t *ids(size_t n, int V)
{
	int32_t *p = malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = (int32_t)(kern_rng_next(&rng) % (uint64_t)V);
	return p;
}

/* max |a - b| / max |b|, and the cosine of a and b */
static double rel_err(const float *a, const float *b, size_t n, double *cosine)
{
	double num = 0, den = 0, ab = 0, aa = 0, bb = 0;
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]))
			bad = 1;
		double d = fabs((double)a[i] - b[i]);
		num = d > num ? d : num;
		den = fabs(b[i]) > den ? fabs(b[i]) : den;
		ab += (double)a[i] * b[i];
		aa += (double)a[i] * a[i];
		bb += (double)b[i] * b[i];
	}
	if (cosine)
		*cosine = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1 : 0);
	if (bad)
		return INFINITY;
	return den > 0 ? num / den : num;
}

/* one comparison line: fp32 by the relative error alone, bf16 also by the
 * cosine (a gradient) */
static void close_to(int prec, int is_grad, const float *gpu, const float *cpu, size_t n, const char *what)
{
	double cs, e = rel_err(gpu, cpu, n, &cs);
	if (prec == KERN_PREC_FP32)
		ok(e <= 1e-5, "%s fp32: relative error %.2e (limit 1e-5)", what, e);
	else if (is_grad)
		ok(e <= 2e-2 && cs >= 0.999,
		   "%s %s: relative error %.2e (limit 2e-2), cosine %.6f (limit 0.999)", what,
		   kern_precision_name(prec), e, cs);
	else
		ok(e <= 2e-2, "%s %s: relative error %.2e (limit 2e-2)", what, kern_precision_name(prec), e);
}

static const kern_gpu_api *api;

static void run_op(kern_gpu_op *o, const char *what)
{
	char err[256] = "";
	int rc = api->layer_op(o, err, sizeof err);
	if (rc)
		diag("%s: GPU error %d: %s", what, rc, err);
}

/* LayerNorm's forward and backward against the CPU's on x [N, C] (fp32) */
static void layernorm_test(int N, int C, const float *x, const char *tag)
{
	const int prec = KERN_PREC_FP32;
	char w1[96], w2[96], w3[96], w4[96], w5[96];
	kern_gpu_op o;
	snprintf(w1, sizeof w1, "layernorm forward%s", tag);
	snprintf(w2, sizeof w2, "layernorm rstd%s", tag);
	snprintf(w3, sizeof w3, "layernorm backward dx%s", tag);
	snprintf(w4, sizeof w4, "layernorm backward dw%s", tag);
	snprintf(w5, sizeof w5, "layernorm backward db%s", tag);
	float *lw = randn(C, 1), *lb = randn(C, 1), *lyc = zeros((size_t)N * C), *lyg = zeros((size_t)N * C);
	float *mc = zeros(N), *rc = zeros(N), *mg = zeros(N), *rg = zeros(N);
	kern_layernorm_forward(lyc, mc, rc, x, lw, lb, N, C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_LN_FWD,
		           .N = N,
		           .C = C,
		           .x = x,
		           .w = lw,
		           .b = lb,
		           .y = lyg,
		           .mean = mg,
		           .rstd = rg };
	run_op(&o, w1);
	close_to(prec, 0, lyg, lyc, (size_t)N * C, w1);
	close_to(prec, 0, rg, rc, N, w2);
	float *ldy = randn((size_t)N * C, 1), *ldxc = randn((size_t)N * C, 1), *ldwc = randn(C, 1),
	      *ldbc = randn(C, 1);
	float *ldxg = copy(ldxc, (size_t)N * C), *ldwg = copy(ldwc, C), *ldbg = copy(ldbc, C);
	kern_layernorm_backward(ldxc, ldwc, ldbc, ldy, x, lw, mc, rc, N, C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_LN_BWD,
		           .N = N,
		           .C = C,
		           .x = x,
		           .w = lw,
		           .dy = ldy,
		           .mean_in = mc,
		           .rstd_in = rc,
		           .dx = ldxg,
		           .dw = ldwg,
		           .db = ldbg };
	run_op(&o, w3);
	close_to(prec, 1, ldxg, ldxc, (size_t)N * C, w3);
	close_to(prec, 1, ldwg, ldwc, C, w4);
	close_to(prec, 1, ldbg, ldbc, C, w5);
	free(lw), free(lb), free(lyc), free(lyg), free(mc), free(rc), free(mg), free(rg), free(ldy),
	        free(ldxc), free(ldwc), free(ldbc), free(ldxg), free(ldwg), free(ldbg);
}

static void layer_tests(int prec)
{
	const int B = 2, T = 64, C = 96, NH = 4, F = 384, V = 200, N = B * T;
	const char *pn = kern_precision_name(prec);
	char what[96];
	kern_gpu_op o;

	/* linear: forward, and its three gradients */
	float *x = randn((size_t)N * C, 1), *w = randn((size_t)C * F, 0.1), *b = randn(F, 0.1);
	float *yc = zeros((size_t)N * F), *yg = zeros((size_t)N * F);
	kern_linear_forward(yc, x, w, b, N, C, F);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_LINEAR_FWD,
		           .precision = prec,
		           .N = N,
		           .I = C,
		           .O = F,
		           .x = x,
		           .w = w,
		           .b = b,
		           .y = yg };
	run_op(&o, "linear forward");
	close_to(prec, 0, yg, yc, (size_t)N * F, "linear forward");
	float *dy = randn((size_t)N * F, 1), *dxc = zeros((size_t)N * C), *dxg = zeros((size_t)N * C);
	float *dwc = randn((size_t)C * F, 0.1), *dbc = randn(F, 0.1);
	float *dwg = copy(dwc, (size_t)C * F), *dbg = copy(dbc, F);
	kern_linear_backward_set(dxc, dwc, dbc, dy, x, w, N, C, F);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_LINEAR_BWD,
		           .precision = prec,
		           .N = N,
		           .I = C,
		           .O = F,
		           .x = x,
		           .w = w,
		           .dy = dy,
		           .dx = dxg,
		           .dw = dwg,
		           .db = dbg };
	run_op(&o, "linear backward");
	close_to(prec, 1, dxg, dxc, (size_t)N * C, "linear backward dx");
	close_to(prec, 1, dwg, dwc, (size_t)C * F, "linear backward dW");
	close_to(prec, 1, dbg, dbc, F, "linear backward db");
	free(yc), free(yg), free(dy), free(dxc), free(dxg), free(dwc), free(dbc), free(dwg), free(dbg),
	        free(w), free(b);

	/* attention on qkv [B, T, 3C] */
	float *qkv = randn((size_t)N * 3 * C, 1);
	size_t natt = (size_t)B * NH * T * T;
	float *ac = zeros(natt), *ag = zeros(natt), *oc = zeros((size_t)N * C), *og = zeros((size_t)N * C);
	kern_attention_forward(oc, ac, qkv, B, T, C, NH);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_ATTN_FWD,
		           .precision = prec,
		           .B = B,
		           .T = T,
		           .C = C,
		           .NH = NH,
		           .x = qkv,
		           .y = og,
		           .att = ag };
	run_op(&o, "attention forward");
	close_to(prec, 0, og, oc, (size_t)N * C, "attention forward");
	close_to(prec, 0, ag, ac, natt, "attention probabilities");
	float *ady = randn((size_t)N * C, 1), *dqc = zeros((size_t)N * 3 * C),
	      *dqg = zeros((size_t)N * 3 * C), *datt = zeros(natt);
	kern_attention_backward_set(dqc, datt, ady, qkv, ac, B, T, C, NH);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_ATTN_BWD,
		           .precision = prec,
		           .B = B,
		           .T = T,
		           .C = C,
		           .NH = NH,
		           .x = qkv,
		           .dy = ady,
		           .att_in = ac,
		           .dx = dqg };
	run_op(&o, "attention backward");
	close_to(prec, 1, dqg, dqc, (size_t)N * 3 * C, "attention backward dqkv");
	free(qkv), free(ac), free(ag), free(oc), free(og), free(ady), free(dqc), free(dqg), free(datt);
	if (prec != KERN_PREC_FP32) {
		free(x);
		return;
	}

	/* the layers without products: fp32 in every mode */
	layernorm_test(N, C, x, "");
	float *xw = randn((size_t)N * 768, 1);
	layernorm_test(N, 768, xw, " (C 768, rows in registers)");
	free(xw);

	float *gc = zeros((size_t)N * C), *gg = zeros((size_t)N * C), *gdy = randn((size_t)N * C, 1);
	kern_gelu_forward(gc, x, (size_t)N * C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_GELU_FWD, .N = N, .C = C, .x = x, .y = gg };
	run_op(&o, "gelu forward");
	close_to(prec, 0, gg, gc, (size_t)N * C, "gelu forward");
	kern_gelu_backward_set(gc, x, gdy, (size_t)N * C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_GELU_BWD, .N = N, .C = C, .x = x, .dy = gdy, .dx = gg };
	run_op(&o, "gelu backward");
	close_to(prec, 1, gg, gc, (size_t)N * C, "gelu backward");
	free(gc), free(gg), free(gdy);

	float *logits = randn((size_t)N * V, 2), *lc = zeros(N), *lg = zeros(N);
	int32_t *tg = ids(N, V);
	kern_crossentropy_forward(lc, logits, tg, N, V);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_CE_FWD, .N = N, .V = V, .x = logits, .ids = tg, .y = lg };
	run_op(&o, "cross-entropy forward");
	close_to(prec, 0, lg, lc, N, "cross-entropy forward");
	float *dlc = zeros((size_t)N * V), *dlg = zeros((size_t)N * V);
	kern_crossentropy_backward_set(dlc, logits, tg, 0.37f, N, V);
	o = (kern_gpu_op){
		.op = KERN_GPU_OP_CE_BWD, .N = N, .V = V, .x = logits, .ids = tg, .scale = 0.37f, .dx = dlg
	};
	run_op(&o, "cross-entropy backward");
	close_to(prec, 1, dlg, dlc, (size_t)N * V, "cross-entropy backward");
	free(logits), free(lc), free(lg), free(tg), free(dlc), free(dlg);

	float *wte = randn((size_t)V * C, 1), *wpe = randn((size_t)T * C, 1), *ec = zeros((size_t)N * C),
	      *eg = zeros((size_t)N * C);
	int32_t *tok = ids(N, V / 4); /* repeats, for the gradient's sums */
	kern_embedding_forward(ec, tok, wte, wpe, B, T, C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_EMB_FWD,
		           .B = B,
		           .T = T,
		           .C = C,
		           .V = V,
		           .ids = tok,
		           .w = wte,
		           .b = wpe,
		           .y = eg };
	run_op(&o, "embedding forward");
	close_to(prec, 0, eg, ec, (size_t)N * C, "embedding forward");
	float *edy = randn((size_t)N * C, 1), *dtec = randn((size_t)V * C, 1),
	      *dpec = randn((size_t)T * C, 1);
	float *dteg = copy(dtec, (size_t)V * C), *dpeg = copy(dpec, (size_t)T * C);
	kern_embedding_backward(dtec, dpec, edy, tok, B, T, C);
	o = (kern_gpu_op){ .op = KERN_GPU_OP_EMB_BWD,
		           .B = B,
		           .T = T,
		           .C = C,
		           .V = V,
		           .ids = tok,
		           .dy = edy,
		           .dw = dteg,
		           .db = dpeg };
	run_op(&o, "embedding backward");
	close_to(prec, 1, dteg, dtec, (size_t)V * C, "embedding backward dwte");
	close_to(prec, 1, dpeg, dpec, (size_t)T * C, "embedding backward dwpe");
	free(wte), free(wpe), free(ec), free(eg), free(tok), free(edy), free(dtec), free(dpec), free(dteg),
	        free(dpeg), free(x);
	(void)pn;
	(void)what;
}

/* The fused attention (kernels/cuda/cuda_flash.h) against the CPU's, at a
 * small shape and GPT-2 small's heads (12 of 64, T 1024); the GPU's
 * materialised path at the same shape agrees as well, and a shape the
 * fused kernels do not take is refused. */
static void flash_tests(void)
{
	const int shapes[][4] = { { 2, 256, 128, 2 }, { 1, 1024, 768, 12 } };
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		int B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], NH = shapes[si][3], N = B * T;
		char what[96];
		float *qkv = randn((size_t)N * 3 * C, 1);
		size_t natt = (size_t)B * NH * T * T;
		float *ac = zeros(natt), *oc = zeros((size_t)N * C), *og = zeros((size_t)N * C);
		kern_attention_forward(oc, ac, qkv, B, T, C, NH);
		kern_gpu_op o = { .op = KERN_GPU_OP_FLASH_FWD,
			          .precision = KERN_PREC_BF16,
			          .B = B,
			          .T = T,
			          .C = C,
			          .NH = NH,
			          .x = qkv,
			          .y = og };
		snprintf(what, sizeof what, "fused attention forward (B %d, T %d, %d heads)", B, T, NH);
		run_op(&o, what);
		close_to(KERN_PREC_BF16, 0, og, oc, (size_t)N * C, what);
		float *ady = randn((size_t)N * C, 1), *dqc = zeros((size_t)N * 3 * C),
		      *dqg = zeros((size_t)N * 3 * C), *datt = zeros(natt);
		kern_attention_backward_set(dqc, datt, ady, qkv, ac, B, T, C, NH);
		o.op = KERN_GPU_OP_FLASH_BWD;
		o.dy = ady;
		o.dx = dqg;
		snprintf(what, sizeof what, "fused attention backward dqkv (B %d, T %d, %d heads)", B, T, NH);
		run_op(&o, what);
		close_to(KERN_PREC_BF16, 1, dqg, dqc, (size_t)N * 3 * C, what);
		free(qkv), free(ac), free(oc), free(og), free(ady), free(dqc), free(dqg), free(datt);
	}
	float x[1] = { 0 };
	kern_gpu_op bad = { .op = KERN_GPU_OP_FLASH_FWD,
		            .precision = KERN_PREC_BF16,
		            .B = 1,
		            .T = 192,
		            .C = 128,
		            .NH = 2,
		            .x = x,
		            .y = x };
	char err[256] = "";
	int rc = api->layer_op(&bad, err, sizeof err);
	ok(rc == KERN_GPU_EINVAL, "the fused attention refuses T 192: %s", err);
}

static void shape(const char *name, kern_config *c, int *B)
{
	kern_config_default(c);
	*B = 4;
	if (strcmp(name, "sahaj") == 0) { /* sahajBERT's sizes on the GPT: 24 layers, one shared set */
		c->n_layer = 24;
		c->n_shared = 1;
		c->n_head = 16;
		c->d_model = 1024;
		c->d_ff = 4096;
		c->seq_len = 512;
		c->vocab = 32000;
		*B = 2;
	}
}

/* One microbatch of model c (batches of B) from the same parameters on each
 * backend, the GPU's in prec: its loss and gradient (two checks), and each
 * view's figures for the first `head` views, the last `tail` and any past
 * the limit. */
static void backends_test(const char *what, const kern_config *c, int B, int prec, int head, int tail)
{
	const char *pn = kern_precision_name(prec);
	cot_errbuf eb = { "", "" };
	kern_model *cpu, *gpu;
	if (kern_model_create(c, B, &cpu, &eb) || kern_model_create(c, B, &gpu, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(cpu, 7);
	kern_model_init(gpu, 7);
	int32_t *tok = ids((size_t)B * c->seq_len + 1, c->vocab);
	float lc = 0, lg = 0;
	kern_zero_grad(cpu);
	kern_zero_grad(gpu);
	/* (the seed and the microbatch pick an encoder's masks; a GPT ignores them) */
	cot_err rc = kern_stream_step(cpu, tok, tok + 1, B, 5, 3, 100, (float)B, &lc, &eb);
	if (!rc)
		rc = kern_gpu_bind(gpu, 0, prec, &eb);
	if (!rc)
		rc = kern_stream_step(gpu, tok, tok + 1, B, 5, 3, 100, (float)B, &lg, &eb);
	if (rc) {
		ok(0, "%s %s: %s", what, pn, eb.msg);
		ok(0, "%s %s: no gradient", what, pn);
	} else {
		double lim = prec == KERN_PREC_FP32 ? 1e-5 : 2e-2, dl = fabs((double)lg - lc) / fabs(lc);
		ok(dl <= lim, "%s %s: loss %.6f on the GPU, %.6f on the CPU (relative %.2e, limit %.0e)",
		   what, pn, lg, lc, dl, lim);
		double cs, e = rel_err(gpu->grads, cpu->grads, cpu->n_params, &cs);
		/* the whole gradient: the layers' limits compound over the depth */
		double elim = prec == KERN_PREC_FP32 ? 1e-4 : 5e-2,
		       clim = prec == KERN_PREC_FP32 ? 0.99999 : 0.999;
		ok(e <= elim && cs >= clim,
		   "%s %s: gradient relative error %.2e (limit %.0e), cosine %.7f (limit %g)", what, pn, e,
		   elim, cs, clim);
		for (int i = 0; i < cpu->n_views; i++) {
			const kern_view *v = &cpu->views[i];
			double vc,
			        ve = rel_err(gpu->grads + v->offset, cpu->grads + v->offset, v->numel, &vc);
			if (i < head || i >= cpu->n_views - tail || ve > elim)
				diag("  %-26s relative %.2e cosine %.7f", v->name, ve, vc);
		}
	}
	free(tok);
	kern_model_free(cpu);
	kern_model_free(gpu);
}

/* A whole GPT's loss and gradient on both backends. */
static void model_test(const char *name, int prec)
{
	kern_config c;
	int B;
	shape(name, &c, &B);
	char what[96];
	snprintf(what, sizeof what, "%s model", name);
	backends_test(what, &c, B, prec, 4, 2);
}

/* The gradient kept on the GPU (kern_gpu_keep_grads) over three
 * microbatches: its sketch computed there is sketch_add's of the same
 * vector brought home, to double rounding, at every k the client uses and
 * the same bits twice; brought home it is the gradient copied down after
 * each microbatch, to fp32 rounding (the sums associate differently). */
static void kept_test(int prec)
{
	kern_config c;
	int B;
	shape("demo", &c, &B);
	cot_errbuf eb = { "", "" };
	kern_model *each, *kept;
	if (kern_model_create(&c, B, &each, &eb) || kern_model_create(&c, B, &kept, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(each, 9);
	kern_model_init(kept, 9);
	size_t BT = (size_t)B * c.seq_len, n = kept->n_params;
	int32_t *tok = ids(3 * BT + 1, c.vocab);
	const char *pn = kern_precision_name(prec);
	cot_err rc = kern_gpu_bind(each, 0, prec, &eb);
	if (!rc)
		rc = kern_gpu_bind(kept, 0, prec, &eb);
	if (!rc)
		rc = kern_gpu_keep_grads(kept, true, &eb);
	for (int i = 0; !rc && i < 3; i++) {
		float l;
		rc = kern_stream_step(each, tok + i * BT, tok + i * BT + 1, B, 1, 0, 1, (float)B, &l, &eb);
		if (!rc)
			rc = kern_stream_step(kept, tok + i * BT, tok + i * BT + 1, B, 1, 0, 1, (float)B, &l,
			                      &eb);
	}
	bool zero = true;
	for (size_t i = 0; i < n; i++)
		zero = zero && kept->grads[i] == 0;
	ok(!rc && kern_gpu_holds_grads(kept) && zero,
	   "kept %s: three microbatches' gradient is held on the GPU, none on the host (%zu values, %zu "
	   "past the last whole block of 64)%s%s",
	   pn, n, n % 64, rc ? ": " : "", eb.msg);
	enum { NK = 3 };
	static const int ks[NK] = { 16, 100, 256 };
	static double gpu[NK][256], again[256];
	bool same = true;
	for (int t = 0; !rc && t < NK; t++) {
		rc = kern_gpu_sketch_held(kept, 1234567 + (uint64_t)t, ks[t], gpu[t], &eb);
		if (!rc)
			rc = kern_gpu_sketch_held(kept, 1234567 + (uint64_t)t, ks[t], again, &eb);
		same = same && !rc && memcmp(gpu[t], again, (size_t)ks[t] * sizeof *again) == 0;
	}
	if (!rc)
		rc = kern_gpu_grads_home(kept, &eb);
	double worst = 0;
	for (int t = 0; !rc && t < NK; t++) {
		double cpu[256] = { 0 };
		sketch_add(kept->grads, n, 0, 1234567 + (uint64_t)t, ks[t], cpu);
		double d = sketch_distance(gpu[t], cpu, ks[t]);
		worst = d > worst ? d : worst;
	}
	ok(!rc && worst <= 1e-12 && same,
	   "kept %s: the GPU's sketch of the held gradient is sketch_add's of it brought home (k 16, 100, "
	   "256: distance %.2e, limit 1e-12), the same bits twice%s%s",
	   pn, worst, rc ? ": " : "", eb.msg);
	double cs, e = rc ? 1 : rel_err(kept->grads, each->grads, n, &cs);
	ok(!rc && !kern_gpu_holds_grads(kept) && e <= 1e-5,
	   "kept %s: brought home, it is the gradient copied down after each microbatch (relative %.2e, "
	   "limit 1e-5)%s%s",
	   pn, e, rc ? ": " : "", eb.msg);
	free(tok);
	kern_model_free(each);
	kern_model_free(kept);
}

/* Ten optimizer steps (kind, learning rate lr) of model c from the same
 * parameters on each backend, on a small alphabet so that the loss falls:
 * the loss curves within 1e-4 (fp32) or 1e-2. */
static void steps_test(const char *what, const kern_config *c, int B, int kind, float lr, int prec)
{
	cot_errbuf eb = { "", "" };
	kern_model *cpu, *gpu;
	if (kern_model_create(c, B, &cpu, &eb) || kern_model_create(c, B, &gpu, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(cpu, 11);
	kern_model_init(gpu, 11);
	kern_opt_config oc;
	kern_opt_default(&oc, kind);
	oc.lr = lr;
	const char *on = kind == KERN_OPT_LAMB ? "LAMB" : "AdamW", *pn = kern_precision_name(prec);
	double worst = 0;
	char curve[512] = "";
	cot_err rc = kern_gpu_bind(gpu, 0, prec, &eb);
	size_t BT = (size_t)B * c->seq_len;
	for (int s = 0; !rc && s < 10; s++) {
		int32_t *tok = ids(BT + 1, 64);
		float lc = 0, lg = 0;
		kern_zero_grad(cpu);
		kern_zero_grad(gpu);
		rc = kern_stream_step(cpu, tok, tok + 1, B, 1, s, 1000, 1.0f, &lc, &eb);
		if (!rc)
			rc = kern_stream_step(gpu, tok, tok + 1, B, 1, s, 1000, 1.0f, &lg, &eb);
		if (!rc)
			rc = kern_opt_step(cpu, &oc, NULL, &eb);
		if (!rc)
			rc = kern_opt_step(gpu, &oc, NULL, &eb);
		double d = fabs((double)lg - lc);
		worst = d > worst ? d : worst;
		size_t len = strlen(curve);
		snprintf(curve + len, sizeof curve - len, " %.4f/%.4f", lg, lc);
		free(tok);
	}
	double lim = prec == KERN_PREC_FP32 ? 1e-4 : 1e-2;
	if (rc)
		ok(0, "%s: ten %s steps %s: %s", what, on, pn, eb.msg);
	else
		ok(worst <= lim, "%s: ten %s steps %s: loss curves within %.2e (limit %.0e)", what, on, pn,
		   worst, lim);
	diag("  GPU/CPU losses:%s", curve);
	kern_model_free(cpu);
	kern_model_free(gpu);
}

/* Positions where a and b differ in bits, of n. */
static size_t mismatches(const float *a, const float *b, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += memcmp(&a[i], &b[i], sizeof *a) != 0;
	return k;
}

/* Local mode's inner steps (kernels/local.h) of optimizer kind on the GPU
 * against the CPU's, two microbatches an inner batch of 3 samples each, on
 * the same random gradients (put on the GPU with kern_gpu_grads_add, some
 * large enough that the clip acts): steps 1-3 on the GPU (the moments
 * zeroed there, then kept); the state brought home with a microbatch
 * pending (kern_local_home); step 4 on the CPU (part of its gradient came
 * home); step 5 on the GPU again (the moments copied up); step 6 flushed
 * by kern_local_finish.  The parameters after step 3 and the round's
 * contribution must be the CPU's bits. */
static void inner_steps_test(int kind)
{
	kern_config c;
	int B;
	shape("demo", &c, &B);
	cot_errbuf eb = { "", "" };
	kern_model *gm, *cm;
	if (kern_model_create(&c, B, &gm, &eb) || kern_model_create(&c, B, &cm, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(gm, 21);
	kern_model_init(cm, 21);
	size_t n = gm->n_params;
	float *theta = copy(gm->params, n);
	kern_opt_config oc;
	kern_opt_default(&oc, kind);
	oc.lr = 1e-2f;
	const char *on = kind == KERN_OPT_LAMB ? "LAMB" : "AdamW";
	kern_local *gl, *cl;
	if (kern_local_new(gm, &oc, 2, &gl, &eb) || kern_local_new(cm, &oc, 2, &cl, &eb))
		bail_out("local: %s", eb.msg);
	cot_err rc = kern_gpu_bind(gm, 0, KERN_PREC_FP32, &eb);
	if (!rc)
		rc = kern_gpu_keep_grads(gm, true, &eb);
	kern_local_begin(gl, gm);
	kern_local_begin(cl, cm);
	size_t after3 = n, host_moved = n;
	double e3 = INFINITY;
	for (int mb = 1; !rc && mb <= 11; mb++) {
		/* microbatches 3 and 4 (step 2), 9 and 10 (step 5) large: clipped */
		double sd = mb == 3 || mb == 4 || mb == 9 || mb == 10 ? 0.5 : 1e-4;
		float *G = randn(n, sd);
		rc = kern_gpu_grads_add(gm, G, &eb);
		for (size_t i = 0; i < n; i++)
			cm->grads[i] += G[i];
		free(G);
		if (!rc)
			rc = kern_local_microbatch(gl, gm, 3, &eb);
		if (!rc)
			rc = kern_local_microbatch(cl, cm, 3, &eb);
		if (!rc && mb == 7) {
			host_moved = mismatches(gm->params, theta, n);
			rc = kern_local_home(gl, gm, &eb);
			after3 = mismatches(gm->params, cm->params, n);
			e3 = rel_err(gm->params, cm->params, n, NULL);
		}
	}
	ok(!rc && host_moved == 0 && after3 == 0 && kern_local_steps(gl) == 5,
	   "%s inner steps on the GPU: after 3 steps there (the host's copy untouched: %zu values "
	   "moved), brought home, the parameters are the CPU's bits (%zu of %zu differ, relative %.2e)%s%s",
	   on, host_moved, after3, n, e3, rc ? ": " : "", eb.msg);
	int64_t sg = 0, sc = 0;
	if (!rc)
		rc = kern_local_finish(gl, gm, &sg, &eb);
	if (!rc)
		rc = kern_local_finish(cl, cm, &sc, &eb);
	size_t dc = rc ? n : mismatches(gm->grads, cm->grads, n),
	       dp = rc ? n : mismatches(gm->params, theta, n);
	double ec = rc ? INFINITY : rel_err(gm->grads, cm->grads, n, NULL);
	ok(!rc && dc == 0 && dp == 0 && sg == 33 && sc == 33,
	   "%s inner steps: after a CPU step, a GPU step from moments copied up and the flush, the "
	   "round's contribution is the CPU's bits (%zu of %zu differ, relative %.2e), theta_v restored "
	   "(%zu differ), 33 samples%s%s",
	   on, dc, n, ec, dp, rc ? ": " : "", eb.msg);
	free(theta);
	kern_local_free(gl);
	kern_local_free(cl);
	kern_model_free(gm);
	kern_model_free(cm);
}

static void training_test(int prec)
{
	kern_config c;
	int B;
	shape("demo", &c, &B);
	steps_test("demo", &c, B, KERN_OPT_ADAMW, 1e-3f, prec);
}

/* The encoders' attention, over every key: the materialised path in prec,
 * and in bf16 the fused one, against kernels/attention_full.c. */
static void full_attention_tests(int prec)
{
	int B = 2, T = 128, C = 128, NH = 2, N = B * T;
	size_t natt = (size_t)B * NH * T * T;
	const char *pn = kern_precision_name(prec);
	char what[96];
	float *qkv = randn((size_t)N * 3 * C, 1), *ac = zeros(natt), *ag = zeros(natt),
	      *oc = zeros((size_t)N * C), *og = zeros((size_t)N * C), *ady = randn((size_t)N * C, 1),
	      *dqc = zeros((size_t)N * 3 * C), *dqg = zeros((size_t)N * 3 * C), *datt = zeros(natt);
	kern_attention_full_forward(oc, ac, qkv, NULL, B, T, C, NH);
	kern_attention_full_backward_set(dqc, datt, ady, qkv, ac, B, T, C, NH);
	for (int fused = 0; fused <= (prec == KERN_PREC_BF16); fused++) {
		const char *kind = fused ? "fused" : "materialised";
		kern_gpu_op o = { .op = fused ? KERN_GPU_OP_FLASH_FWD : KERN_GPU_OP_ATTN_FWD,
			          .precision = prec,
			          .B = B,
			          .T = T,
			          .C = C,
			          .NH = NH,
			          .full = 1,
			          .x = qkv,
			          .y = og,
			          .att = ag };
		snprintf(what, sizeof what, "attention over every key, %s, forward", kind);
		run_op(&o, what);
		close_to(prec, 0, og, oc, (size_t)N * C, what);
		o.op = fused ? KERN_GPU_OP_FLASH_BWD : KERN_GPU_OP_ATTN_BWD;
		o.dy = ady;
		o.dx = dqg;
		snprintf(what, sizeof what, "attention over every key, %s, backward dqkv", kind);
		run_op(&o, what);
		close_to(prec, 1, dqg, dqc, (size_t)N * 3 * C, what);
	}
	free(qkv), free(ac), free(ag), free(oc), free(og), free(ady), free(dqc), free(dqg), free(datt);
	(void)pn;
}

/* An encoder's config: "albert" (shared layers, factorised embedding, a
 * vocabulary not a multiple of 64), "bert" (its own sets, erf GELU),
 * "albert-rel" and "bert-relkq" (relative positions: relative_key and
 * relative_key_query, the attention materialised with its distance terms),
 * or "sahajbert" (24 layers sharing one set, d 1024, E 128, T 512, V
 * 32000). */
static void enc_shape(const char *name, kern_config *c, int *B)
{
	kern_config d = { .n_layer = 4,
		          .n_shared = 1,
		          .n_head = 4,
		          .d_model = 256,
		          .seq_len = 128,
		          .vocab = 2000,
		          .d_ff = 1024,
		          .arch = KERN_ARCH_ALBERT,
		          .d_embed = 128,
		          .type_vocab = 2,
		          .cls_id = 2,
		          .sep_id = 3,
		          .mask_id = 4,
		          .pad_id = 0,
		          .unk_id = 1 };
	*c = d;
	*B = 4;
	if (strncmp(name, "bert", 4) == 0) {
		c->arch = KERN_ARCH_BERT;
		c->n_layer = c->n_shared = 2;
		c->d_embed = c->d_model;
		c->vocab = 3000;
	} else if (strcmp(name, "sahajbert") == 0) {
		c->n_layer = 24;
		c->n_head = 16;
		c->d_model = 1024;
		c->d_ff = 4096;
		c->seq_len = 512;
		c->vocab = 32000;
		*B = 2;
	}
	if (strcmp(name, "albert-rel") == 0)
		c->position = KERN_POS_RELATIVE_KEY;
	if (strcmp(name, "bert-relkq") == 0)
		c->position = KERN_POS_RELATIVE_KEY_QUERY;
}

/* An encoder's MLM + SOP loss and gradient on both backends. */
static void enc_model_test(const char *name, int prec)
{
	kern_config c;
	int B;
	enc_shape(name, &c, &B);
	char what[96];
	snprintf(what, sizeof what, "%s encoder", name);
	backends_test(what, &c, B, prec, 3, 9);
}

/* The same batch's counts on both backends (kern_gpu_enc_step's result). */
static void enc_result_test(void)
{
	kern_config c;
	int B;
	enc_shape("albert", &c, &B);
	cot_errbuf eb = { "", "" };
	kern_model *cpu, *gpu;
	if (kern_model_create(&c, B, &cpu, &eb) || kern_model_create(&c, B, &gpu, &eb))
		bail_out("encoder model: %s", eb.msg);
	kern_model_init(cpu, 8);
	kern_model_init(gpu, 8);
	int32_t *raw = ids((size_t)B * c.seq_len, 40); /* few ids: some predictions right */
	kern_enc_batch batch;
	kern_enc_result rc_ = { 0 }, rg = { 0 };
	cot_err rc = kern_enc_stream_batch(cpu, raw, (size_t)c.seq_len, B, 9, 0, 1, &batch, &eb);
	if (!rc)
		rc = kern_enc_forward(cpu, &batch, B, &rc_, &eb);
	if (!rc)
		rc = kern_gpu_bind(gpu, 0, KERN_PREC_FP32, &eb);
	if (!rc)
		rc = kern_gpu_enc_step(gpu, &batch, B, 1.0f, &rg, &eb);
	ok(!rc && rg.n_predicted == rc_.n_predicted && abs(rg.mlm_correct - rc_.mlm_correct) <= 1 &&
	           rg.sop_correct == rc_.sop_correct && fabs(rg.sop_loss - rc_.sop_loss) <= 1e-4 &&
	           fabs(rg.mlm_loss - rc_.mlm_loss) <= 1e-4 * rc_.mlm_loss,
	   "albert encoder fp32: the GPU's counts are the CPU's (predicted %d/%d, MLM right %d/%d, SOP right "
	   "%d/%d; MLM loss %.6f/%.6f, SOP loss %.6f/%.6f)%s%s",
	   rg.n_predicted, rc_.n_predicted, rg.mlm_correct, rc_.mlm_correct, rg.sop_correct, rc_.sop_correct,
	   rg.mlm_loss, rc_.mlm_loss, rg.sop_loss, rc_.sop_loss, rc ? ": " : "", eb.msg);
	free(raw);
	kern_model_free(cpu);
	kern_model_free(gpu);
}

static void enc_training_test(int prec)
{
	kern_config c;
	int B;
	enc_shape("albert", &c, &B);
	steps_test("albert", &c, B, KERN_OPT_LAMB, 2e-3f, prec);
}

/* Without a GPU: the bind refuses clearly and the model trains on the CPU. */
static void fallback_test(const char *why)
{
	kern_config c;
	int B;
	shape("demo", &c, &B);
	c.n_layer = c.n_shared = 1;
	c.seq_len = 16;
	cot_errbuf eb = { "", "" };
	kern_model *m;
	if (kern_model_create(&c, B, &m, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(m, 3);
	cot_err rc = kern_gpu_bind(m, 0, KERN_PREC_BF16, &eb);
	is_int(rc, COT_ERR_UNSUPPORTED, "without a GPU the bind is refused as unsupported: %s", eb.msg);
	ok(strstr(eb.msg, why) != NULL, "the refusal says why (\"%s\")", why);
	ok(!kern_gpu_bound(m), "the model stays on the CPU");
	int32_t *tok = ids((size_t)B * c.seq_len + 1, c.vocab);
	float l = 0;
	rc = kern_stream_step(m, tok, tok + 1, B, 1, 0, 1, 1.0f, &l, &eb);
	ok(rc == COT_OK && isfinite(l) && l > 0, "and computes its microbatch on the CPU (loss %.4f)", l);
	free(tok);
	kern_model_free(m);
}

int main(int argc, char **argv)
{
	int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
	int probe = argc > 1 && strcmp(argv[1], "--probe") == 0;
	kern_rng_seed(&rng, 20261126);
	/* the build tree's backend (tests/tests.am), unless one is named */
	const char *lib = getenv("COTRAIN_TEST_CUDA_LIB");
	if (lib && !getenv(KERN_GPU_LIB_ENV))
		setenv(KERN_GPU_LIB_ENV, lib, 1);
	plan_lazy();
	char why[256] = "";
	api = kern_gpu_api_get(why, sizeof why);
	int n = kern_gpu_count(why, sizeof why);
	if (probe) { /* for the scripts: a usable GPU or why not, no test */
		printf("%s\n", api && n > 0 ? "a GPU is usable" : why);
		return api && n > 0 ? 0 : 1;
	}
	if (!api || n <= 0) {
		diag("no GPU: %s", why);
		fallback_test(why);
		skip(1, why);
		done_testing();
		return exit_status();
	}
	kern_gpu_info info;
	char err[256] = "";
	if (api->device_info(0, &info, err, sizeof err) == 0)
		diag("GPU 0: %s, compute capability %d.%d, %d multiprocessors, %.1f GiB; %s", info.name,
		     info.cc_major, info.cc_minor, info.multiprocessors, info.mem_total / 1073741824.0,
		     api->describe());
	for (int prec = KERN_PREC_FP32; prec <= KERN_PREC_BF16; prec++)
		layer_tests(prec);
	flash_tests();
	for (int prec = KERN_PREC_FP32; prec <= KERN_PREC_BF16; prec++) {
		model_test("demo", prec);
		if (!quick)
			model_test("sahaj", prec);
	}
	/* bf16's other attention path (the demo's shape takes the fused one) */
	setenv("COTRAIN_CUDA_ATTENTION", "materialized", 1);
	model_test("demo (attention materialised)", KERN_PREC_BF16);
	unsetenv("COTRAIN_CUDA_ATTENTION");
	for (int prec = KERN_PREC_FP32; prec <= KERN_PREC_BF16; prec++)
		training_test(prec);
	kept_test(KERN_PREC_FP32);
	kept_test(KERN_PREC_BF16);
	inner_steps_test(KERN_OPT_ADAMW);
	inner_steps_test(KERN_OPT_LAMB);
	/* the encoders */
	for (int prec = KERN_PREC_FP32; prec <= KERN_PREC_BF16; prec++) {
		full_attention_tests(prec);
		enc_model_test("albert", prec);
		enc_model_test("bert", prec);
		enc_model_test("albert-rel", prec);
		enc_model_test("bert-relkq", prec);
		if (!quick)
			enc_model_test("sahajbert", prec);
	}
	setenv("COTRAIN_CUDA_ATTENTION", "materialized", 1);
	enc_model_test("albert (attention materialised)", KERN_PREC_BF16);
	unsetenv("COTRAIN_CUDA_ATTENTION");
	enc_result_test();
	enc_training_test(KERN_PREC_FP32);
	enc_training_test(KERN_PREC_BF16);
	done_testing();
	return exit_status();
}
