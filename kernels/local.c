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

void kern_local_begin(kern_local *l, kern_model *m)
{
	memcpy(l->theta0, m->params, l->n * sizeof *l->theta0);
	memset(l->mom1, 0, 2 * l->n * sizeof *l->mom1);
	l->lr_step = m->step;
	l->t = 0;
	l->pending = 0;
	l->pending_samples = 0;
	l->samples = 0;
	l->finished = false;
	kern_zero_grad(m);
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

/* The inner step over the pending microbatches. */
static cot_err inner_step(kern_local *l, kern_model *m, cot_errbuf *eb)
{
	double s = (double)l->pending_samples;
	for (size_t i = 0; i < l->n; i++)
		m->grads[i] = (float)((double)m->grads[i] / s);
	cot_err rc = kern_opt_step_with(m, &l->inner, l->mom1, l->mom2, l->lr_step, l->t + 1, NULL, eb);
	if (rc)
		return rc;
	l->t++;
	l->pending = 0;
	l->pending_samples = 0;
	kern_zero_grad(m);
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
	if (l->pending > 0) {
		cot_err rc = inner_step(l, m, eb);
		if (rc)
			return rc;
	}
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
