/* cotrain kernels: bidirectional attention.  See attention_full.h. */
#include "kernels/attention_full.h"

#include "kernels/backend.h"
#include "kernels/vecmath.h"

#include <math.h>
#include <stddef.h>

/* Rows of scores handled together, so that a block's scores stay in cache
 * between its product and its softmax. */
#define ROW_BLOCK 64

/* Softmax of one row p[0..n) in place, and p[n..T) = 0. */
KERN_SIMD static void softmax_row(float *p, int n, int T)
{
	float mx = kern_maxf(p, n);
	for (int j = 0; j < n; j++)
		p[j] = kern_expf(p[j] - mx);
	float inv = 1.0f / kern_sumf(p, n);
	for (int j = 0; j < n; j++)
		p[j] *= inv;
	for (int j = n; j < T; j++)
		p[j] = 0.0f;
}

/* d[0..n) = scale * p * (d - sum_j p d) */
KERN_SIMD static void softmax_back_row(float *d, const float *p, int n, float scale)
{
	float dot = kern_dotf(p, d, n);
	for (int j = 0; j < n; j++)
		d[j] = scale * p[j] * (d[j] - dot);
}

void kern_attention_full_backward_set(float *dqkv, float *datt, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = kern_threads();
	float scale = 1.0f / sqrtf((float)hd);
	long npairs = (long)B * NH;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && npairs > 1)
	for (long pair = 0; pair < npairs; pair++) {
		long b = pair / NH, h = pair % NH;
		size_t x3 = (size_t)(b * T * C3 + h * hd), x1 = (size_t)(b * T * C + h * hd);
		const float *q = qkv + x3, *k = q + C, *v = q + 2 * C, *dy = dout + x1;
		const float *p = att + (size_t)pair * T * T;
		float *dq = dqkv + x3, *dk = dq + C, *dv = dq + 2 * C, *dp = datt + (size_t)pair * T * T;
		for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
			int nr = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK;
			/* dP[r0:r0+nr, :] = dY[r0:r0+nr] V^T */
			be->sgemm_serial(false, true, nr, T, hd, 1.0f, dy + (size_t)r0 * C, C, v, C3, 0.0f,
			                 dp + (size_t)r0 * T, T);
			/* dS = scale * P * (dP - sum_j P dP), the score scale folded in */
			for (int t = r0; t < r0 + nr; t++)
				softmax_back_row(dp + (size_t)t * T, p + (size_t)t * T, T, scale);
			/* dQ[r0:r0+nr] = dS[r0:r0+nr, :] K */
			be->sgemm_serial(false, false, nr, hd, T, 1.0f, dp + (size_t)r0 * T, T, k, C3, 0.0f,
			                 dq + (size_t)r0 * C3, C3);
		}
		/* dK = dS^T Q, dV = P^T dY */
		be->sgemm_serial(true, false, T, hd, T, 1.0f, dp, T, q, C3, 0.0f, dk, C3);
		be->sgemm_serial(true, false, T, hd, T, 1.0f, p, T, dy, C, 0.0f, dv, C3);
	}
}

/* The relative term of row t of one head's scores: s[j] += rs (q_t . D[t-j+T-1]
 * [+ k_j . D[t-j+T-1]]) for j in [0, T); q row t and k rows at stride C3. */
KERN_SIMD static void rel_scores_row(float *s, const float *qt, const float *k, const float *dist, int t,
                                     int T, int hd, int C3, float rs, int key_query)
{
	for (int j = 0; j < T; j++) {
		const float *d = dist + (size_t)(t - j + T - 1) * hd;
		float r = kern_dotf(qt, d, hd);
		if (key_query)
			r += kern_dotf(k + (size_t)j * C3, d, hd);
		s[j] += rs * r;
	}
}

/* The forward of both kinds: dist NULL for absolute positions (no relative
 * term, the same operations in the same order as before it existed). */
static void attention_forward(float *out, float *att, const float *qkv, const float *dist,
                              const int32_t *lens, int B, int T, int C, int NH, float rs, int key_query)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = kern_threads();
	float scale = 1.0f / sqrtf((float)hd);
	long npairs = (long)B * NH;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && npairs > 1)
	for (long pair = 0; pair < npairs; pair++) {
		long b = pair / NH, h = pair % NH;
		const float *q = qkv + (size_t)(b * T * C3 + h * hd), *k = q + C, *v = q + 2 * C;
		float *p = att + (size_t)pair * T * T, *y = out + (size_t)(b * T * C + h * hd);
		int n = lens ? lens[b] : T;
		for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
			int nr = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK;
			/* S[r0:r0+nr, :] = scale * Q[r0:r0+nr] K^T + the relative term */
			be->sgemm_serial(false, true, nr, T, hd, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f,
			                 p + (size_t)r0 * T, T);
			for (int t = r0; t < r0 + nr; t++) {
				if (dist)
					rel_scores_row(p + (size_t)t * T, q + (size_t)t * C3, k, dist, t, T,
					               hd, C3, rs, key_query);
				softmax_row(p + (size_t)t * T, n, T);
			}
			/* Y[r0:r0+nr] = P[r0:r0+nr, :] V */
			be->sgemm_serial(false, false, nr, hd, T, 1.0f, p + (size_t)r0 * T, T, v, C3, 0.0f,
			                 y + (size_t)r0 * C, C);
		}
	}
}

