/* bench_kernels: training throughput of the kernels on this machine.
 *
 *   bench_kernels [--model demo|sahaj] [--threads N] [--batch B]
 *                 [--steps N] [--optimizer adamw|lamb] [--peak]
 *   bench_kernels --coretype-hint     (kern_blas_coretype_hint, or "none")
 *   bench_kernels --cpu-peak          (cores, clock, FMA rate: the fp32 peak)
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

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

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
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

/* CPU seconds of the calling thread: what one core delivered to it,
 * whatever else ran on the machine meanwhile */
static double thread_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The core clock in GHz while running scalar code: a chain of dependent
 * 64-bit multiplies, 3 cycles each on every x86-64 core of the last decade
 * (a chain of adds would not do: recent cores fold immediate adds away). */
static double clock_ghz(void)
{
	uint64_t x = 1, m = 3;
	long n = 1000000;
	double t0 = thread_seconds();
	for (long i = 0; i < n; i++)
		__asm__ volatile(
#define MUL10 \
	"imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t" \
	"imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
		        MUL10 MUL10 MUL10 MUL10 MUL10
		        : "+r"(x)
		        : "r"(m));
#undef MUL10
	return 3 * 50.0 * n / (thread_seconds() - t0) / 1e9;
}

/* fp32 FLOP/s one core reaches on fused multiply-adds alone (independent
 * accumulators in registers, no memory): cores x this is the machine's
 * peak, i.e. clock x FMA units x vector lanes x 2, as the hardware delivers
 * it under a full vector load. */
__attribute__((target("avx512f"))) static double fma_gflops_avx512(void)
{
	__m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
	__m512 a0 = m, a1 = m, a2 = m, a3 = m, a4 = m, a5 = m, a6 = m, a7 = m, a8 = m, a9 = m, a10 = m,
	       a11 = m;
	long n = 4000000;
	double t0 = thread_seconds();
	for (long k = 0; k < n; k++) {
		__asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
		__asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
		a0 = _mm512_fmadd_ps(a0, m, c);
		a1 = _mm512_fmadd_ps(a1, m, c);
		a2 = _mm512_fmadd_ps(a2, m, c);
		a3 = _mm512_fmadd_ps(a3, m, c);
		a4 = _mm512_fmadd_ps(a4, m, c);
		a5 = _mm512_fmadd_ps(a5, m, c);
		a6 = _mm512_fmadd_ps(a6, m, c);
		a7 = _mm512_fmadd_ps(a7, m, c);
		a8 = _mm512_fmadd_ps(a8, m, c);
		a9 = _mm512_fmadd_ps(a9, m, c);
		a10 = _mm512_fmadd_ps(a10, m, c);
		a11 = _mm512_fmadd_ps(a11, m, c);
	}
	double dt = thread_seconds() - t0;
	__asm__ volatile("" : : "v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5));
	__asm__ volatile("" : : "v"(a6), "v"(a7), "v"(a8), "v"(a9), "v"(a10), "v"(a11));
	return 12.0 * 16 * 2 * n / dt / 1e9;
}

__attribute__((target("avx2,fma"))) static double fma_gflops_avx2(void)
{
	__m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
	__m256 a0 = m, a1 = m, a2 = m, a3 = m, a4 = m, a5 = m, a6 = m, a7 = m, a8 = m, a9 = m, a10 = m,
	       a11 = m;
	long n = 8000000;
	double t0 = thread_seconds();
	for (long k = 0; k < n; k++) {
		__asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
		__asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
		a0 = _mm256_fmadd_ps(a0, m, c);
		a1 = _mm256_fmadd_ps(a1, m, c);
		a2 = _mm256_fmadd_ps(a2, m, c);
		a3 = _mm256_fmadd_ps(a3, m, c);
		a4 = _mm256_fmadd_ps(a4, m, c);
		a5 = _mm256_fmadd_ps(a5, m, c);
		a6 = _mm256_fmadd_ps(a6, m, c);
		a7 = _mm256_fmadd_ps(a7, m, c);
		a8 = _mm256_fmadd_ps(a8, m, c);
		a9 = _mm256_fmadd_ps(a9, m, c);
		a10 = _mm256_fmadd_ps(a10, m, c);
		a11 = _mm256_fmadd_ps(a11, m, c);
	}
	double dt = thread_seconds() - t0;
	__asm__ volatile("" : : "x"(a0), "x"(a1), "x"(a2), "x"(a3), "x"(a4), "x"(a5));
	__asm__ volatile("" : : "x"(a6), "x"(a7), "x"(a8), "x"(a9), "x"(a10), "x"(a11));
	return 12.0 * 8 * 2 * n / dt / 1e9;
}

/* Prints the CPU's theoretical fp32 peak, measured: cores, clock, and the
 * per-core FMA rate (best of a few tries, each on one thread's CPU time, so
 * that other load on the machine does not lower it). */
static void print_cpu_peak(void)
{
	__builtin_cpu_init();
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	const char *isa = "none";
	double ghz = 0, core_gf = 0;
	for (int r = 0; r < 5; r++) {
		double g = clock_ghz(), f = 0;
		if (__builtin_cpu_supports("avx512f"))
			f = fma_gflops_avx512(), isa = "avx512";
		else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
			f = fma_gflops_avx2(), isa = "avx2";
		ghz = g > ghz ? g : ghz;
		core_gf = f > core_gf ? f : core_gf;
	}
	printf("cores=%ld clock_ghz=%.2f fma_isa=%s core_fma_gflops=%.1f "
	       "flops_per_cycle=%.1f cpu_peak_gflops=%.1f\n",
	       cores, ghz, isa, core_gf, ghz > 0 ? core_gf / ghz : 0, cores * core_gf);
}
#else
static void print_cpu_peak(void) { printf("cores=%ld cpu_peak_gflops=0\n", sysconf(_SC_NPROCESSORS_ONLN)); }
#endif

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
	kern_blas_reexec_if_needed(argc, argv); /* first: may re-exec with a faster BLAS core */
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
		else if (!strcmp(argv[i], "--cpu-peak")) {
			print_cpu_peak();
			return 0;
		} else if (!strcmp(argv[i], "--coretype-hint")) {
			const char *h = kern_blas_coretype_hint();
			printf("%s\n", h ? h : "none");
			return 0;
		} else
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
	for (int s = -2; s < steps; s++) { /* two warm-up steps */
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
	       "tokens_per_s=%.1f best_tokens_per_s=%.1f gflops=%.1f step_ms=%.1f cpu_ms=%.1f fwd_ms=%.1f "
	       "bwd_ms=%.1f opt_ms=%.1f "
	       "peak_rss_mb=%.1f loss=%.4f",
	       model, m->n_params, B, c.seq_len, threads, optname, tps, n / best, gflops, dt / steps * 1e3,
	       cpu / steps * 1e3, t_fwd / steps * 1e3, t_bwd / steps * 1e3, t_opt / steps * 1e3,
	       ru.ru_maxrss / 1024.0, loss);
	if (peak)
		printf(" peak_sgemm_gflops=%.1f", peak_gflops());
	printf(" backend=\"%s\"\n", kern_backend_get()->describe());
	free(tok);
	kern_model_free(m);
	return 0;
}
