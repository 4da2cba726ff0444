/* bench_encoder: training throughput of the ALBERT encoder on this machine.
 *
 *   bench_encoder [--model demo|sahaj] [--threads N] [--batch B] [--steps N]
 *
 * Times whole training steps (masking of the raw tokens, zero_grad, forward,
 * backward, AdamW step) on random tokens and prints one line of key=value
 * pairs like bench_kernels: tokens_per_s (mean over the steps, sequence
 * tokens), best_tokens_per_s (the fastest step), gflops
 * (kern_flops_per_sample), step_ms, cpu_ms (CPU seconds per step),
 * peak_rss_mb.  One warm-up step is not timed.
 * Models (ALBERT, one parameter set shared by all layers):
 *   demo  = E 128, H 256, 4 layers, 4 heads, F 1024, seq 128, vocab 8000
 *   sahaj = sahajBERT (ALBERT-large): E 128, H 1024, 24 layers, 16 heads,
 *           F 4096, seq 512, vocab 32000 (18M parameters) */
#include "kernels/backend.h"
#include "kernels/encoder.h"
#include "kernels/masking.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

/* The config of model name, or 0 for an unknown name. */
static int model_config(const char *name, kern_config *c)
{
	memset(c, 0, sizeof *c);
	c->arch = KERN_ARCH_ALBERT;
	c->n_shared = 1;
	c->d_embed = 128;
	c->type_vocab = 2;
	if (strcmp(name, "demo") == 0) {
		c->n_layer = 4;
		c->n_head = 4;
		c->d_model = 256;
		c->d_ff = 1024;
		c->seq_len = 128;
		c->vocab = 8000;
	} else if (strcmp(name, "sahaj") == 0) {
		c->n_layer = 24;
		c->n_head = 16;
		c->d_model = 1024;
		c->d_ff = 4096;
		c->seq_len = 512;
		c->vocab = 32000;
	} else {
		return 0;
	}
	c->cls_id = 2;
	c->sep_id = 3;
	c->mask_id = 4;
	c->pad_id = 0;
	c->unk_id = 1;
	return 1;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	const char *model = "demo";
	int threads = 2, B = 8, steps = 5;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			model = argv[++i];
		else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
			B = atoi(argv[++i]);
		else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
			steps = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: bench_encoder [--model demo|sahaj] [--threads N] [--batch B] "
			                "[--steps N]\n");
			return 2;
		}
	}
	kern_config c;
	if (!model_config(model, &c) || B < 1 || steps < 1 || threads < 1) {
		fprintf(stderr, "bench_encoder: bad model, batch, steps or threads\n");
		return 2;
	}
	kern_set_threads(threads);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb)) {
		fprintf(stderr, "bench_encoder: %s\n", eb.msg);
		return 1;
	}
	kern_model_init(m, 1);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	int T = c.seq_len, n = kern_mask_raw_per_sample(&c);
	int32_t *raw = malloc((size_t)B * n * 4), *ids = malloc((size_t)B * T * 4),
	        *seg = malloc((size_t)B * T * 4), *lab = malloc((size_t)B * T * 4),
	        *sop = malloc((size_t)B * 4);
	if (!raw || !ids || !seg || !lab || !sop) {
		fprintf(stderr, "bench_encoder: out of memory\n");
		return 1;
	}
	kern_rng r;
	kern_rng_seed(&r, 3);
	double total = 0, best = 1e300, cpu0 = 0;
	for (int s = 0; s <= steps; s++) {
		for (size_t i = 0; i < (size_t)B * n; i++)
			raw[i] = (int32_t)(5 + kern_rng_next(&r) % (uint64_t)(c.vocab - 5));
		if (s == 1)
			cpu0 = cpu_seconds();
		double t0 = now();
		kern_enc_batch b = { ids, seg, lab, sop, NULL };
		kern_enc_result res;
		kern_opt_stats st;
		if (kern_mask_build(&c, 7, 0, s, B, raw, (size_t)n, ids, seg, lab, sop, &eb) ||
		    (kern_zero_grad(m), 0) || kern_enc_forward(m, &b, B, &res, &eb) ||
		    kern_enc_backward_scaled(m, 1, &eb) || kern_opt_step(m, &o, &st, &eb)) {
			fprintf(stderr, "bench_encoder: %s\n", eb.msg);
			return 1;
		}
		double dt = now() - t0;
		if (s == 0)
			continue; /* warm-up */
		total += dt;
		best = dt < best ? dt : best;
	}
	double cpu = cpu_seconds() - cpu0;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double tok = (double)B * T;
	printf("impl=cotrain model=%s threads=%d batch=%d steps=%d tokens_per_s=%.1f best_tokens_per_s=%.1f "
	       "step_ms=%.1f cpu_ms=%.1f gflops=%.2f peak_rss_mb=%.0f params=%zu backend=\"%s\"\n",
	       model, threads, B, steps, tok * steps / total, tok / best, 1000 * total / steps,
	       1000 * cpu / steps, kern_flops_per_sample(&c) * B * steps / total * 1e-9,
	       ru.ru_maxrss / 1024.0, m->n_params, kern_backend_get()->describe());
	kern_model_free(m);
	free(raw);
	free(ids);
	free(seg);
	free(lab);
	free(sop);
	return 0;
}
