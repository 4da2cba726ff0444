/* cotrain client: the benchmark (see benchmark.h). */
#include "client/benchmark.h"

#include <stdlib.h>

#include "client/backoff.h"
#include "kernels/backend.h"
#include "kernels/gpu.h"
#include "kernels/model.h"
#include "kernels/stream_step.h"

/* FLOP/s of steps of model c at batch B, on the GPU device when it is
 * not negative. */
static double time_steps(const kern_config *c, int B, int device, double seconds, cot_errbuf *eb)
{
	int T = c->seq_len;
	kern_model *m;
	if (kern_model_create(c, B, &m, eb))
		return 0;
	kern_model_init(m, 1);
	if (device >= 0 && kern_gpu_bind(m, device, KERN_PREC_FP32, eb)) {
		kern_model_free(m);
		return 0;
	}
	int32_t *tok = malloc(sizeof *tok * (size_t)(B * T + 1));
	if (!tok) {
		kern_model_free(m);
		cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the benchmark");
		return 0;
	}
	for (int i = 0; i < B * T + 1; i++)
		tok[i] = (i * 7919 + 13) % 256;
	float loss;
	/* One warm-up step, not timed: first-touch page faults, BLAS start-up. */
	if (kern_stream_step(m, tok, tok + 1, B, 1, 0, 1, 1.0f, &loss, eb)) {
		free(tok);
		kern_model_free(m);
		return 0;
	}
	double t0 = cl_now_mono(), t;
	long steps = 0;
	do {
		if (kern_stream_step(m, tok, tok + 1, B, 1, 0, 1, 1.0f, &loss, eb)) {
			free(tok);
			kern_model_free(m);
			return 0;
		}
		steps++;
		t = cl_now_mono() - t0;
	} while (steps < 3 || t < seconds);
	double flops = kern_flops_per_sample(c) * B * steps / (t > 1e-9 ? t : 1e-9);
	free(tok);
	kern_model_free(m);
	return flops;
}

double cl_benchmark(int threads, double seconds, cot_errbuf *eb)
{
	kern_config c = { .n_layer = 2,
		          .n_shared = 2,
		          .n_head = 4,
		          .d_model = 128,
		          .seq_len = 64,
		          .vocab = 256,
		          .d_ff = 512 };
	kern_set_threads(threads);
	return time_steps(&c, 4, -1, seconds, eb);
}

double cl_benchmark_gpu(int device, double seconds, cot_errbuf *eb)
{
	kern_config c = { .n_layer = 4,
		          .n_shared = 4,
		          .n_head = 8,
		          .d_model = 512,
		          .seq_len = 256,
		          .vocab = 256,
		          .d_ff = 2048 };
	return time_steps(&c, 16, device, seconds, eb);
}
