/* Training speed of the CUDA backend on one GPU.
 *
 *   bench_gpu [--model gpt2|gpt2-bytes|sahaj|sahajbert|demo] [--batch B] [--precision fp32|tf32|bf16]
 *             [--steps N] [--client] [--local]
 *
 * Times N microbatches (forward and backward on the GPU, after two
 * warm-ups) with the device's events, and prints training tokens/s and the
 * model FLOP utilisation (kern_flops_per_sample over the time, against the
 * card's dense peak for the precision: H100/H200 SXM 989 TFLOP/s bf16, 495
 * tf32, 67 fp32).  Then the CPU side of a step at that size: the gradient
 * copied back (and added into the host's), the parameters copied up, and
 * the deterministic CPU AdamW step, each as a fraction of the GPU's step.
 * With COTRAIN_CUDA_PROFILE=1, also the last step's time by kind of work
 * (events between the launches, kern_gpu_api's profile).  With --client,
 * also a microbatch as the client computes one in sync mode, sketched
 * (k 16) as every checked project's are, wall-clock: the gradient copied
 * down after each and sketched on the CPU (the client before the GPU
 * kept it), against the gradient kept on the GPU and sketched there,
 * brought home every 16 microbatches (kern_gpu_keep_grads).  With
 * --local, a microbatch as the client computes one in local mode (an inner
 * AdamW step every 4, kernels/local.h), wall-clock over 16 and the round's
 * end: the inner steps on the CPU with each microbatch's gradient copied
 * down (the client before they moved) against the inner steps on the GPU.
 * The reference beside it is PyTorch on the same GPU, same model, batch and
 * sequence (tests/bench/bench_gpu_torch.py); tests/gpu-device-check.sh
 * runs both in one call and prints the ratios.
 *
 * Shapes (GPT-2 layout, kern_config):
 *   gpt2        12 layers, d 768, 12 heads, T 1024, vocab 50257, B 16
 *   gpt2-bytes  the same with the byte vocabulary (256)
 *   sahaj       24 layers sharing one set, d 1024, 16 heads, d_ff 4096,
 *               T 512, vocab 32000, B 16 (sahajBERT's sizes, causal)
 *   sahajbert   sahajBERT itself: the ALBERT encoder of those sizes with
 *               the factorised embedding E 128, trained on masked language
 *               modelling and sentence order (kern_mask_build's batches);
 *               the reference is Hugging Face's AlbertForPreTraining
 *   demo        kern_config_default, B 16 */
#include "kernels/backend.h"
#include "kernels/gpu.h"
#include "kernels/local.h"
#include "kernels/masking.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"
#include "kernels/stream_step.h"
#include "shared/common/sketch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static int shape(const char *name, kern_config *c, int *B)
{
	kern_config_default(c);
	*B = 16;
	if (strcmp(name, "demo") == 0)
		return 0;
	if (strncmp(name, "gpt2", 4) == 0) {
		c->n_layer = c->n_shared = 12;
		c->n_head = 12;
		c->d_model = 768;
		c->d_ff = 3072;
		c->seq_len = 1024;
		c->vocab = strcmp(name, "gpt2-bytes") == 0 ? 256 : 50257;
		return strcmp(name, "gpt2") == 0 || strcmp(name, "gpt2-bytes") == 0 ? 0 : -1;
	}
	if (strcmp(name, "sahaj") == 0 || strcmp(name, "sahajbert") == 0) {
		if (name[5] == 'b') {
			c->arch = KERN_ARCH_ALBERT;
			c->d_embed = 128;
			c->type_vocab = 2;
			c->cls_id = 2;
			c->sep_id = 3;
			c->mask_id = 4;
			c->pad_id = 0;
			c->unk_id = 1;
		}
		c->n_layer = 24;
		c->n_shared = 1;
		c->n_head = 16;
		c->d_model = 1024;
		c->d_ff = 4096;
		c->seq_len = 512;
		c->vocab = 32000;
		return 0;
	}
	return -1;
}

/* Wall-clock ms per microbatch of n on m (bound to GPU 0), each sketched
 * with k 16: kept on the GPU (sketched there, home every 16) or not
 * (copied down, sketched on the CPU). */
static double client_microbatch(kern_model *m, const int32_t *tok, int B, bool keep, int n, cot_errbuf *eb)
{
	double sk[16] = { 0 }, now16[16];
	if (kern_gpu_keep_grads(m, keep, eb))
		return -1;
	double t0 = now();
	for (int i = 0; i < n; i++) {
		float loss;
		if (kern_stream_step(m, tok, tok + 1, B, 1, i, 1000, 1.0f, &loss, eb))
			return -1;
		if (keep) {
			if (kern_gpu_sketch_held(m, 77, 16, now16, eb) ||
			    ((i + 1) % 16 == 0 && kern_gpu_grads_home(m, eb)))
				return -1;
		} else {
			sketch_add(m->grads, m->n_params, 0, 77, 16, sk);
		}
	}
	if (kern_gpu_grads_home(m, eb))
		return -1;
	return (now() - t0) * 1e3 / n;
}

