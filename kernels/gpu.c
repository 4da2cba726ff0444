/* cotrain kernels: the CUDA backend's loader and a model's GPU binding.
 * See gpu.h. */
#include "kernels/gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef COTRAIN_CUDA_LIBPATH
#define COTRAIN_CUDA_LIBPATH "" /* a build without CUDA */
#endif

struct kern_gpu_bind {
	const kern_gpu_api *api;
	kern_gpu_model *g;
	int device, precision;
	bool stale;     /* the host's parameters changed since the last upload */
	bool pinned;    /* params and grads pinned for the copies */
	bool keep;      /* steps leave their gradient on the device (kern_gpu_keep_grads) */
	bool held;      /* the device holds a gradient not yet in m->grads */
	bool host_zero; /* m->grads is all zero (kern_gpu_can_step) */
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const kern_gpu_api *loaded;
static char load_why[256];

static void load(void)
{
	const char *path = getenv(KERN_GPU_LIB_ENV);
	if (!path || !*path)
		path = COTRAIN_CUDA_LIBPATH;
	if (!*path) {
		snprintf(load_why, sizeof load_why, "this build has no CUDA backend (configure --with-cuda)");
		return;
	}
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(load_why, sizeof load_why, "the CUDA backend did not load: %s", dlerror());
		return;
	}
	kern_gpu_entry_fn entry = (kern_gpu_entry_fn)dlsym(h, KERN_GPU_ENTRY);
	const kern_gpu_api *api = entry ? entry() : NULL;
	if (!api || api->abi_version != KERN_GPU_ABI_VERSION) {
		snprintf(load_why, sizeof load_why,
		         "%s is not this build's CUDA backend (ABI %d, expected %d)", path,
		         api ? api->abi_version : -1, KERN_GPU_ABI_VERSION);
		dlclose(h);
		return;
	}
	loaded = api; /* the library stays loaded for the process's life */
}

const kern_gpu_api *kern_gpu_api_get(char *why, size_t n)
{
	pthread_once(&load_once, load);
	if (!loaded && why && n)
		snprintf(why, n, "%s", load_why);
	return loaded;
}

int kern_gpu_count(char *why, size_t n)
{
	const kern_gpu_api *api = kern_gpu_api_get(why, n);
	if (!api)
		return 0;
	char err[256] = "";
	int k = api->device_count(err, sizeof err);
	if (k < 0 && why && n)
		snprintf(why, n, "%s", err);
	else if (k == 0 && why && n)
		snprintf(why, n, "no CUDA device is present");
	return k < 0 ? 0 : k;
}

int kern_precision_parse(const char *name)
{
	static const char *names[] = { "fp32", "tf32", "bf16" };
	for (int i = 0; i < 3; i++)
		if (name && strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *kern_precision_name(int precision)
{
	return precision == KERN_PREC_BF16 ? "bf16" : precision == KERN_PREC_TF32 ? "tf32" : "fp32";
}

static cot_err gpu_err(cot_errbuf *eb, int code, const char *what, const char *msg)
{
	cot_err rc = code == KERN_GPU_ENOMEM   ? COT_ERR_NOMEM
	             : code == KERN_GPU_EINVAL ? COT_ERR_INVALID
	                                       : COT_ERR_IO;
	return cot_seterr(eb, rc, "%s: %s", what, msg);
}

cot_err kern_gpu_bind(kern_model *m, int device, int precision, cot_errbuf *eb)
{
	char why[256] = "";
	kern_gpu_unbind(m);
	if (m->max_batch < 1)
		return cot_seterr(eb, COT_ERR_CONFLICT, "cannot bind a model without activations to a GPU");
	int n = kern_gpu_count(why, sizeof why);
	if (n <= 0)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED, "no GPU: %s", why);
	if (device < 0 || device >= n)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED, "GPU %d does not exist (this machine has %d)",
		                  device, n);
	struct kern_gpu_bind *b = calloc(1, sizeof *b);
	if (!b)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	b->api = kern_gpu_api_get(NULL, 0);
	b->device = device;
	b->precision = precision;
	b->stale = true;
	b->host_zero = true;
	for (size_t i = 0; i < m->n_params && b->host_zero; i++)
		b->host_zero = m->grads[i] == 0.0f;
	int code = b->api->model_create(&m->config, m->views, m->n_views, m->max_batch, device, precision,
	                                &b->g, why, sizeof why);
	if (code) {
		free(b);
		return gpu_err(eb, code, "could not put the model on the GPU", why);
	}
	/* pinned, the copies run at the bus's speed; unpinned they still work */
	size_t bytes = m->n_params * sizeof(float);
	if (b->api->host_register(m->params, bytes, 1, why, sizeof why) == 0) {
		if (b->api->host_register(m->grads, bytes, 1, why, sizeof why) == 0)
			b->pinned = true;
		else
			b->api->host_register(m->params, bytes, 0, why, sizeof why);
	}
	m->gpu = b;
	return COT_OK;
}

