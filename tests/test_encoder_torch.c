/* The encoders against PyTorch: tests/data/encoder_reference.bin, written
 * by tests/encoder_reference.py (an independent PyTorch rendering of Hugging
 * Face's AlbertForPreTraining / BertForPreTraining, in float64), holds the
 * losses, logits and every gradient of a tiny ALBERT (one shared set,
 * factorised embedding) and a tiny BERT (exact GELU) on given weights and a
 * given masked batch, and the same two with relative positions (ALBERT
 * relative_key, BERT relative_key_query: Hugging Face's distance embedding
 * at each model's own scale).
 *
 * Tolerances: the losses within 1e-5 relative; the MLM and SOP logits and
 * every gradient within 1e-5 relative, per tensor, as max |ours - torch| /
 * max |torch|.  On correct kernels the worst is a few 1e-7 (float32
 * rounding against a float64 reference). */
#include "kernels/backend.h"
#include "kernels/encoder.h"
#include "kernels/model.h"
#include "tests/ref_file.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5

static void config_of(const char *tag, kern_config *c)
{
	const ref_record *r = ref_get(tag, "config", 1);
	const int32_t *x = r->data;
	if (r->n != 15)
		bail_out("%s.config has %zu values", tag, r->n);
	memset(c, 0, sizeof *c);
	c->arch = x[0];
	c->n_layer = x[1];
	c->n_shared = x[2];
	c->n_head = x[3];
	c->d_model = x[4];
	c->d_embed = x[5];
	c->d_ff = x[6];
	c->seq_len = x[7];
	c->vocab = x[8];
	c->type_vocab = x[9];
	c->cls_id = x[10];
	c->sep_id = x[11];
	c->mask_id = x[12];
	c->pad_id = x[13];
	c->unk_id = -1;
	c->position = x[14];
}

static void check_case(const char *tag)
{
	kern_config cfg;
	config_of(tag, &cfg);
	const ref_record *ids = ref_get(tag, "ids", 1), *seg = ref_get(tag, "segments", 1),
	                 *lab = ref_get(tag, "labels", 1), *sop = ref_get(tag, "sop", 1);
	int B = (int)ids->shape[0];
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	for (int v = 0; v < m->n_views; v++) {
		char what[128];
		snprintf(what, sizeof what, "param.%s", m->views[v].name);
		const ref_record *r = ref_get(tag, what, 0);
		if (r->n != m->views[v].numel)
			bail_out("%s.%s has %zu values, the model %zu", tag, what, r->n, m->views[v].numel);
		memcpy(m->params + m->views[v].offset, r->data, r->n * sizeof(float));
	}
	kern_enc_batch batch = { ids->data, seg->data, lab->data, sop->data, NULL };
	kern_enc_result res;
	kern_zero_grad(m);
	if (kern_enc_forward(m, &batch, B, &res, &eb) || kern_enc_backward_scaled(m, 1.0f, &eb))
		bail_out("encoder pass: %s", eb.msg);
	static const char *const lname[3] = { "loss", "mlm_loss", "sop_loss" };
	const double ours[3] = { res.loss, res.mlm_loss, res.sop_loss };
	for (int i = 0; i < 3; i++) {
		double want = *(const float *)ref_get(tag, lname[i], 0)->data;
		ok(fabs(ours[i] - want) <= TOL * fabs(want), "%s: %s %.7f, torch %.7f", tag, lname[i],
		   ours[i], want);
	}
	int rows;
	const float *lg = kern_enc_mlm_logits(m, &rows, NULL);
	const ref_record *want_lg = ref_get(tag, "mlm_logits", 0);
	ok(rows == (int)want_lg->shape[0] && res.n_predicted == rows, "%s: %d predicted positions, torch %u",
	   tag, rows, want_lg->shape[0]);
	double e = ref_rel_err(lg, want_lg->data, want_lg->n);
	ok(e <= TOL, "%s: MLM logits match torch, relative error %.3g", tag, e);
	const ref_record *want_sop = ref_get(tag, "sop_logits", 0);
	e = ref_rel_err(kern_enc_sop_logits(m), want_sop->data, want_sop->n);
	ok(e <= TOL, "%s: SOP logits match torch, relative error %.3g", tag, e);
	double worst = 0;
	const char *worst_name = "";
	int bad = 0;
	for (int v = 0; v < m->n_views; v++) {
		char what[128];
		snprintf(what, sizeof what, "grad.%s", m->views[v].name);
		const ref_record *r = ref_get(tag, what, 0);
		e = ref_rel_err(m->grads + m->views[v].offset, r->data, r->n);
		if (e > TOL) {
			diag("  %s: gradient of %s off by %.3g", tag, m->views[v].name, e);
			bad++;
		}
		if (e >= worst) {
			worst = e;
			worst_name = m->views[v].name;
		}
	}
	ok(bad == 0, "%s: all %d gradients match torch, worst %.3g (%s)", tag, m->n_views, worst, worst_name);

	/* without labels: logits at every position */
	kern_enc_batch nolab = { ids->data, seg->data, NULL, NULL, NULL };
	if (kern_enc_forward(m, &nolab, B, &res, &eb))
		bail_out("encoder pass without labels: %s", eb.msg);
	const ref_record *full = ref_get(tag, "full_logits", 0);
	lg = kern_enc_mlm_logits(m, &rows, NULL);
	ok(rows == B * cfg.seq_len, "%s: without labels the head runs on all %d positions", tag, rows);
	e = ref_rel_err(lg, full->data, full->n);
	ok(e <= TOL, "%s: logits at every position match torch, relative error %.3g", tag, e);
	ok(kern_enc_backward_scaled(m, 1.0f, &eb) == COT_ERR_CONFLICT,
	   "%s: no backward after a forward without labels", tag);
	kern_model_free(m);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	const char *src = getenv("top_srcdir");
	char path[4096];
	plan_lazy();
	diag("%s", kern_backend_get()->describe());
	kern_set_threads(2);
	snprintf(path, sizeof path, "%s/tests/data/encoder_reference.bin", src ? src : ".");
	ref_load(path);
	check_case("albert");
	check_case("bert");
	check_case("albert_relative_key");
	check_case("bert_relative_key_query");
	ref_free_all();
	done_testing();
	return exit_status();
}
