/* bench_sketch: what the microbatch sketches of spot checks cost a host
 * (doc/credit.md, "Spot checks"), beside the work they ride on.
 *
 *   bench_sketch [--model demo|sahaj] [--batch B] [--threads N] [--k K] [--steps N]
 *
 * A host sketches its gradient sum after every microbatch it computes
 * (client/compute.c): one sketch_add over the n parameters.  This times,
 * on random tokens, a microbatch's forward and backward (the reference)
 * and that sketch, and prints one line of key=value pairs: params,
 * microbatch_ms, sketch_ms, sketch_share (sketch / (microbatch + sketch)),
 * and report_bytes_per_mb (the JSON the report carries per microbatch).
 * Models: demo = packaging/demo/project.json's (4 layers, width 128, seq
 * 128, batch 8: 0.8M parameters); sahaj = 6 layers, width 512, seq 256
 * (19M, the 18M-class model of bench_kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/model.h"
#include "kernels/rng.h"
#include "shared/common/sketch.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: bench_sketch [--model demo|sahaj] [--batch B] [--threads N] [--k K] [--steps N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *model = "demo";
	int B = 0, threads = 1, k = 16, steps = 5;
	for (int i = 1; i < argc; i++) {
		if (i + 1 < argc && !strcmp(argv[i], "--model"))
			model = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--batch"))
			B = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
			threads = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--k"))
			k = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--steps"))
			steps = atoi(argv[++i]);
		else
			usage();
	}
	kern_config c;
	kern_config_default(&c);
	if (!strcmp(model, "demo")) {
		c.n_layer = c.n_shared = 4;
		c.n_head = 4;
		c.d_model = 128;
		c.d_ff = 512;
		c.seq_len = 128;
		c.vocab = 256;
		B = B ? B : 8;
	} else if (!strcmp(model, "sahaj")) {
		c.n_layer = c.n_shared = 6;
		c.n_head = 8;
		c.d_model = 512;
		c.d_ff = 2048;
		B = B ? B : 4;
	} else {
		usage();
	}
	if (B < 1 || steps < 1 || k < 1 || k > SKETCH_K_MAX || threads < 1)
		usage();
	kern_set_threads(threads);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb)) {
		fprintf(stderr, "bench_sketch: %s\n", eb.msg);
		return 1;
	}
	kern_model_init(m, 1);
	int n = B * c.seq_len;
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n + 1));
	if (!tok)
		return 1;
	kern_rng rng;
	kern_rng_seed(&rng, 7);
	for (int i = 0; i <= n; i++)
		tok[i] = (int32_t)(kern_rng_next(&rng) % (uint64_t)c.vocab);
	double t_mb = 0, t_sk = 0, acc[SKETCH_K_MAX] = { 0 };
	float loss = 0;
	kern_zero_grad(m);
	for (int s = -1; s < steps; s++) { /* one warm-up */
		double a = now();
		if (kern_forward(m, tok, tok + 1, B, &loss, &eb) || kern_backward(m, &eb)) {
			fprintf(stderr, "bench_sketch: %s\n", eb.msg);
			return 1;
		}
		double b = now();
		memset(acc, 0, sizeof acc);
		sketch_add(m->grads, m->n_params, 0, 12345, k, acc);
		double d = now();
		if (s >= 0) {
			t_mb += b - a;
			t_sk += d - b;
		}
	}
	/* A sketch value as the report writes it: %.17g, a comma. */
	char buf[64];
	size_t row = 2;
	for (int j = 0; j < k; j++)
		row += (size_t)snprintf(buf, sizeof buf, "%.17g,", acc[j]);
	printf("model=%s params=%zu batch=%d seq=%d threads=%d k=%d microbatch_ms=%.2f sketch_ms=%.3f "
	       "sketch_share=%.4f report_bytes_per_mb=%zu loss=%.4f\n",
	       model, m->n_params, B, c.seq_len, threads, k, t_mb / steps * 1e3, t_sk / steps * 1e3,
	       t_sk / (t_mb + t_sk), row, loss);
	free(tok);
	kern_model_free(m);
	return 0;
}