/* Wall-clock ms per microbatch of n on m (bound to GPU 0) in local mode,
 * an inner AdamW step every 4 and kern_local_finish at the end: on the GPU
 * (the gradient kept there) or, on_gpu false, on the CPU with each
 * microbatch's gradient copied down. */
static double local_microbatch(kern_model *m, const int32_t *tok, int B, bool on_gpu, int n, cot_errbuf *eb)
{
	kern_opt_config oc;
	kern_opt_default(&oc, KERN_OPT_ADAMW);
	kern_local *l;
	if (kern_local_new(m, &oc, 4, &l, eb))
		return -1;
	double ms = -1;
	if (kern_gpu_keep_grads(m, on_gpu, eb))
		goto out;
	kern_local_begin(l, m);
	double t0 = now();
	for (int i = 0; i < n; i++) {
		float loss;
		if (kern_stream_step(m, tok, tok + 1, B, 1, i, 1000, 1.0f, &loss, eb) ||
		    kern_local_microbatch(l, m, B, eb))
			goto out;
	}
	int64_t s;
	if (kern_local_finish(l, m, &s, eb))
		goto out;
	if (on_gpu && kern_local_gpu_off(l))
		cot_seterr(eb, COT_ERR_NOMEM, "the GPU had no room for the inner moments");
	else
		ms = (now() - t0) * 1e3 / n;
out:
	kern_local_free(l);
	return ms;
}

