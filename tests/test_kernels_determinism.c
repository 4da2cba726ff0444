/* Bit-identity on any thread count and on every run: every peer of a round
 * must hold the same parameters after the same step, and a client's
 * gradient must not depend on how many cores it was given.
 *
 * A model big enough for the backend to tile its products (1024-row GEMMs,
 * two attention row blocks) runs forward, backward, an AdamW step and a LAMB
 * step with 1, 2 and 3 threads, twice with 2; loss, logits, gradients,
 * parameters and moments must be equal byte for byte (memcmp).
 *
 * COTRAIN_GEMM=blas|avx2|avx512 (the tests/test_kernels_determinism_*.sh
 * wrappers) asks for one GEMM kernel: the test skips, naming what the CPU
 * lacks, where the driver (kernels/gemm.h) cannot run it here, and fails
 * where it could but runs another, so that a forced run never passes on
 * the kernel it was not meant to cover. */
#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	float loss;
	float *logits, *grads, *p_adamw, *m_adamw, *v_adamw, *p_lamb, *m_lamb, *v_lamb;
} result;

static const kern_config cfg = {
	.n_layer = 3, .n_shared = 2, .n_head = 4, .d_model = 64, .seq_len = 128, .vocab = 256, .d_ff = 256
};
enum { B = 8 };

static float *dup(const float *x, size_t n)
{
	float *y = malloc(n * sizeof *y);
	if (!y)
		bail_out("out of memory");
	memcpy(y, x, n * sizeof *y);
	return y;
}

static result run(int threads, const int32_t *tok, const int32_t *tg)
{
	result r;
	kern_model *m;
	cot_errbuf eb;
	kern_set_threads(threads);
	if (kern_model_create(&cfg, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 2024);
	size_t n = m->n_params;
	/* two microbatches accumulated, as a client does */
	kern_zero_grad(m);
	for (int mb = 0; mb < 2; mb++) {
		if (kern_forward(m, tok + mb * B * cfg.seq_len, tg + mb * B * cfg.seq_len, B, &r.loss, &eb) ||
		    kern_backward(m, &eb))
			bail_out("model pass: %s", eb.msg);
	}
	r.logits = dup(kern_logits(m), (size_t)B * cfg.seq_len * cfg.vocab);
	kern_scale_grads(m, 0.5f);
	r.grads = dup(m->grads, n);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	o.warmup_steps = 2;
	o.clip_norm = 0.1f; /* clipping on: the global norm is part of the step */
	for (int s = 0; s < 2; s++)
		if (kern_opt_step(m, &o, NULL, &eb))
			bail_out("adamw: %s", eb.msg);
	r.p_adamw = dup(m->params, n);
	r.m_adamw = dup(m->m, n);
	r.v_adamw = dup(m->v, n);
	kern_model_init(m, 2024);
	memcpy(m->grads, r.grads, n * sizeof(float));
	kern_opt_default(&o, KERN_OPT_LAMB);
	o.clip_norm = 0.1f;
	for (int s = 0; s < 2; s++)
		if (kern_opt_step(m, &o, NULL, &eb))
			bail_out("lamb: %s", eb.msg);
	r.p_lamb = dup(m->params, n);
	r.m_lamb = dup(m->m, n);
	r.v_lamb = dup(m->v, n);
	kern_model_free(m);
	return r;
}

static void compare(const result *a, const result *b, const char *what)
{
	size_t n = kern_param_count(&cfg), nl = (size_t)B * cfg.seq_len * cfg.vocab;
	ok(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: loss", what);
	ok(memcmp(a->logits, b->logits, nl * sizeof(float)) == 0, "%s: logits", what);
	ok(memcmp(a->grads, b->grads, n * sizeof(float)) == 0, "%s: gradients", what);
	ok(memcmp(a->p_adamw, b->p_adamw, n * sizeof(float)) == 0 &&
	           memcmp(a->m_adamw, b->m_adamw, n * sizeof(float)) == 0 &&
	           memcmp(a->v_adamw, b->v_adamw, n * sizeof(float)) == 0,
	   "%s: parameters and moments after 2 AdamW steps", what);
	ok(memcmp(a->p_lamb, b->p_lamb, n * sizeof(float)) == 0 &&
	           memcmp(a->m_lamb, b->m_lamb, n * sizeof(float)) == 0 &&
	           memcmp(a->v_lamb, b->v_lamb, n * sizeof(float)) == 0,
	   "%s: parameters and moments after 2 LAMB steps", what);
}

/* What a CPU needs for each forced kernel, for the skip message. */
static const char *needs(kern_gemm_kind k)
{
	return k == KERN_GEMM_AVX512 ? "AVX-512F" : k == KERN_GEMM_AVX2 ? "AVX2 and FMA" : "nothing";
}

/* With COTRAIN_GEMM set: skip_all where the driver cannot run the kernel
 * it names on this CPU; otherwise the kernel must be the one in use (a
 * failed test line, and the caller stops, when it is not). */
static bool forced_kernel_in_use(void)
{
	const char *want = getenv("COTRAIN_GEMM");
	kern_gemm_kind now = kern_gemm_kind_now();
	if (!want) {
		diag("GEMM kernel: %s (the best this CPU runs)", kern_gemm_kind_name(now));
		return true;
	}
	int k = -1;
	for (int i = KERN_GEMM_BLAS; i <= KERN_GEMM_AVX512; i++)
		if (strcmp(want, kern_gemm_kind_name((kern_gemm_kind)i)) == 0)
			k = i;
	if (k < 0)
		bail_out("COTRAIN_GEMM=%s names no kernel the driver can be forced to "
		         "(blas, avx2, avx512)",
		         want);
	if (now != (kern_gemm_kind)k && !kern_gemm_use((kern_gemm_kind)k))
		skip_all("COTRAIN_GEMM=%s: this CPU lacks %s, the GEMM driver runs its %s "
		         "kernel instead",
		         want, needs((kern_gemm_kind)k), kern_gemm_kind_name(now));
	return ok(now == (kern_gemm_kind)k,
	          "COTRAIN_GEMM=%s: the GEMM driver runs the "
	          "%s kernel (it runs %s)",
	          want, want, kern_gemm_kind_name(now));
}

static void free_result(result *r)
{
	free(r->logits);
	free(r->grads);
	free(r->p_adamw);
	free(r->m_adamw);
	free(r->v_adamw);
	free(r->p_lamb);
	free(r->m_lamb);
	free(r->v_lamb);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* the core the programs run on */
	plan_lazy();
	diag("%s", kern_backend_get()->describe());
	if (!forced_kernel_in_use()) {
		done_testing();
		return exit_status();
	}
	int n = 2 * B * cfg.seq_len;
	int32_t *tok = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
	kern_rng rng;
	kern_rng_seed(&rng, 99);
	for (int i = 0; i < n; i++) {
		tok[i] = (int32_t)(kern_rng_next(&rng) % 256);
		tg[i] = (int32_t)(kern_rng_next(&rng) % 256);
	}
	result r1 = run(1, tok, tg);
	result r2 = run(2, tok, tg);
	result r2b = run(2, tok, tg);
	result r3 = run(3, tok, tg);
	compare(&r1, &r2, "1 vs 2 threads");
	compare(&r2, &r2b, "2 threads, run twice");
	compare(&r1, &r3, "1 vs 3 threads");
	free_result(&r1);
	free_result(&r2);
	free_result(&r2b);
	free_result(&r3);
	free(tok);
	free(tg);
	done_testing();
	return exit_status();
}
