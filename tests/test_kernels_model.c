/* The model's contract: config validation, named views, parameter and FLOP
 * counts, deterministic init, error paths of the passes, gradient
 * accumulation over microbatches, the learning-rate schedule and the
 * optimizer's refusal of a non-finite gradient. */
#include "kernels/backend.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A GPT config from its seven fields in order (the encoder fields zero). */
#define GPT(l, s, h, c, t, v, f) \
	{ \
		.n_layer = (l), .n_shared = (s), .n_head = (h), .d_model = (c), .seq_len = (t), \
		.vocab = (v), .d_ff = (f) \
	}

static void test_config(void)
{
	kern_config c;
	cot_errbuf eb;
	kern_config_default(&c);
	is_int(kern_config_validate(&c, &eb), COT_OK, "the demo config is valid");
	/* parameter count by hand: 3.3M for the demo model */
	size_t C = 256, F = 1024, per = 4 * C + 3 * C * C + 3 * C + C * C + C + C * F + F + F * C + C;
	size_t want = 256 * C + 256 * C + 4 * per + 2 * C;
	is_int((long long)kern_param_count(&c), (long long)want, "demo model has %zu parameters", want);
	/* FLOPs: 3 x (L (2T(4C^2 + 2CF) + 2CT(T+1)) + 2TCV) */
	double T = 256, fwd = 4 * (2 * T * (4.0 * C * C + 2.0 * C * F) + 2 * 256.0 * T * (T + 1)) +
	                      2 * T * 256.0 * 256;
	ok(kern_flops_per_sample(&c) == 3 * fwd, "demo model: %.4g FLOPs per sample",
	   kern_flops_per_sample(&c));
	struct {
		const char *what;
		kern_config c;
	} bad[] = {
		{ "n_shared > n_layer", GPT(2, 3, 2, 8, 8, 16, 16) },
		{ "n_shared 0", GPT(2, 0, 2, 8, 8, 16, 16) },
		{ "d_model not a multiple of n_head", GPT(2, 1, 3, 8, 8, 16, 16) },
		{ "vocab 1", GPT(2, 1, 2, 8, 8, 1, 16) },
		{ "seq_len 0", GPT(2, 1, 2, 8, 0, 16, 16) },
		{ "huge d_model", GPT(2, 1, 2, 1 << 20, 8, 16, 16) },
		{ "too many parameters", GPT(256, 256, 2, 16384, 8, 16, 16384) },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		eb.msg[0] = 0;
		cot_err rc = kern_config_validate(&bad[i].c, &eb);
		ok(rc == COT_ERR_INVALID && eb.msg[0], "rejects %s: %s", bad[i].what, eb.msg);
	}
}

static void test_views(void)
{
	kern_config c = {
		.n_layer = 6, .n_shared = 2, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab = 10, .d_ff = 12
	};
	int n = kern_param_views(&c, NULL, 0);
	is_int(n, 2 + 12 * 2 + 2, "views: wte, wpe, 12 per set, ln_f");
	kern_view v[64];
	is_int(kern_param_views(&c, v, 3), n, "a short array still gets the count");
	kern_param_views(&c, v, 64);
	size_t off = 0;
	bool contiguous = true;
	for (int i = 0; i < n; i++) {
		size_t numel = 1;
		for (int d = 0; d < v[i].ndim; d++)
			numel *= (size_t)v[i].shape[d];
		contiguous &= v[i].offset == off && v[i].numel == numel;
		off += v[i].numel;
	}
	ok(contiguous && off == kern_param_count(&c), "views tile the buffer exactly");
	is_str(v[0].name, "wte", "first view");
	is_str(v[4].name, "h.0.attn.c_attn.weight", "c_attn weight name");
	ok(v[4].ndim == 2 && v[4].shape[0] == 8 && v[4].shape[1] == 24,
	   "c_attn weight is [in, out] = [8, 24]");
	is_str(v[2 + 12].name, "h.1.ln_1.weight", "second set");
	is_str(v[n - 1].name, "ln_f.bias", "last view");
	/* block l uses set l * S / L: 0 0 0 1 1 1 */
	int sets[6];
	for (int l = 0; l < 6; l++)
		sets[l] = kern_layer_set(&c, l);
	ok(sets[0] == 0 && sets[2] == 0 && sets[3] == 1 && sets[5] == 1,
	   "sharing: blocks use sets %d %d %d %d %d %d", sets[0], sets[1], sets[2], sets[3], sets[4],
	   sets[5]);
}

