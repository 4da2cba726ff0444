/* cotrain kernels: the inner steps of local mode (see local.h). */
#include "kernels/local.h"

#include "kernels/gpu.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct kern_local {
	kern_opt_config inner;
	int inner_batch;
	size_t n;
	float *theta0, *mom1, *mom2; /* one allocation of 3 n floats */
	long lr_step;                /* the round's version */
	long t;                      /* inner steps taken */
	int pending;                 /* microbatches in grads since the last step */
	int64_t pending_samples;
	int64_t samples; /* of the round */
	bool finished;
	/* The parameters and moments are newer on m's GPU: inner steps ran
	 * there (kern_opt_step_gpu) since they were last home. */
	bool dev;
	bool gpu_off; /* the GPU had no room for the moments: CPU steps only */
};

cot_err kern_local_new(const kern_model *m, const kern_opt_config *inner, int inner_batch, kern_local **out,
                       cot_errbuf *eb)
{
	*out = NULL;
	cot_err rc = kern_opt_validate(inner, eb);
	if (rc)
		return rc;
	if (inner_batch < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "inner batch of %d microbatches is below 1",
		                  inner_batch);
	kern_local *l = calloc(1, sizeof *l);
	if (!l)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	l->n = m->n_params;
	l->theta0 = malloc(3 * (l->n ? l->n : 1) * sizeof *l->theta0);
	if (!l->theta0) {
		free(l);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the inner optimizer (%zu parameters)",
		                  m->n_params);
	}
	l->mom1 = l->theta0 + l->n;
	l->mom2 = l->mom1 + l->n;
	l->inner = *inner;
	l->inner_batch = inner_batch;
	l->finished = true; /* until kern_local_begin */
	*out = l;
	return COT_OK;
}

void kern_local_free(kern_local *l)
{
	if (!l)
		return;
	free(l->theta0);
	free(l);
}

/* The round's counters, moments and m->grads back to zero. */
static void reset(kern_local *l, kern_model *m)
{
	memset(l->mom1, 0, 2 * l->n * sizeof *l->mom1);
	l->lr_step = m->step;
	l->t = 0;
	l->pending = 0;
	l->pending_samples = 0;
	l->samples = 0;
	l->finished = false;
	if (l->dev) /* the host's parameters win over the GPU's */
		kern_gpu_params_changed(m);
	l->dev = false;
	kern_zero_grad(m);
}

void kern_local_begin(kern_local *l, kern_model *m)
{
	memcpy(l->theta0, m->params, l->n * sizeof *l->theta0);
	reset(l, m);
}

void kern_local_restart(kern_local *l, kern_model *m)
{
	memcpy(m->params, l->theta0, l->n * sizeof *m->params);
	kern_gpu_params_changed(m);
	reset(l, m);
}

bool kern_local_gpu_off(const kern_local *l) { return l->gpu_off; }

cot_err kern_local_home(kern_local *l, kern_model *m, cot_errbuf *eb)
{
	cot_err rc = kern_gpu_grads_home(m, eb);
	if (rc || !l->dev)
		return rc;
	if ((rc = kern_gpu_opt_moments(m, l->mom1, l->mom2, KERN_GPU_MOM_DOWN, eb)) ||
	    (rc = kern_gpu_params_home(m, eb)))
		return rc;
	l->dev = false;
	return COT_OK;
}

cot_err kern_local_set_inner(kern_local *l, const kern_opt_config *inner, cot_errbuf *eb)
{
	cot_err rc = kern_opt_validate(inner, eb);
	if (rc)
		return rc;
	if (!l->finished && (l->t > 0 || l->pending > 0 || l->samples > 0))
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "the inner optimizer cannot change once a round's inner steps have begun");
	l->inner = *inner;
	return COT_OK;
}

long kern_local_steps(const kern_local *l) { return l->t; }

/* The inner step over the pending microbatches: on m's GPU when the whole
 * gradient is there, else on the CPU (the GPU's state brought home first). */
static cot_err inner_step(kern_local *l, kern_model *m, cot_errbuf *eb)
{
	double s = (double)l->pending_samples;
	cot_err rc;
	if (!l->gpu_off && kern_gpu_can_step(m)) {
		int how = l->dev ? KERN_GPU_MOM_KEEP : l->t == 0 ? KERN_GPU_MOM_ZERO : KERN_GPU_MOM_UP;
		rc = kern_opt_step_gpu(m, &l->inner, l->mom1, l->mom2, how, l->lr_step, l->t + 1, s, NULL,
		                       eb);
		if (!rc) {
			l->dev = true;
			goto stepped;
		}
		if (rc != COT_ERR_NOMEM || l->dev)
			return rc;
		/* no room for the moments there (nothing changed): this
		 * session's inner steps run on the CPU */
		l->gpu_off = true;
		if (eb)
			eb->msg[0] = eb->hint[0] = '\0';
	}
	if ((rc = kern_local_home(l, m, eb)))
		return rc;
	for (size_t i = 0; i < l->n; i++)
		m->grads[i] = (float)((double)m->grads[i] / s);
	rc = kern_opt_step_with(m, &l->inner, l->mom1, l->mom2, l->lr_step, l->t + 1, NULL, eb);
	if (rc)
		return rc;
	kern_zero_grad(m);
stepped:
	l->t++;
	l->pending = 0;
	l->pending_samples = 0;
	return COT_OK;
}

cot_err kern_local_microbatch(kern_local *l, kern_model *m, int64_t samples, cot_errbuf *eb)
{
	if (l->finished)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the round's inner steps are finished");
	l->pending++;
	l->pending_samples += samples;
	l->samples += samples;
	if (l->pending < l->inner_batch)
		return COT_OK;
	return inner_step(l, m, eb);
}

cot_err kern_local_finish(kern_local *l, kern_model *m, int64_t *samples, cot_errbuf *eb)
{
	if (l->finished)
		return cot_seterr(eb, COT_ERR_CONFLICT, "the round's inner steps are finished");
	cot_err rc = l->pending > 0 ? inner_step(l, m, eb) : COT_OK;
	if (!rc && l->dev && !(rc = kern_gpu_params_home(m, eb)))
		l->dev = false;
	if (rc)
		return rc;
	float s = (float)l->samples;
	for (size_t i = 0; i < l->n; i++) {
		float d = l->theta0[i] - m->params[i];
		m->grads[i] = d * s;
	}
	memcpy(m->params, l->theta0, l->n * sizeof *m->params);
	kern_gpu_params_changed(m);
	l->finished = true;
	if (samples)
		*samples = l->samples;
	return COT_OK;
}
