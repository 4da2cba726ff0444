/* Tests for local mode's kernels (doc/design.md "Local mode"): the outer
 * step against numbers worked by hand (Nesterov on and off, the momentum
 * carried over two steps), the momentum's round-trip through a checkpoint
 * (a step from the reloaded model gives the same bytes), the inner steps'
 * bookkeeping (kernels/local.h: when a step is taken, the flush of a
 * partial inner batch, the contribution s x (theta_v - theta), theta_v put
 * back), and the mode settings read from a project config. */
#include "kernels/local.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "kernels/optimizer.h"
#include "tests/tap.h"

static const kern_config cfg = {
	.n_layer = 2, .n_shared = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab = 256, .d_ff = 64
};

static kern_model *make(unsigned seed)
{
	kern_model *m;
	cot_errbuf eb = { "", "" };
	if (kern_model_create(&cfg, 0, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, seed);
	m->step = 7;
	return m;
}

/* Every parameter p, every pseudo-gradient d (exact binary fractions, so
 * the float arithmetic is exact and the expected values are too). */
static void fill(kern_model *m, float p, float d)
{
	for (size_t i = 0; i < m->n_params; i++) {
		m->params[i] = p;
		m->grads[i] = d;
	}
}

static int all_eq(const float *x, size_t n, float want)
{
	for (size_t i = 0; i < n; i++)
		if (x[i] != want) {
			diag("element %zu is %.9g, want %.9g", i, x[i], want);
			return 0;
		}
	return 1;
}

static void outer_by_hand(void)
{
	cot_errbuf eb = { "", "" };
	kern_model *m = make(1);
	size_t n = m->n_params;
	memset(m->m, 0, n * sizeof *m->m);
	for (size_t i = 0; i < n; i++)
		m->v[i] = 0.25f;
	kern_outer_config o = { .lr = 0.5f, .momentum = 0.5f, .nesterov = true };

	/* Nesterov.  Step 1: mom = 0.5*0 + 0.5 = 0.5; p = 1 - 0.5 (0.5 + 0.5*0.5) = 0.625.
	 * Step 2 with d = 0.25: mom = 0.5*0.5 + 0.25 = 0.5;
	 * p = 0.625 - 0.5 (0.25 + 0.5*0.5) = 0.375. */
	fill(m, 1.0f, 0.5f);
	is_int(kern_opt_outer_step(m, &o, &eb), COT_OK, "nesterov: first outer step");
	ok(all_eq(m->params, n, 0.625f), "nesterov: p = 1 - 0.5 (0.5 + 0.5 x 0.5) = 0.625");
	ok(all_eq(m->m, n, 0.5f), "nesterov: momentum 0.5 after the first step");
	is_int(m->step, 8, "the step count goes on");
	for (size_t i = 0; i < n; i++)
		m->grads[i] = 0.25f;
	is_int(kern_opt_outer_step(m, &o, &eb), COT_OK, "nesterov: second outer step");
	ok(all_eq(m->m, n, 0.5f), "nesterov: momentum carried: 0.5 x 0.5 + 0.25 = 0.5");
	ok(all_eq(m->params, n, 0.375f), "nesterov: p = 0.625 - 0.5 (0.25 + 0.5 x 0.5) = 0.375");
	ok(all_eq(m->v, n, 0.25f), "the second moment is left alone");

	/* Plain momentum.  Step 1: mom = 0.5, p = 1 - 0.5 x 0.5 = 0.75.
	 * Step 2 with d = 0.25: mom = 0.25 + 0.25 = 0.5, p = 0.75 - 0.25 = 0.5. */
	o.nesterov = false;
	memset(m->m, 0, n * sizeof *m->m);
	fill(m, 1.0f, 0.5f);
	is_int(kern_opt_outer_step(m, &o, &eb), COT_OK, "momentum: first outer step");
	ok(all_eq(m->params, n, 0.75f), "momentum: p = 1 - 0.5 x 0.5 = 0.75");
	for (size_t i = 0; i < n; i++)
		m->grads[i] = 0.25f;
	is_int(kern_opt_outer_step(m, &o, &eb), COT_OK, "momentum: second outer step");
	ok(all_eq(m->m, n, 0.5f), "momentum: carried: 0.5 x 0.5 + 0.25 = 0.5");
	ok(all_eq(m->params, n, 0.5f), "momentum: p = 0.75 - 0.5 x 0.5 = 0.5");

	/* DiLoCo's defaults, p = 1, d = 0.1: mom = 0.1, p = 1 - 0.7 (0.1 + 0.09) = 0.867. */
	kern_outer_default(&o);
	ok(o.lr == 0.7f && o.momentum == 0.9f && o.nesterov, "defaults: lr 0.7, momentum 0.9, nesterov");
	memset(m->m, 0, n * sizeof *m->m);
	fill(m, 1.0f, 0.1f);
	is_int(kern_opt_outer_step(m, &o, &eb), COT_OK, "default outer step");
	ok(fabsf(m->params[0] - 0.867f) < 1e-6f && fabsf(m->params[n - 1] - 0.867f) < 1e-6f,
	   "defaults: p = 1 - 0.7 (0.1 + 0.9 x 0.1) = 0.867 (got %.9g)", m->params[0]);

	/* Refusals change nothing. */
	float p0 = m->params[0];
	long s0 = m->step;
	m->grads[n / 2] = NAN;
	is_int(kern_opt_outer_step(m, &o, &eb), COT_ERR_INVALID, "a pseudo-gradient with a NaN is refused");
	ok(m->params[0] == p0 && m->step == s0, "  and nothing is changed");
	m->grads[n / 2] = 0;
	kern_outer_config bad = { .lr = 0, .momentum = 0.9f, .nesterov = true };
	is_int(kern_opt_outer_step(m, &bad, &eb), COT_ERR_INVALID, "lr 0 is refused");
	bad = (kern_outer_config){ .lr = 0.7f, .momentum = 1.0f, .nesterov = true };
	is_int(kern_opt_outer_step(m, &bad, &eb), COT_ERR_INVALID, "momentum 1 is refused");
	kern_model_free(m);
}

/* Varied values, so a thread-count or round-trip difference would show. */
static void vary(kern_model *m, unsigned k)
{
	for (size_t i = 0; i < m->n_params; i++) {
		m->grads[i] = (float)sin((double)i * 0.31 + k) * 1e-2f;
		m->m[i] = (float)cos((double)i * 0.17 + k) * 1e-3f;
	}
}

static void threads_and_checkpoint(void)
{
	cot_errbuf eb = { "", "" };
	kern_outer_config o;
	kern_outer_default(&o);
	kern_model *a = make(3), *b = make(3);
	vary(a, 1);
	vary(b, 1);
	kern_set_threads(1);
	kern_opt_outer_step(a, &o, &eb);
	kern_set_threads(4);
	kern_opt_outer_step(b, &o, &eb);
	ok(memcmp(a->params, b->params, a->n_params * 4) == 0 && memcmp(a->m, b->m, a->n_params * 4) == 0,
	   "1 and 4 threads give the same bytes");

	/* The momentum in a checkpoint: save, load, one more step on each. */
	char path[64];
	snprintf(path, sizeof path, "/tmp/test_local_mode.%d.safetensors", (int)getpid());
	if (!is_int(ckpt_save(a, path, &eb), COT_OK, "save the model with its outer momentum"))
		diag("%s", eb.msg);
	kern_model *c = NULL;
	if (!is_int(ckpt_load_new(path, 0, &c, &eb), COT_OK, "load it back"))
		bail_out("%s", eb.msg);
	unlink(path);
	ok(memcmp(c->m, a->m, a->n_params * 4) == 0 && memcmp(c->params, a->params, a->n_params * 4) == 0 &&
	           c->step == a->step,
	   "parameters, momentum and step come back bit for bit");
	for (size_t i = 0; i < a->n_params; i++)
		a->grads[i] = c->grads[i] = (float)sin((double)i * 0.07) * 1e-2f;
	kern_opt_outer_step(a, &o, &eb);
	kern_opt_outer_step(c, &o, &eb);
	ok(memcmp(c->params, a->params, a->n_params * 4) == 0 && memcmp(c->m, a->m, a->n_params * 4) == 0,
	   "the next outer step from the reloaded momentum gives the same bytes");
	/* And the momentum matters: without it the step differs. */
	memset(c->m, 0, c->n_params * 4);
	memcpy(c->params, b->params, c->n_params * 4);
	memcpy(b->grads, a->grads, b->n_params * 4);
	kern_opt_outer_step(b, &o, &eb);
	kern_opt_outer_step(c, &o, &eb);
	ok(memcmp(c->params, b->params, b->n_params * 4) != 0,
	   "a lost momentum would show in the parameters");
	kern_model_free(a);
	kern_model_free(b);
	kern_model_free(c);
	kern_set_threads(1);
}

/* A microbatch's gradient sum, made up: k selects the values. */
static void fake_grad(kern_model *m, int k, float *keep)
{
	for (size_t i = 0; i < m->n_params; i++) {
		m->grads[i] += (float)sin((double)i * 0.13 + k) * 4e-2f;
		if (keep)
			keep[i] += (float)sin((double)i * 0.13 + k) * 4e-2f;
	}
}

static void inner_steps(void)
{
	cot_errbuf eb = { "", "" };
	kern_opt_config inner;
	kern_opt_default(&inner, KERN_OPT_ADAMW);
	inner.warmup_steps = 10; /* lr of schedule step 7: 8/10 of the peak */
	kern_model *m = make(5), *ref = make(5);
	size_t n = m->n_params;
	float *theta0 = malloc(n * 4), *g = calloc(n, 4), *mo1 = calloc(n, 4), *mo2 = calloc(n, 4);
	if (!theta0 || !g || !mo1 || !mo2)
		bail_out("out of memory");
	memcpy(theta0, m->params, n * 4);
	kern_local *l = NULL;
	is_int(kern_local_new(m, &inner, 2, &l, &eb), COT_OK, "inner state for inner batches of 2");
	is_int(kern_local_new(m, &inner, 0, &(kern_local *){ NULL }, &eb), COT_ERR_INVALID,
	       "an inner batch of 0 is refused");
	kern_local_begin(l, m);

	/* Two microbatches of 4 samples: one inner step on their mean. */
	fake_grad(m, 1, g);
	is_int(kern_local_microbatch(l, m, 4, &eb), COT_OK, "first microbatch");
	ok(memcmp(m->params, theta0, n * 4) == 0 && kern_local_steps(l) == 0, "  no step yet");
	fake_grad(m, 2, g);
	is_int(kern_local_microbatch(l, m, 4, &eb), COT_OK, "second microbatch");
	is_int(kern_local_steps(l), 1, "  one inner step after 2 microbatches");
	ok(all_eq(m->grads, n, 0.0f), "  the gradient is zeroed after it");
	for (size_t i = 0; i < n; i++)
		ref->grads[i] = (float)((double)g[i] / 8.0);
	kern_opt_step_with(ref, &inner, mo1, mo2, 7, 1, NULL, &eb);
	ok(memcmp(m->params, ref->params, n * 4) == 0,
	   "  it is AdamW on the mean over 8 samples, lr of the round's step, t = 1");
	ok(memcmp(m->params, theta0, n * 4) != 0, "  and it moved the parameters");
	is_int(m->step, 7, "  the model's step count stays the round's");

	/* A third microbatch, then the end of the round: its partial inner
	 * batch is flushed as a step over its 4 samples (t = 2). */
	memset(g, 0, n * 4);
	fake_grad(m, 3, g);
	is_int(kern_local_microbatch(l, m, 4, &eb), COT_OK, "third microbatch");
	int64_t s = 0;
	is_int(kern_local_finish(l, m, &s, &eb), COT_OK, "finish the round");
	is_int(s, 12, "  12 samples in all");
	is_int(kern_local_steps(l), 2, "  the partial inner batch took a step");
	for (size_t i = 0; i < n; i++)
		ref->grads[i] = (float)((double)g[i] / 4.0);
	kern_opt_step_with(ref, &inner, mo1, mo2, 7, 2, NULL, &eb);
	int contrib = 1;
	for (size_t i = 0; i < n && contrib; i++)
		contrib = m->grads[i] == (theta0[i] - ref->params[i]) * 12.0f;
	ok(contrib, "  the contribution is 12 x (theta_v - theta)");
	ok(memcmp(m->params, theta0, n * 4) == 0, "  theta_v is back in the parameters");
	is_int(kern_local_microbatch(l, m, 4, &eb), COT_ERR_CONFLICT, "no microbatch after the finish");
	is_int(kern_local_finish(l, m, NULL, &eb), COT_ERR_CONFLICT, "no second finish");

	/* A new round starts from the parameters as they are. */
	m->params[0] += 1.0f;
	kern_local_begin(l, m);
	fake_grad(m, 4, NULL);
	is_int(kern_local_finish(l, m, &s, &eb), COT_OK, "a round with no microbatch counted ends");
	ok(s == 0 && all_eq(m->grads, n, 0.0f), "  contributes nothing");

	kern_local_free(l);
	kern_model_free(m);
	kern_model_free(ref);
	free(theta0);
	free(g);
	free(mo1);
	free(mo2);
}

static void mode_json(void)
{
	cot_errbuf eb = { "", "" };
	kern_mode_config mc;
	is_int(kern_mode_config_from_json("{}", &mc, &eb), COT_OK, "no mode: sync");
	ok(mc.mode == KERN_MODE_SYNC && mc.inner_batch == 4 && mc.outer.lr == 0.7f &&
	           mc.outer.momentum == 0.9f && mc.outer.nesterov && mc.precision == KERN_PREC_BF16,
	   "  with the defaults (a GPU's products in bf16)");
	static const struct {
		const char *json;
		int precision;
	} precs[] = { { "{\"precision\":\"fp32\"}", KERN_PREC_FP32 },
		      { "{\"precision\":\"tf32\",\"mode\":\"local\"}", KERN_PREC_TF32 },
		      { "{\"precision\":\"bf16\"}", KERN_PREC_BF16 } };
	for (int i = 0; i < 3; i++) {
		mc.precision = -1;
		eb.msg[0] = '\0';
		ok(kern_mode_config_from_json(precs[i].json, &mc, &eb) == COT_OK &&
		           mc.precision == precs[i].precision,
		   "%s: precision %d %s", precs[i].json, precs[i].precision, eb.msg);
	}
	is_int(kern_mode_config_from_json("{\"precision\":\"fp16\"}", &mc, &eb), COT_ERR_INVALID,
	       "refused: precision fp16");
	ok(strstr(eb.msg, "\"precision\"") && strstr(eb.msg, "\"fp32\", \"tf32\" or \"bf16\""),
	   "  the message names the field and the allowed values: %s", eb.msg);
	is_int(kern_mode_config_from_json("{\"mode\":\"local\",\"inner_batch\":8,\"outer\":{\"lr\":0.5,"
	                                  "\"momentum\":0.8,\"nesterov\":false}}",
	                                  &mc, &eb),
	       COT_OK, "local mode with its settings");
	ok(mc.mode == KERN_MODE_LOCAL && mc.inner_batch == 8 && mc.outer.lr == 0.5f &&
	           mc.outer.momentum == 0.8f && !mc.outer.nesterov,
	   "  read as written");
	static const char *const bad[] = { "{\"mode\":\"async\"}",
		                           "{\"inner_batch\":0}",
		                           "{\"inner_batch\":1.5}",
		                           "{\"outer\":{\"lr\":-1}}",
		                           "{\"outer\":{\"momentum\":1}}",
		                           "{\"outer\":{\"nesterov\":1}}",
		                           "{\"outer\":3}",
		                           "{\"precision\":16}",
		                           "{\"precision\":null}",
		                           "{\"precision\":\"\"}",
		                           NULL };
	for (int i = 0; bad[i]; i++)
		is_int(kern_mode_config_from_json(bad[i], &mc, &eb), COT_ERR_INVALID, "refused: %s (%s)",
		       bad[i], eb.msg);
}

int main(void)
{
	plan_lazy();
	outer_by_hand();
	threads_and_checkpoint();
	inner_steps();
	mode_json();
	done_testing();
	return exit_status();
}