static void test_init(void)
{
	kern_config c = GPT(2, 1, 2, 16, 8, 32, 64);
	kern_model *a, *b;
	cot_errbuf eb;
	if (kern_model_create(&c, 0, &a, &eb) || kern_model_create(&c, 0, &b, &eb))
		bail_out("create: %s", eb.msg);
	kern_model_init(a, 5);
	kern_model_init(b, 5);
	ok(memcmp(a->params, b->params, a->n_params * 4) == 0, "init is a function of the seed");
	kern_model_init(b, 6);
	ok(memcmp(a->params, b->params, a->n_params * 4) != 0, "another seed, other weights");
	/* statistics: wte ~ N(0, 0.02), LN weight 1, bias 0, c_proj smaller */
	const kern_view *wte = &a->views[0];
	double s = 0, s2 = 0;
	for (size_t i = 0; i < wte->numel; i++) {
		s += a->params[i];
		s2 += (double)a->params[i] * a->params[i];
	}
	double sd = sqrt(s2 / wte->numel - (s / wte->numel) * (s / wte->numel));
	ok(fabs(sd - 0.02) < 0.002, "wte standard deviation %.4f", sd);
	ok(a->params[a->views[2].offset] == 1.0f && a->params[a->views[3].offset] == 0.0f,
	   "LayerNorm weight 1, bias 0");
	/* known answer: the generator is portable, so these never change */
	kern_rng r;
	kern_rng_seed(&r, 0);
	uint64_t x = kern_rng_next(&r);
	ok(x == 0x99ec5f36cb75f2b4ULL, "xoshiro256** from splitmix64(0): %016llx", (unsigned long long)x);
	kern_model_free(a);
	kern_model_free(b);
}

static void test_errors(void)
{
	kern_config c = GPT(2, 2, 2, 16, 8, 32, 64);
	kern_model *m;
	cot_errbuf eb;
	int32_t tok[2 * 8] = { 0 }, tg[2 * 8] = { 0 };
	float loss;
	if (kern_model_create(&c, 0, &m, &eb))
		bail_out("create: %s", eb.msg);
	is_int(kern_forward(m, tok, tg, 1, &loss, &eb), COT_ERR_CONFLICT,
	       "no forward without activations: %s", eb.msg);
	kern_model_free(m);
	is_int(kern_model_create(&c, -1, &m, &eb), COT_ERR_INVALID, "negative max_batch");
	ok(m == NULL, "no model on error");
	if (kern_model_create(&c, 2, &m, &eb))
		bail_out("create: %s", eb.msg);
	kern_model_init(m, 1);
	is_int(kern_backward(m, &eb), COT_ERR_CONFLICT, "no backward before a forward: %s", eb.msg);
	ok(kern_logits(m) == NULL, "no logits before a forward");
	is_int(kern_forward(m, tok, tg, 3, &loss, &eb), COT_ERR_INVALID, "batch above max: %s", eb.msg);
	tok[5] = 32;
	is_int(kern_forward(m, tok, tg, 2, &loss, &eb), COT_ERR_INVALID, "token out of range: %s", eb.msg);
	tok[5] = 1;
	tg[3] = -1;
	is_int(kern_forward(m, tok, tg, 2, &loss, &eb), COT_ERR_INVALID, "target out of range: %s", eb.msg);
	is_int(kern_forward(m, tok, NULL, 2, &loss, &eb), COT_OK, "logits-only forward");
	ok(loss == 0 && kern_logits(m) != NULL, "logits without a loss");
	is_int(kern_backward(m, &eb), COT_ERR_CONFLICT, "no backward after a forward without targets");
	kern_model_free(m);
}

/* The gradient of a batch of 4 equals the mean of the accumulated gradients
 * of two microbatches of 2 (kern_scale_grads by B / n = 2 / 4). */
