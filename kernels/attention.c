/* cotrain kernels: causal multi-head self-attention.  See attention.h.
 *
 * Each (sample, head) pair is one OpenMP task that runs its products (the
 * backend's single-threaded sgemm_serial, one call per row block, reading
 * q, k, v in place through strides: no copies) and its softmax back to
 * back, so that the pair's scores stay in cache between them. */
#include "kernels/attention.h"

#include "kernels/backend.h"
#include "kernels/vecmath.h"

#include <math.h>
#include <stddef.h>

/* End of the row block holding row t. */
static inline int block_end(int t, int T)
{
	int r1 = (t / KERN_ATT_BLOCK + 1) * KERN_ATT_BLOCK;
	return r1 < T ? r1 : T;
}

/* Causal softmax of one row of scores p[0..n), n = t + 1, zeroing the
 * masked columns [n, r1) that the next product reads. */
KERN_SIMD static void softmax_row(float *p, int n, int r1)
{
	float mx = kern_maxf(p, n);
	for (int j = 0; j < n; j++)
		p[j] = kern_expf(p[j] - mx);
	float inv = 1.0f / kern_sumf(p, n);
	for (int j = 0; j < n; j++)
		p[j] *= inv;
	for (int j = n; j < r1; j++)
		p[j] = 0.0f;
}

/* d[0..n) = scale * p * (d - sum_j p d), zero on [n, r1). */
KERN_SIMD static void softmax_back_row(float *d, const float *p, int n, int r1, float scale)
{
	float dot = kern_dotf(p, d, n);
	for (int j = 0; j < n; j++)
		d[j] = scale * p[j] * (d[j] - dot);
	for (int j = n; j < r1; j++)
		d[j] = 0.0f;
}

/* Pointers of one (sample b, head h) pair: q, k, v and dq, dk, dv are row
 * T*3C apart in qkv/dqkv, dy and y rows C apart, p and dp [T,T]. */
typedef struct {
	const float *q, *k, *v, *p, *dy;
	float *dq, *dk, *dv, *dp, *y, *pw;
} pair_ptrs;

static pair_ptrs pair_at(long pair, int T, int C, int NH, const float *qkv, float *dqkv, const float *att,
                         float *attw, const float *dy, float *y, float *datt)
{
	long b = pair / NH, h = pair % NH, hd = C / NH, C3 = 3L * C, TT = (long)T * T;
	size_t x3 = (size_t)(b * T * C3 + h * hd), x1 = (size_t)(b * T * C + h * hd);
	pair_ptrs pp = { 0 };
	pp.q = qkv + x3;
	pp.k = qkv + x3 + C;
	pp.v = qkv + x3 + 2 * C;
	if (dqkv) {
		pp.dq = dqkv + x3;
		pp.dk = dqkv + x3 + C;
		pp.dv = dqkv + x3 + 2 * C;
	}
	pp.p = att ? att + pair * TT : NULL;
	pp.pw = attw ? attw + pair * TT : NULL;
	pp.dp = datt ? datt + pair * TT : NULL;
	pp.dy = dy ? dy + x1 : NULL;
	pp.y = y ? y + x1 : NULL;
	return pp;
}

/* Every (sample, head) pair is one task: its products, by row block, and
 * its softmax, while its [T,T] scores are in this core's cache; pairs are
 * handed out to threads as they come free.  Each product is the call the
 * batched version made for that pair, so results do not depend on the
 * thread count. */
void kern_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = kern_threads();
	float scale = 1.0f / sqrtf((float)hd);
	long npairs = (long)B * NH;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && npairs > 1)
	for (long pair = 0; pair < npairs; pair++) {
		pair_ptrs pp = pair_at(pair, T, C, NH, qkv, NULL, NULL, att, NULL, out, NULL);
		for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
			int r1 = block_end(r0, T);
			/* S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T */
			be->sgemm_serial(false, true, r1 - r0, r1, hd, scale, pp.q + (size_t)r0 * C3, C3,
			                 pp.k, C3, 0.0f, pp.pw + (size_t)r0 * T, T);
			for (int t = r0; t < r1; t++)
				softmax_row(pp.pw + (size_t)t * T, t + 1, r1);
			/* out[r0:r1] = P[r0:r1, 0:r1] V[0:r1] */
			be->sgemm_serial(false, false, r1 - r0, hd, r1, 1.0f, pp.pw + (size_t)r0 * T, T, pp.v,
			                 C3, 0.0f, pp.y + (size_t)r0 * C, C);
		}
	}
}

/* beta 1: dqkv += gradient; beta 0: dqkv = gradient (each element of dq,
 * dk and dv is written by exactly one product). */
static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH, float beta)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = kern_threads();
	float scale = 1.0f / sqrtf((float)hd);
	long npairs = (long)B * NH;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && npairs > 1)
	for (long pair = 0; pair < npairs; pair++) {
		pair_ptrs pp = pair_at(pair, T, C, NH, qkv, dqkv, att, NULL, dout, NULL, datt);
		for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
			int r1 = block_end(r0, T);
			/* dP[r0:r1, 0:r1] = dY[r0:r1] V[0:r1]^T */
			be->sgemm_serial(false, true, r1 - r0, r1, hd, 1.0f, pp.dy + (size_t)r0 * C, C, pp.v,
			                 C3, 0.0f, pp.dp + (size_t)r0 * T, T);
			/* dS = scale * P * (dP - sum_j P dP), the score scale folded in */
			for (int t = r0; t < r1; t++)
				softmax_back_row(pp.dp + (size_t)t * T, pp.p + (size_t)t * T, t + 1, r1,
				                 scale);
			/* dQ[r0:r1] += dS[r0:r1, 0:r1] K[0:r1] */
			be->sgemm_serial(false, false, r1 - r0, hd, r1, 1.0f, pp.dp + (size_t)r0 * T, T, pp.k,
			                 C3, beta, pp.dq + (size_t)r0 * C3, C3);
		}
		/* By column block [c0, c1), only rows t >= c0 are non-zero:
		 * dK[c0:c1] += dS[c0:T, c0:c1]^T Q[c0:T]
		 * dV[c0:c1] += P[c0:T, c0:c1]^T dY[c0:T] */
		for (int c0 = 0; c0 < T; c0 += KERN_ATT_BLOCK) {
			int c1 = block_end(c0, T);
			be->sgemm_serial(true, false, c1 - c0, hd, T - c0, 1.0f, pp.dp + (size_t)c0 * T + c0,
			                 T, pp.q + (size_t)c0 * C3, C3, beta, pp.dk + (size_t)c0 * C3, C3);
			be->sgemm_serial(true, false, c1 - c0, hd, T - c0, 1.0f, pp.p + (size_t)c0 * T + c0,
			                 T, pp.dy + (size_t)c0 * C, C, beta, pp.dv + (size_t)c0 * C3, C3);
		}
	}
}

void kern_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                             int B, int T, int C, int NH)
{
	attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, 1.0f);
}

void kern_attention_backward_set(float *dqkv, float *datt, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH)
{
	attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, 0.0f);
}