void kern_gpu_unbind(kern_model *m)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return;
	b->api->model_free(b->g);
	if (b->pinned) {
		char why[256];
		b->api->host_register(m->params, 0, 0, why, sizeof why);
		b->api->host_register(m->grads, 0, 0, why, sizeof why);
	}
	free(b);
	m->gpu = NULL;
}

bool kern_gpu_bound(const kern_model *m) { return m && m->gpu; }

void kern_gpu_params_changed(kern_model *m)
{
	if (m && m->gpu)
		m->gpu->stale = true;
}

/* The parameters up if they changed since the last upload. */
static cot_err params_up(kern_model *m, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m->gpu;
	char why[256] = "";
	int code;
	if (b->stale) {
		if ((code = b->api->set_params(b->g, m->params, why, sizeof why)))
			return gpu_err(eb, code, "GPU", why);
		b->stale = false;
	}
	return COT_OK;
}

/* After a forward: the backward, its gradient added on the device (kept)
 * or into m->grads. */
static cot_err backward_and_take(kern_model *m, float scale, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m->gpu;
	char why[256] = "";
	int code;
	/* from the first addition on, the device's gradient holds this step */
	b->held = b->held || b->keep;
	b->host_zero = b->host_zero && b->keep;
	if ((code = b->api->backward(b->g, scale, why, sizeof why)) ||
	    (!b->keep && (code = b->api->take_grads(b->g, m->grads, 1, why, sizeof why))))
		return gpu_err(eb, code, "GPU", why);
	return COT_OK;
}

cot_err kern_gpu_step(kern_model *m, const int32_t *tokens, const int32_t *targets, int B, float scale,
                      float *loss, cot_errbuf *eb)
{
	char why[256] = "";
	double l = 0;
	int code;
	if (loss)
		*loss = 0;
	if (!m->gpu)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	if (m->config.arch != KERN_ARCH_GPT)
		return cot_seterr(eb, COT_ERR_CONFLICT, "an encoder's microbatch takes kern_gpu_enc_step");
	cot_err rc = params_up(m, eb);
	if (rc)
		return rc;
	if ((code = m->gpu->api->forward(m->gpu->g, tokens, targets, B, &l, why, sizeof why)))
		return gpu_err(eb, code, "GPU", why);
	if ((rc = backward_and_take(m, scale, eb)))
		return rc;
	if (loss)
		*loss = (float)l;
	return COT_OK;
}

cot_err kern_gpu_enc_step(kern_model *m, const kern_enc_batch *batch, int B, float scale,
                          kern_enc_result *res, cot_errbuf *eb)
{
	char why[256] = "";
	double r[KERN_GPU_ENC_RESULTS];
	int code;
	if (res)
		memset(res, 0, sizeof *res);
	if (!m->gpu)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	if (m->config.arch == KERN_ARCH_GPT)
		return cot_seterr(eb, COT_ERR_CONFLICT, "a gpt's microbatch takes kern_gpu_step");
	if (!batch || !batch->ids || !batch->segments || !batch->labels || !batch->sop || batch->lengths)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "an encoder's training batch on the GPU needs ids, segments, MLM and SOP "
		                  "labels, and full-length samples");
	cot_err rc = params_up(m, eb);
	if (rc)
		return rc;
	if ((code = m->gpu->api->enc_forward(m->gpu->g, batch->ids, batch->segments, batch->labels,
	                                     batch->sop, B, r, why, sizeof why)))
		return gpu_err(eb, code, "GPU", why);
	if ((rc = backward_and_take(m, scale, eb)))
		return rc;
	if (res) {
		res->loss = r[0];
		res->mlm_loss = r[1];
		res->sop_loss = r[2];
		res->n_predicted = (int)r[3];
		res->mlm_correct = (int)r[4];
		res->sop_correct = (int)r[5];
	}
	return COT_OK;
}