static void test_accumulation(void)
{
	kern_config c = GPT(2, 1, 2, 16, 8, 32, 64);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, 4, &m, &eb))
		bail_out("create: %s", eb.msg);
	kern_model_init(m, 3);
	int32_t tok[32], tg[32];
	for (int i = 0; i < 32; i++) {
		tok[i] = (i * 7) % 32;
		tg[i] = (i * 11 + 3) % 32;
	}
	float loss;
	kern_zero_grad(m);
	if (kern_forward(m, tok, tg, 4, &loss, &eb) || kern_backward(m, &eb))
		bail_out("pass: %s", eb.msg);
	float *full = malloc(m->n_params * 4);
	memcpy(full, m->grads, m->n_params * 4);
	kern_zero_grad(m);
	for (int mb = 0; mb < 2; mb++)
		if (kern_forward(m, tok + 16 * mb, tg + 16 * mb, 2, &loss, &eb) || kern_backward(m, &eb))
			bail_out("pass: %s", eb.msg);
	kern_scale_grads(m, 2.0f / 4.0f);
	double e = 0, s = 0;
	for (size_t i = 0; i < m->n_params; i++) {
		e = fmax(e, fabs((double)m->grads[i] - full[i]));
		s = fmax(s, fabs((double)full[i]));
	}
	ok(e <= 1e-5 * s, "two microbatches, scaled by B/n, give the batch gradient (error %.3g of %.3g)", e,
	   s);
	/* kern_backward_scaled(B) sums per-sample gradients directly */
	kern_zero_grad(m);
	for (int mb = 0; mb < 2; mb++)
		if (kern_forward(m, tok + 16 * mb, tg + 16 * mb, 2, &loss, &eb) ||
		    kern_backward_scaled(m, 2.0f, &eb))
			bail_out("pass: %s", eb.msg);
	kern_scale_grads(m, 1.0f / 4.0f);
	e = 0;
	for (size_t i = 0; i < m->n_params; i++)
		e = fmax(e, fabs((double)m->grads[i] - full[i]));
	ok(e <= 1e-5 * s, "kern_backward_scaled(B) sums over samples (error %.3g)", e);
	free(full);
	kern_model_free(m);
}

static void test_schedule(void)
{
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	o.lr = 1.0f;
	o.warmup_steps = 4;
	o.total_steps = 14;
	o.decay = KERN_DECAY_LINEAR;
	o.min_lr_ratio = 0.1f;
	ok(kern_opt_lr(&o, 0) == 0.25f && kern_opt_lr(&o, 3) == 1.0f, "linear warmup");
	ok(fabsf(kern_opt_lr(&o, 9) - 0.55f) < 1e-6f && fabsf(kern_opt_lr(&o, 14) - 0.1f) < 1e-6f &&
	           fabsf(kern_opt_lr(&o, 100) - 0.1f) < 1e-6f,
	   "linear decay to the floor");
	o.decay = KERN_DECAY_COSINE;
	ok(fabsf(kern_opt_lr(&o, 9) - 0.55f) < 1e-6f && fabsf(kern_opt_lr(&o, 4) - 1.0f) < 1e-6f &&
	           fabsf(kern_opt_lr(&o, 14) - 0.1f) < 1e-6f,
	   "cosine decay: %.7f at the middle", kern_opt_lr(&o, 9));
	double want = 0.1 + 0.9 * (1 + cos(M_PI * 0.3)) / 2;
	ok(fabs(kern_opt_lr(&o, 7) - want) < 1e-7, "cosine matches libm: %.8f vs %.8f", kern_opt_lr(&o, 7),
	   want);
	cot_errbuf eb;
	o.beta1 = 1.0f;
	is_int(kern_opt_validate(&o, &eb), COT_ERR_INVALID, "beta1 1 rejected: %s", eb.msg);
}

static void test_nonfinite(void)
{
	kern_config c = GPT(2, 1, 2, 16, 8, 32, 64);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, 0, &m, &eb))
		bail_out("create: %s", eb.msg);
	kern_model_init(m, 3);
	float *before = malloc(m->n_params * 4);
	memcpy(before, m->params, m->n_params * 4);
	m->grads[100] = NAN;
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_LAMB);
	is_int(kern_opt_step(m, &o, NULL, &eb), COT_ERR_INVALID, "NaN gradient refused: %s", eb.msg);
	ok(memcmp(before, m->params, m->n_params * 4) == 0 && m->step == 0,
	   "parameters untouched after a refused step");
	free(before);
	kern_model_free(m);
}

int main(void)
{
	plan_lazy();
	kern_set_threads(2);
	test_config();
	test_views();
	test_init();
	test_errors();
	test_accumulation();
	test_schedule();
	test_nonfinite();
	done_testing();
	return exit_status();
}
