/* bench_sketch: what the microbatch sketches of spot checks cost a host
 * (doc/credit.md, "Spot checks"), beside the work they ride on.
 *
 *   bench_sketch [--model demo|sahaj] [--batch B] [--threads N] [--k K] [--steps N]
 *                [--round M] [--block b] [--peers P]
 *
 * A host sketches its gradient sum after every microbatch it computes
 * (client/compute.c): one sketch_add over the n parameters.  This times,
 * on random tokens, a microbatch's forward and backward (the reference)
 * and that sketch, and prints one line of key=value pairs: params,
 * microbatch_ms, sketch_ms, sketch_share (sketch / (microbatch + sketch)),
 * and report_bytes_per_mb (the JSON the report carries per microbatch).
 * Then what the check under a second seed adds to a member's round of M
 * microbatches (doc/credit.md, "A second seed, drawn after the bytes are
 * pinned"; default M 32, b 2, P 4), off its critical path: the sketches
 * under the second seed, and their JSON, of M / b kept blocks, of the
 * group's sum as received and, as the aggregator of 1 / P of the vector,
 * of P members' slices (client/round_seed2.c, cl_seed2_sketches_json):
 * seed2_ms, seed2_share (seed2 / (M microbatches)), seed2_bytes (the
 * body's sketches) and kept_mb (what the member keeps until then).
 * Models: demo = packaging/demo/project.json's (4 layers, width 128, seq
 * 128, batch 8: 0.8M parameters); sahaj = 6 layers, width 512, seq 256
 * (19M, the 18M-class model of bench_kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/round_seed2.h"
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

/* Time the sketches under a second seed of a member's round (see above):
 * *secs, the JSON's bytes, and the bytes the member keeps.  1 when memory
 * ran out. */
static int seed2_round(const float *grad, size_t n, int k, int round_mb, int block, int peers, double *secs,
                       size_t *bytes, size_t *kept)
{
	cl_seed2_kept kp = { .k = k, .n = n, .blocks_ok = 1 };
	size_t nb = (size_t)((round_mb + block - 1) / block);
	kp.blocks = calloc(nb, sizeof *kp.blocks);
	kp.received = malloc(n * sizeof *kp.received);
	if (!kp.blocks || !kp.received)
		return 1;
	memcpy(kp.received, grad, n * sizeof *kp.received);
	for (size_t b = 0; b < nb; b++) {
		kp.blocks[b] = (cl_block){ .first = (int64_t)b * block, .count = block };
		if (!(kp.blocks[b].grad = malloc(n * sizeof(float))))
			return 1;
		memcpy(kp.blocks[b].grad, grad, n * sizeof(float));
		kp.n_blocks++;
	}
	for (int a = 0; a < peers; a++) {
		kp.agg_id[a] = a + 1;
		kp.agg_lo[a] = n * (size_t)a / (size_t)peers;
		kp.agg_hi[a] = n * (size_t)(a + 1) / (size_t)peers;
	}
	kp.n_aggs = (size_t)peers;
	kp.lo = kp.agg_lo[0];
	kp.hi = kp.agg_hi[0];
	size_t len = (size_t)(kp.hi - kp.lo);
	kp.slices = calloc((size_t)peers, sizeof *kp.slices);
	kp.slice_host = calloc((size_t)peers, sizeof *kp.slice_host);
	kp.slice_err = calloc((size_t)peers, sizeof *kp.slice_err);
	if (!kp.slices || !kp.slice_host || !kp.slice_err)
		return 1;
	for (int i = 0; i < peers; i++) {
		kp.slice_host[i] = i + 1;
		if (!(kp.slices[i] = malloc((len ? len : 1) * sizeof(float))))
			return 1;
		memcpy(kp.slices[i], grad, len * sizeof(float));
		kp.n_slices++;
	}
	*kept = (nb + 1) * n * sizeof(float);
	double a = now();
	json_t *j = cl_seed2_sketches_json(&kp, 0x5eed2);
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	*secs = now() - a;
	*bytes = text ? strlen(text) : 0;
	free(text);
	json_decref(j);
	cl_seed2_kept_free(&kp);
	return *bytes == 0;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: bench_sketch [--model demo|sahaj] [--batch B] [--threads N] [--k K] [--steps N]\n"
	        "                    [--round M] [--block b] [--peers P]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *model = "demo";
	int B = 0, threads = 1, k = 16, steps = 5, round_mb = 32, block = 2, peers = 4;
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
		else if (i + 1 < argc && !strcmp(argv[i], "--round"))
			round_mb = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--block"))
			block = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--peers"))
			peers = atoi(argv[++i]);
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
	if (B < 1 || steps < 1 || k < 1 || k > SKETCH_K_MAX || threads < 1 || round_mb < 1 || block < 1 ||
	    peers < 1 || peers > CL_PLAN_MAX_MEMBERS)
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
	double t2 = 0;
	size_t bytes = 0, kept = 0;
	if (seed2_round(m->grads, m->n_params, k, round_mb, block, peers, &t2, &bytes, &kept))
		return 1;
	printf("round=%d block=%d peers=%d seed2_ms=%.2f seed2_share=%.4f seed2_bytes=%zu kept_mb=%.1f\n",
	       round_mb, block, peers, t2 * 1e3, t2 / (t2 + round_mb * t_mb / steps), bytes,
	       (double)kept / 1e6);
	free(tok);
	kern_model_free(m);
	return 0;
}