int main(int argc, char **argv)
{
	const char *model = "gpt2", *prec_name = "bf16";
	int B = 0, steps = 10;
	bool client = false, local = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			model = argv[++i];
		else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
			B = atoi(argv[++i]);
		else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc)
			prec_name = argv[++i];
		else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (strcmp(argv[i], "--client") == 0)
			client = true;
		else if (strcmp(argv[i], "--local") == 0)
			local = true;
		else {
			fprintf(stderr,
			        "usage: bench_gpu [--model gpt2|gpt2-bytes|sahaj|sahajbert|demo] [--batch B] "
			        "[--precision fp32|tf32|bf16] [--steps N] [--client] [--local]\n");
			return 2;
		}
	}
	kern_config c;
	int defB;
	int prec = kern_precision_parse(prec_name);
	if (shape(model, &c, &defB) || prec < 0 || steps < 1) {
		fprintf(stderr, "bench_gpu: unknown model, precision or step count\n");
		return 2;
	}
	if (B < 1)
		B = defB;
	char why[256] = "";
	const kern_gpu_api *api = kern_gpu_api_get(why, sizeof why);
	if (!api || kern_gpu_count(why, sizeof why) < 1) {
		printf("bench_gpu: SKIP: %s\n", why);
		return 0;
	}
	kern_gpu_info info;
	char err[256] = "";
	api->device_info(0, &info, err, sizeof err);
	cot_errbuf eb = { "", "" };
	kern_model *m;
	if (kern_model_create(&c, 0, &m, &eb)) {
		fprintf(stderr, "bench_gpu: %s\n", eb.msg);
		return 1;
	}
	kern_model_init(m, 1);
	kern_gpu_model *g;
	int rc = api->model_create(&c, m->views, m->n_views, B, 0, prec, &g, err, sizeof err);
	if (rc) {
		printf("bench_gpu: %s %s B %d: %s\n", model, prec_name, B, err);
		return 1;
	}
	/* as kern_gpu_bind does: the host's buffers pinned for the copies */
	api->host_register(m->params, m->n_params * sizeof(float), 1, err, sizeof err);
	api->host_register(m->grads, m->n_params * sizeof(float), 1, err, sizeof err);
	size_t BT = (size_t)B * c.seq_len;
	int32_t *tok = malloc((BT + 1) * sizeof *tok);
	kern_rng r;
	kern_rng_seed(&r, 5);
	for (size_t i = 0; i <= BT; i++)
		tok[i] = (int32_t)(kern_rng_next(&r) % (uint64_t)c.vocab);
	double loss = 0, fwd = 0, bwd = 0, ms[2], res[KERN_GPU_ENC_RESULTS];
	/* an encoder's masked batch, from the same tokens */
	bool enc = c.arch != KERN_ARCH_GPT;
	int32_t *ids = malloc(4 * BT * sizeof *ids);
	if (!ids) {
		fprintf(stderr, "bench_gpu: out of memory\n");
		return 1;
	}
	int32_t *segs = ids + BT, *labels = ids + 2 * BT, *sop = ids + 3 * BT;
	if (enc && kern_mask_build(&c, 1, 0, 0, B, tok, (size_t)c.seq_len, ids, segs, labels, sop, &eb)) {
		fprintf(stderr, "bench_gpu: %s\n", eb.msg);
		return 1;
	}
	rc = api->set_params(g, m->params, err, sizeof err);
	for (int s = 0; !rc && s < steps + 2; s++) {
		if (enc) {
			rc = api->enc_forward(g, ids, segs, labels, sop, B, res, err, sizeof err);
			loss = res[0];
		} else {
			rc = api->forward(g, tok, tok + 1, B, &loss, err, sizeof err);
		}
		if (!rc)
			rc = api->backward(g, 1.0f, err, sizeof err);
		api->last_timings(g, ms);
		if (s >= 2) {
			fwd += ms[0];
			bwd += ms[1];
		}
	}
	if (rc) {
		printf("bench_gpu: %s %s B %d: %s\n", model, prec_name, B, err);
		return 1;
	}
	double step_s = (fwd + bwd) / steps / 1e3;
	double peak = prec == KERN_PREC_BF16 ? 989e12 : prec == KERN_PREC_TF32 ? 495e12 : 67e12;
	double flops = kern_flops_per_sample(&c) * B;
	/* the CPU side of one step at this size */
	double t0 = now();
	rc = api->take_grads(g, m->grads, 1, err, sizeof err);
	double t_grads = now() - t0;
	kern_opt_config oc;
	kern_opt_default(&oc, KERN_OPT_ADAMW);
	t0 = now();
	kern_opt_step(m, &oc, NULL, &eb);
	double t_opt = now() - t0;
	t0 = now();
	if (!rc)
		rc = api->set_params(g, m->params, err, sizeof err);
	double t_up = now() - t0;
	printf("bench_gpu: %s on %s, %s, %zu params, B %d T %d: %.0f tokens/s, step %.1f ms (forward %.1f, "
	       "backward %.1f), %.1f TFLOP/s, MFU %.1f%% of %.0f; loss %.3f\n",
	       model, info.name, prec_name, m->n_params, B, c.seq_len, BT / step_s, step_s * 1e3, fwd / steps,
	       bwd / steps, flops / step_s / 1e12, 100 * flops / step_s / peak, peak / 1e12, loss);
	const char *const *pn;
	const double *pms;
	int np = api->profile(g, &pn, &pms);
	if (np > 0) { /* COTRAIN_CUDA_PROFILE=1: the last step by kind of work */
		printf("bench_gpu: %s profile of one step:", model);
		for (int k = 0; k < np; k++)
			printf(" %s %.1f ms;", pn[k], pms[k]);
		printf("\n");
	}
	printf("bench_gpu: %s CPU side per step: gradient down %.1f ms (%.0f%% of the GPU step), CPU AdamW "
	       "%.1f ms (%.0f%%) on %d threads, parameters up %.1f ms (%.0f%%)\n",
	       model, t_grads * 1e3, 100 * t_grads / step_s, t_opt * 1e3, 100 * t_opt / step_s,
	       kern_threads(), t_up * 1e3, 100 * t_up / step_s);
	api->model_free(g);
	free(ids);
	api->host_register(m->params, 0, 0, err, sizeof err);
	api->host_register(m->grads, 0, 0, err, sizeof err);
	kern_model_free(m);
	if (!rc && (client || local)) {
		/* the client's own path: a model with activations, bound */
		if (kern_model_create(&c, B, &m, &eb)) {
			printf("bench_gpu: %s client path: %s\n", model, eb.msg);
			free(tok);
			return 1;
		}
		kern_model_init(m, 1);
		if (kern_gpu_bind(m, 0, prec, &eb)) {
			printf("bench_gpu: %s client path: %s\n", model, eb.msg);
			kern_model_free(m);
			free(tok);
			return 1;
		}
		if (client) {
			double before = client_microbatch(m, tok, B, false, 4, &eb);
			double kept = before < 0 ? -1 : client_microbatch(m, tok, B, true, 32, &eb);
			if (kept < 0)
				printf("bench_gpu: %s client path: %s\n", model, eb.msg);
			else
				printf("bench_gpu: %s client microbatch, sketched: "
				       "%.1f ms with the gradient copied down and sketched on the CPU, "
				       "%.1f ms kept and sketched on the GPU (%.2fx); "
				       "GPU step %.1f ms\n",
				       model, before, kept, before / kept, step_s * 1e3);
			rc = kept < 0;
		}
		if (!rc && local) {
			/* a warm-up first: the GPU's moments are allocated once a session */
			double cpu = local_microbatch(m, tok, B, true, 4, &eb) < 0
			                     ? -1
			                     : local_microbatch(m, tok, B, false, 16, &eb);
			double gpu = cpu < 0 ? -1 : local_microbatch(m, tok, B, true, 16, &eb);
			if (gpu < 0)
				printf("bench_gpu: %s local mode: %s\n", model, eb.msg);
			else
				printf("bench_gpu: %s local-mode microbatch (an inner AdamW step every 4): "
				       "%.1f ms with the inner steps on the CPU, "
				       "%.1f ms on the GPU (%.2fx); "
				       "GPU step %.1f ms\n",
				       model, cpu, gpu, cpu / gpu, step_s * 1e3);
			rc = gpu < 0;
		}
		kern_model_free(m);
	}
	free(tok);
	return rc ? 1 : 0;
}
