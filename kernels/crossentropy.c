/* cotrain kernels: tied output head and cross-entropy.  See crossentropy.h. */
#include "kernels/crossentropy.h"

#include "kernels/backend.h"
#include "kernels/vecmath.h"

#include <math.h>
#include <stddef.h>

void kern_head_forward(float *logits, const float *x, const float *wte, int N, int C, int V)
{
	kern_backend_get()->sgemm(false, true, N, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
}

void kern_head_backward(float *dx, float *dwte, const float *dlogits, const float *x, const float *wte, int N,
                        int C, int V)
{
	const kern_backend *be = kern_backend_get();
	be->sgemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 1.0f, dx, C);
	be->sgemm(true, false, V, C, N, 1.0f, dlogits, V, x, C, 1.0f, dwte, C);
}

/* Returns the sum of exp(l[j] - max) over l[0..V), summed in kern_sumf's
 * order; *mx receives the max. */
KERN_SIMD static float row_sumexp(const float *l, int V, float *mx)
{
	float m = l[0];
	for (int j = 1; j < V; j++)
		m = l[j] > m ? l[j] : m;
	float acc[16] = { 0 }, tail = 0.0f;
	int j = 0;
	for (; j + 16 <= V; j += 16)
		for (int i = 0; i < 16; i++)
			acc[i] += kern_expf(l[j + i] - m);
	for (; j < V; j++)
		tail += kern_expf(l[j] - m);
	for (int w = 8; w >= 1; w /= 2)
		for (int i = 0; i < w; i++)
			acc[i] += acc[i + w];
	*mx = m;
	return acc[0] + tail;
}

double kern_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N, int V)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16) if (nt > 1)
	for (int n = 0; n < N; n++) {
		const float *l = logits + (size_t)n * V;
		float mx, sum = row_sumexp(l, V, &mx);
		losses[n] = (mx + logf(sum)) - l[targets[n]];
	}
	double total = 0;
	for (int n = 0; n < N; n++)
		total += losses[n];
	return total / N;
}

KERN_SIMD static void ce_back_row(float *d, const float *l, int target, float dloss, int V, int acc)
{
	/* the softmax is recomputed rather than stored by the forward */
	float mx, inv = 1.0f / row_sumexp(l, V, &mx);
	if (acc)
		for (int j = 0; j < V; j++)
			d[j] += dloss * (kern_expf(l[j] - mx) * inv);
	else
		for (int j = 0; j < V; j++)
			d[j] = dloss * (kern_expf(l[j] - mx) * inv);
	d[target] -= dloss;
}

static void ce_backward(float *dlogits, const float *logits, const int32_t *targets, float dloss, int N,
                        int V, int acc)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16) if (nt > 1)
	for (int n = 0; n < N; n++) {
		ce_back_row(dlogits + (size_t)n * V, logits + (size_t)n * V, targets[n], dloss, V, acc);
	}
}

void kern_crossentropy_backward(float *dlogits, const float *logits, const int32_t *targets, float dloss,
                                int N, int V)
{
	ce_backward(dlogits, logits, targets, dloss, N, V, 1);
}

void kern_crossentropy_backward_set(float *dlogits, const float *logits, const int32_t *targets, float dloss,
                                    int N, int V)
{
	ce_backward(dlogits, logits, targets, dloss, N, V, 0);
}
