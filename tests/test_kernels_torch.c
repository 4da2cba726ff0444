/* The model against PyTorch: tests/data/torch_reference.bin, written by
 * tests/gen_torch_reference.py, holds PyTorch's logits, loss and gradients
 * for two tiny models (one with cross-layer sharing) on given weights and a
 * given batch, and the parameters after 3 AdamW and 3 LAMB steps;
 * tests/data/torch_reference_tiled.bin (gen_torch_reference.py --tiled)
 * holds the same for a model whose attention spans more than one row block
 * and whose MLP and head products are large enough for the backend to hand
 * them to its GEMM driver or cut them into OpenBLAS tiles.  That case runs
 * once on each GEMM kernel this CPU has (kernels/gemm.h), OpenBLAS tiles
 * included.
 *
 * Tolerances: the loss within 1e-5 relative; logits, every gradient and
 * every parameter within 1e-4 relative, measured per tensor as
 * max |ours - torch| / max |torch|.  The optimizer steps are fed PyTorch's
 * gradient (the steps are checked, not the gradient twice: Adam's first
 * steps amplify float noise in near-zero gradients), and their updates
 * (params after - params before) must also agree within 1e-3 relative, so
 * that a step that did nothing could not pass on the parameters alone. */
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "tests/ref_file.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Products of at least this many multiply-adds go to the GEMM driver or
 * to OpenBLAS tiles (kernels/backend_cpu.c). */
#define TILED_MIN_MACS 1e6

static void load_params(kern_model *m, const char *tag, const char *kind)
{
	for (int v = 0; v < m->n_views; v++) {
		char what[128];
		snprintf(what, sizeof what, "%s.%s", kind, m->views[v].name);
		const ref_record *r = ref_get(tag, what, 0);
		if (r->n != m->views[v].numel)
			bail_out("%s.%s has %zu values, the model %zu", tag, what, r->n, m->views[v].numel);
		memcpy(m->params + m->views[v].offset, r->data, r->n * sizeof(float));
	}
}

static void opt_from(kern_opt_config *o, const ref_record *r, kern_opt_kind kind)
{
	const float *x = r->data;
	if (r->n != 10)
		bail_out("optimizer record %s has %zu values", r->name, r->n);
	kern_opt_default(o, kind);
	o->lr = x[0];
	o->beta1 = x[1];
	o->beta2 = x[2];
	o->eps = x[3];
	o->weight_decay = x[4];
	o->clip_norm = x[5];
	o->warmup_steps = (long)x[6];
	o->total_steps = (long)x[7];
	o->decay = (kern_decay_kind)(int)x[8];
	o->min_lr_ratio = x[9];
}

/* 3 steps of o from the reference's initial parameters, each fed torch's
 * gradient; compare with tag.<kind>.* */
static void check_optimizer(kern_model *m, const char *tag, const char *kind, kern_opt_kind k)
{
	kern_opt_config o;
	char what[64];
	snprintf(what, sizeof what, "opt.%s", kind);
	opt_from(&o, ref_get(tag, what, 0), k);
	load_params(m, tag, "param");
	float *init = malloc(m->n_params * sizeof(float));
	memcpy(init, m->params, m->n_params * sizeof(float));
	memset(m->m, 0, m->n_params * sizeof(float));
	memset(m->v, 0, m->n_params * sizeof(float));
	m->step = 0;
	int clipped = 0;
	for (int s = 0; s < 3; s++) {
		for (int v = 0; v < m->n_views; v++) {
			char g[128];
			snprintf(g, sizeof g, "grad.%s", m->views[v].name);
			const ref_record *r = ref_get(tag, g, 0);
			memcpy(m->grads + m->views[v].offset, r->data, r->n * sizeof(float));
		}
		kern_opt_stats st;
		cot_errbuf eb;
		if (kern_opt_step(m, &o, &st, &eb))
			bail_out("kern_opt_step: %s", eb.msg);
		clipped += st.clip_coef < 1.0f;
	}
	ok(clipped == 3, "%s %s: clipping acted on all 3 steps", tag, kind);
	double worst = 0, worst_upd = 0;
	const char *worst_name = "", *worst_upd_name = "";
	for (int v = 0; v < m->n_views; v++) {
		const kern_view *vw = &m->views[v];
		char name[128];
		snprintf(name, sizeof name, "%s.%s", kind, vw->name);
		const ref_record *r = ref_get(tag, name, 0);
		const float *want = r->data, *ours = m->params + vw->offset;
		double e = ref_rel_err(ours, want, vw->numel);
		if (e > worst) {
			worst = e;
			worst_name = vw->name;
		}
		/* updates */
		float *du = malloc(vw->numel * sizeof(float)), *dw = malloc(vw->numel * sizeof(float));
		for (size_t i = 0; i < vw->numel; i++) {
			du[i] = ours[i] - init[vw->offset + i];
			dw[i] = want[i] - init[vw->offset + i];
		}
		double eu = ref_rel_err(du, dw, vw->numel);
		if (eu > worst_upd) {
			worst_upd = eu;
			worst_upd_name = vw->name;
		}
		if (e > 1e-4)
			diag("  %s: relative error %.3g", name, e);
		free(du);
		free(dw);
	}
	ok(worst <= 1e-4, "%s %s: parameters after 3 steps match torch, worst %.3g (%s)", tag, kind, worst,
	   worst_name);
	ok(worst_upd <= 1e-3, "%s %s: updates after 3 steps match torch, worst %.3g (%s)", tag, kind,
	   worst_upd, worst_upd_name);
	free(init);
}