void kern_attention_full_forward(float *out, float *att, const float *qkv, const int32_t *lens, int B, int T,
                                 int C, int NH)
{
	attention_forward(out, att, qkv, NULL, lens, B, T, C, NH, 0.0f, 0);
}

void kern_attention_full_rel_forward(float *out, float *att, const float *qkv, const float *dist,
                                     const int32_t *lens, int B, int T, int C, int NH, float rs,
                                     int key_query)
{
	attention_forward(out, att, qkv, dist, lens, B, T, C, NH, rs, key_query);
}

/* y[0..n) += a x[0..n) */
KERN_SIMD static void axpy(float *y, float a, const float *x, int n)
{
	for (int i = 0; i < n; i++)
		y[i] += a * x[i];
}

void kern_attention_full_rel_backward(float *dqkv, float *ddist, float *datt, const float *dout,
                                      const float *qkv, const float *dist, const float *att, int B, int T,
                                      int C, int NH, float rs, int key_query)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = kern_threads();
	float scale = 1.0f / sqrtf((float)hd);
	long npairs = (long)B * NH;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && npairs > 1)
	for (long pair = 0; pair < npairs; pair++) {
		long b = pair / NH, h = pair % NH;
		size_t x3 = (size_t)(b * T * C3 + h * hd), x1 = (size_t)(b * T * C + h * hd);
		const float *q = qkv + x3, *k = q + C, *v = q + 2 * C, *dy = dout + x1;
		const float *p = att + (size_t)pair * T * T;
		float *dq = dqkv + x3, *dk = dq + C, *dv = dq + 2 * C, *dp = datt + (size_t)pair * T * T;
		/* dP = dY V^T; dS = P * (dP - sum_j P dP), unscaled: the two terms of
		 * the score take their own scales below */
		be->sgemm_serial(false, true, T, T, hd, 1.0f, dy, C, v, C3, 0.0f, dp, T);
		for (int t = 0; t < T; t++)
			softmax_back_row(dp + (size_t)t * T, p + (size_t)t * T, T, 1.0f);
		/* dQ = scale dS K, dK = scale dS^T Q, dV = P^T dY */
		be->sgemm_serial(false, false, T, hd, T, scale, dp, T, k, C3, 0.0f, dq, C3);
		be->sgemm_serial(true, false, T, hd, T, scale, dp, T, q, C3, 0.0f, dk, C3);
		be->sgemm_serial(true, false, T, hd, T, 1.0f, p, T, dy, C, 0.0f, dv, C3);
		/* dq_t += rs sum_j dS[t,j] D[t-j+T-1]; key_query: dk_j likewise */
		for (int t = 0; t < T; t++)
			for (int j = 0; j < T; j++) {
				float g = rs * dp[(size_t)t * T + j];
				const float *d = dist + (size_t)(t - j + T - 1) * hd;
				axpy(dq + (size_t)t * C3, g, d, hd);
				if (key_query)
					axpy(dk + (size_t)j * C3, g, d, hd);
			}
	}
	/* dD[r] += rs sum over (b, h, t, j) with t - j + T - 1 = r of dS[b,h,t,j]
	 * (q_t [+ k_j]): one thread per row r, in a fixed order */
	int R = 2 * T - 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && R > 1)
	for (int r = 0; r < R; r++) {
		float *dd = ddist + (size_t)r * hd;
		int off = r - (T - 1); /* t - j */
		for (long pair = 0; pair < npairs; pair++) {
			long b = pair / NH, h = pair % NH;
			const float *q = qkv + (size_t)(b * T * C3 + h * hd), *k = q + C;
			const float *dp = datt + (size_t)pair * T * T;
			for (int t = off > 0 ? off : 0; t < T && t - off < T; t++) {
				int j = t - off;
				float g = rs * dp[(size_t)t * T + j];
				axpy(dd, g, q + (size_t)t * C3, hd);
				if (key_query)
					axpy(dd, g, k + (size_t)j * C3, hd);
			}
		}
	}
}