cot_err kern_gpu_keep_grads(kern_model *m, bool on, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	if (!on) {
		cot_err rc = kern_gpu_grads_home(m, eb);
		if (rc)
			return rc;
	}
	b->keep = on;
	return COT_OK;
}

bool kern_gpu_holds_grads(const kern_model *m) { return m && m->gpu && m->gpu->held; }

cot_err kern_gpu_grads_home(kern_model *m, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b || !b->held)
		return COT_OK;
	char why[256] = "";
	b->host_zero = false;
	int code = b->api->take_grads(b->g, m->grads, 1, why, sizeof why);
	if (code)
		return gpu_err(eb, code, "GPU", why);
	b->held = false;
	return COT_OK;
}

cot_err kern_gpu_sketch_held(kern_model *m, uint64_t seed, int k, double *out, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	if (k < 1 || k > 256)
		return cot_seterr(eb, COT_ERR_INVALID, "a sketch has 1 to 256 values, not %d", k);
	if (!b->held) {
		for (int j = 0; j < k; j++)
			out[j] = 0;
		return COT_OK;
	}
	char why[256] = "";
	int code = b->api->sketch_grads(b->g, seed, k, out, why, sizeof why);
	return code ? gpu_err(eb, code, "GPU", why) : COT_OK;
}

bool kern_gpu_can_step(const kern_model *m) { return m && m->gpu && m->gpu->keep && m->gpu->host_zero; }

void kern_gpu_host_grads_zeroed(kern_model *m)
{
	if (m && m->gpu)
		m->gpu->host_zero = true;
}

cot_err kern_gpu_opt_moments(kern_model *m, float *mom1, float *mom2, int how, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	char why[256] = "";
	int code = b->api->opt_moments(b->g, mom1, mom2, how, why, sizeof why);
	return code ? gpu_err(eb, code, "GPU", why) : COT_OK;
}

cot_err kern_gpu_opt_norm(kern_model *m, double divisor, double *part, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	char why[256] = "";
	int code = b->api->opt_norm(b->g, divisor, part, why, sizeof why);
	return code ? gpu_err(eb, code, "GPU", why) : COT_OK;
}

cot_err kern_gpu_opt_run(kern_model *m, const kern_gpu_opt_pass *p, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	cot_err rc = params_up(m, eb); /* the host's, when they changed there */
	if (rc)
		return rc;
	char why[256] = "";
	int code = b->api->opt_pass(b->g, p, why, sizeof why);
	if (code)
		return gpu_err(eb, code, "GPU", why);
	if (p->pass != KERN_GPU_PASS_LAMB_APPLY)
		b->held = false;
	return COT_OK;
}

cot_err kern_gpu_params_home(kern_model *m, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model is not on a GPU");
	char why[256] = "";
	int code = b->api->get_params(b->g, m->params, why, sizeof why);
	return code ? gpu_err(eb, code, "GPU", why) : COT_OK;
}

cot_err kern_gpu_grads_add(kern_model *m, const float *host, cot_errbuf *eb)
{
	struct kern_gpu_bind *b = m ? m->gpu : NULL;
	if (!b || !b->keep)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the model does not keep its gradient on a GPU");
	char why[256] = "";
	b->held = true;
	int code = b->api->add_grads(b->g, host, why, sizeof why);
	return code ? gpu_err(eb, code, "GPU", why) : COT_OK;
}