/* Compare one case with torch; label names it in the test lines. */
static void check_case(const char *tag, const char *label, bool with_opt)
{
	const ref_record *rc = ref_get(tag, "config", 1);
	const int32_t *c = rc->data;
	kern_config cfg = { .n_layer = c[0],
		            .n_shared = c[1],
		            .n_head = c[2],
		            .d_model = c[3],
		            .seq_len = c[4],
		            .vocab = c[5],
		            .d_ff = c[6] };
	const ref_record *tok = ref_get(tag, "tokens", 1), *tg = ref_get(tag, "targets", 1);
	int B = (int)tok->shape[0];
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	load_params(m, tag, "param");
	float loss;
	kern_zero_grad(m);
	if (kern_forward(m, tok->data, tg->data, B, &loss, &eb) || kern_backward(m, &eb))
		bail_out("model pass: %s", eb.msg);
	float want = *(const float *)ref_get(tag, "loss", 0)->data;
	ok(fabs(loss - want) <= 1e-5 * fabs(want), "%s (L%d S%d T%d): loss %.7f, torch %.7f", label,
	   cfg.n_layer, cfg.n_shared, cfg.seq_len, loss, want);
	const ref_record *lg = ref_get(tag, "logits", 0);
	double e = ref_rel_err(kern_logits(m), lg->data, lg->n);
	ok(e <= 1e-4, "%s: logits match torch, relative error %.3g", label, e);
	for (int v = 0; v < m->n_views; v++) {
		char what[128];
		snprintf(what, sizeof what, "grad.%s", m->views[v].name);
		const ref_record *r = ref_get(tag, what, 0);
		e = ref_rel_err(m->grads + m->views[v].offset, r->data, r->n);
		ok(e <= 1e-4, "%s: gradient of %s matches torch, relative error %.3g", label,
		   m->views[v].name, e);
	}
	if (with_opt) {
		check_optimizer(m, tag, "adamw", KERN_OPT_ADAMW);
		check_optimizer(m, tag, "lamb", KERN_OPT_LAMB);
	}
	kern_model_free(m);
}

/* Case c must take the paths it was made for: attention over more than
 * one row block, MLP and head products of at least TILED_MIN_MACS. */
static void check_tiled_shape(const char *tag)
{
	const int32_t *c = ref_get(tag, "config", 1)->data;
	int T = c[4], C = c[3], V = c[5], F = c[6];
	double M = (double)ref_get(tag, "tokens", 1)->shape[0] * T;
	ok(T > KERN_ATT_BLOCK && M * C * F >= TILED_MIN_MACS && M * C * V >= TILED_MIN_MACS,
	   "%s: T %d > attention block %d; B*T x C x F = %.3g and B*T x C x V = %.3g "
	   "multiply-adds >= %.3g",
	   tag, T, KERN_ATT_BLOCK, M * C * F, M * C * V, TILED_MIN_MACS);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* the core the programs run on */
	const char *src = getenv("top_srcdir");
	char path[4096];
	plan_lazy();
	diag("%s", kern_backend_get()->describe());
	kern_set_threads(2);
	snprintf(path, sizeof path, "%s/tests/data/torch_reference.bin", src ? src : ".");
	ref_load(path);
	snprintf(path, sizeof path, "%s/tests/data/torch_reference_tiled.bin", src ? src : ".");
	ref_load(path);
	check_case("a", "a", true);
	check_case("b", "b", false);
	check_tiled_shape("c");
	kern_gemm_kind now = kern_gemm_kind_now();
	for (int k = KERN_GEMM_BLAS; k <= KERN_GEMM_AMX; k++) {
		if (!kern_gemm_use((kern_gemm_kind)k))
			continue; /* not on this CPU */
		char label[32];
		snprintf(label, sizeof label, "c on %s", kern_gemm_kind_name((kern_gemm_kind)k));
		check_case("c", label, false);
	}
	kern_gemm_use(now);
	ref_free_all();
	done_testing();
	return exit_status();
}
