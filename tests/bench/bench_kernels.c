/* bench_kernels: training throughput of the kernels on this machine.
 *
 *   bench_kernels [--model demo|sahaj] [--threads N] [--batch B]
 *                 [--steps N] [--optimizer adamw|lamb] [--peak]
 *   bench_kernels --coretype-hint     (kern_blas_coretype_hint, or "none")
 *
 * Times whole training steps (zero_grad, forward, backward, optimizer step)
 * on random tokens and prints one line of key=value pairs:
 *   tokens_per_s (mean over the steps), best_tokens_per_s (the fastest
 *   step: less sensitive to other load on a shared machine), gflops (kern_flops_per_sample: the model's matrix products
 *   counted exactly), step_ms, peak_rss_mb (getrusage), and with --peak the
 *   GFLOP/s of a 2048^3 sgemm through the same backend and threads, the
 *   practical peak the model's figure is a fraction of.
 * Models: demo = 4 layers, width 256, 4 heads, seq 256, vocab 256 (3.3M
 * parameters); sahaj = 6 layers, width 512, 8 heads, seq 256, vocab 256
 * (19M, the size of sahajBERT's shared-layer model).  Default batch 8. */
#include "kernels/backend.h"
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

/* CPU seconds (user + system) this process has used: a step's CPU time,
 * unlike its wall time, does not grow when other processes take the cores */
static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6
	       + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static double peak_gflops(void)
{
	enum { N = 2048 };
	float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N),
	      *c = malloc(sizeof(float) * N * N);
	if (!a || !b || !c) {
		fprintf(stderr, "bench_kernels: out of memory\n");
		exit(1);
	}
	for (long i = 0; i < (long)N * N; i++) {
		a[i] = (float)(i % 17) * 0.01f;
		b[i] = (float)(i % 13) * 0.01f;
	}
	const kern_backend *be = kern_backend_get();
	be->sgemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
	double best = 0;
	for (int r = 0; r < 8; r++) {
		double t0 = now();
		be->sgemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
		double g = 2.0 * N * N * N / (now() - t0) / 1e9;
		best = g > best ? g : best;
	}
	free(a);
	free(b);
	free(c);
	return best;
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_kernels [--model demo|sahaj] [--threads N] "
	        "[--batch B] [--steps N] [--optimizer adamw|lamb] [--peak]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);  /* first: may re-exec with a faster BLAS core */
	const char *model = "demo", *optname = "adamw";
	int threads = 2, B = 8, steps = 5, peak = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc)
			model = argv[++i];
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			B = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--optimizer") && i + 1 < argc)
			optname = argv[++i];
		else if (!strcmp(argv[i], "--peak"))
			peak = 1;
		else if (!strcmp(argv[i], "--coretype-hint")) {
			const char *h = kern_blas_coretype_hint();
			printf("%s\n", h ? h : "none");
			return 0;
		}
		else
			usage();
	}
	kern_config c;
	kern_config_default(&c);
	if (!strcmp(model, "sahaj")) {
		c.n_layer = 6;
		c.n_shared = 6;
		c.n_head = 8;
		c.d_model = 512;
		c.d_ff = 2048;
	} else if (strcmp(model, "demo") != 0) {
		usage();
	}
	kern_opt_config o;
	if (!strcmp(optname, "lamb"))
		kern_opt_default(&o, KERN_OPT_LAMB);
	else if (!strcmp(optname, "adamw"))
		kern_opt_default(&o, KERN_OPT_ADAMW);
	else
		usage();
	if (steps < 1 || B < 1)
		usage();
	kern_set_threads(threads);

	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb)) {
		fprintf(stderr, "bench_kernels: %s\n", eb.msg);
		return 1;
	}
	kern_model_init(m, 1);
	int n = B * c.seq_len;
	int32_t *tok = malloc(sizeof(int32_t) * (n + 1));
	kern_rng rng;
	kern_rng_seed(&rng, 7);
	for (int i = 0; i <= n; i++)
		tok[i] = (int32_t)(kern_rng_next(&rng) % (uint64_t)c.vocab);
	float loss = 0;
	double t_fwd = 0, t_bwd = 0, t_opt = 0, t0 = 0, best = 1e30, cpu0 = 0;
	for (int s = -2; s < steps; s++) {  /* two warm-up steps */
		if (s == 0)
			t0 = now(), cpu0 = cpu_seconds(), t_fwd = t_bwd = t_opt = 0;
		double a = now();
		kern_zero_grad(m);
		if (kern_forward(m, tok, tok + 1, B, &loss, &eb)) {
			fprintf(stderr, "bench_kernels: %s\n", eb.msg);
			return 1;
		}
		double b = now();
		kern_backward(m, &eb);
		double cc = now();
		if (kern_opt_step(m, &o, NULL, &eb)) {
			fprintf(stderr, "bench_kernels: %s\n", eb.msg);
			return 1;
		}
		double d = now();
		t_fwd += b - a;
		t_bwd += cc - b;
		t_opt += d - cc;
		if (s >= 0 && d - a < best)
			best = d - a;
	}
	double dt = now() - t0, cpu = cpu_seconds() - cpu0;
	double tps = (double)n * steps / dt;
	double gflops = kern_flops_per_sample(&c) * B * steps / dt / 1e9;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("impl=cotrain model=%s params=%zu batch=%d seq=%d threads=%d optimizer=%s "
	       "tokens_per_s=%.1f best_tokens_per_s=%.1f gflops=%.1f step_ms=%.1f cpu_ms=%.1f fwd_ms=%.1f bwd_ms=%.1f opt_ms=%.1f "
	       "peak_rss_mb=%.1f loss=%.4f",
	       model, m->n_params, B, c.seq_len, threads, optname, tps, n / best, gflops,
	       dt / steps * 1e3, cpu / steps * 1e3, t_fwd / steps * 1e3, t_bwd / steps * 1e3,
	       t_opt / steps * 1e3, ru.ru_maxrss / 1024.0, loss);
	if (peak)
		printf(" peak_sgemm_gflops=%.1f", peak_gflops());
	printf(" backend=\"%s\"\n", kern_backend_get()->describe());
	free(tok);
	kern_model_free(m);
	return 0;
}
