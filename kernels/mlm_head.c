/* cotrain kernels: the masked-LM head.  See mlm_head.h. */
#include "kernels/mlm_head.h"

#include "kernels/backend.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"

#include <stddef.h>
#include <string.h>

void kern_mlm_head_forward(const kern_mlm_acts *a, const kern_mlm_weights *w, const float *x, int N, int H,
                           int E, int V, int gelu_erf, float eps)
{
	if (gelu_erf) {
		kern_linear_forward(a->pre, x, w->dense_w, w->dense_b, N, H, E);
		kern_gelu_erf_forward(a->act, a->pre, (size_t)N * E);
	} else {
		kern_linear_forward_gelu(a->pre, a->act, x, w->dense_w, w->dense_b, N, H, E);
	}
	kern_layernorm_forward_eps(a->out, a->mean, a->rstd, a->act, w->ln_w, w->ln_b, N, E, eps);
	/* logits[N,V] = bias + out[N,E] @ decoder[V,E]^T */
	kern_backend_get()->sgemm_bias(false, true, N, V, E, 1.0f, a->out, E, w->decoder, E, 0.0f, a->logits,
	                               V, w->bias);
}

void kern_mlm_head_backward_set(float *dx, const kern_mlm_grads *g, const float *dlogits, float *s1,
                                float *s2, const kern_mlm_acts *a, const kern_mlm_weights *w, const float *x,
                                int N, int H, int E, int V, int gelu_erf)
{
	const kern_backend *be = kern_backend_get();
	/* s1 = d out = dlogits @ decoder; d decoder += dlogits^T @ out */
	be->sgemm(false, false, N, E, V, 1.0f, dlogits, V, w->decoder, E, 0.0f, s1, E);
	be->sgemm(true, false, V, E, N, 1.0f, dlogits, V, a->out, E, 1.0f, g->decoder, E);
	kern_colsum_add(g->bias, dlogits, N, V);
	/* s2 = d act through the LayerNorm */
	memset(s2, 0, (size_t)N * E * sizeof(float));
	kern_layernorm_backward(s2, g->ln_w, g->ln_b, s1, a->act, w->ln_w, a->mean, a->rstd, N, E);
	/* s1 = d pre through the GELU */
	if (gelu_erf)
		kern_gelu_erf_backward_set(s1, a->pre, s2, (size_t)N * E);
	else
		kern_gelu_backward_set(s1, a->pre, s2, (size_t)N * E);
	kern_linear_backward_set(dx, g->dense_w, g->dense_b, s1, x, w->dense_w, N, H, E);
}
