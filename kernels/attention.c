/* cotrain kernels: causal multi-head self-attention.  See attention.h.
 *
 * The four products per head go to the backend as batched GEMMs over all
 * (sample, head) pairs at once, one call per row block, reading q, k, v in
 * place through strides (no copies); the softmax and its backward run
 * between them, OpenMP over rows. */
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
	float mx = p[0];
	for (int j = 1; j < n; j++)
		mx = p[j] > mx ? p[j] : mx;
	for (int j = 0; j < n; j++)
		p[j] = kern_expf(p[j] - mx);
	float inv = 1.0f / kern_sumf(p, n);
	for (int j = 0; j < n; j++)
		p[j] *= inv;
	for (int j = n; j < r1; j++)
		p[j] = 0.0f;
}

/* d[0..n) = scale * p * (d - sum_j p d), zero on [n, r1). */
KERN_SIMD static void softmax_back_row(float *d, const float *p, int n, int r1,
                                       float scale)
{
	float dot = kern_dotf(p, d, n);
	for (int j = 0; j < n; j++)
		d[j] = scale * p[j] * (d[j] - dot);
	for (int j = n; j < r1; j++)
		d[j] = 0.0f;
}

/* Batch layout over (sample b, head h): x is a [B,T,width] activation whose
 * head h starts at channel h*hd; att-shaped operands are [B,NH,T,T]. */
static kern_batch pairs(int B, int NH, int T, long a_w, long a_hd, long b_w,
                        long b_hd, long c_w, long c_hd)
{
	kern_batch bt = { B, NH, T * a_w, a_hd, T * b_w, b_hd, T * c_w, c_hd };
	return bt;
}

void kern_attention_forward(float *out, float *att, const float *qkv,
                            int B, int T, int C, int NH)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = be->threads();
	float scale = 1.0f / sqrtf((float)hd);
	long TT = (long)T * T;
	const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
	/* S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T: A = q (rows 3C apart,
	 * head h at h*hd), B = k, C = att (T*T per head) */
	kern_batch qk = pairs(B, NH, T, C3, hd, C3, hd, NH * (long)T, TT);
	for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
		int r1 = block_end(r0, T);
		be->sgemm_batched(false, true, r1 - r0, r1, hd, scale,
		                  q + (size_t)r0 * C3, C3, k, C3,
		                  0.0f, att + (size_t)r0 * T, T, &qk);
	}
	#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
	for (long row = 0; row < (long)B * NH * T; row++) {
		int t = (int)(row % T);
		softmax_row(att + row * T, t + 1, block_end(t, T));
	}
	/* out[r0:r1] = P[r0:r1, 0:r1] V[0:r1] */
	kern_batch pv = pairs(B, NH, T, NH * (long)T, TT, C3, hd, C, hd);
	for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
		int r1 = block_end(r0, T);
		be->sgemm_batched(false, false, r1 - r0, hd, r1, 1.0f,
		                  att + (size_t)r0 * T, T, v, C3,
		                  0.0f, out + (size_t)r0 * C, C, &pv);
	}
}

void kern_attention_backward(float *dqkv, float *datt, const float *dout,
                             const float *qkv, const float *att,
                             int B, int T, int C, int NH)
{
	const kern_backend *be = kern_backend_get();
	int hd = C / NH, C3 = 3 * C, nt = be->threads();
	float scale = 1.0f / sqrtf((float)hd);
	long TT = (long)T * T, NT = NH * (long)T;
	const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
	float *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
	/* dP[r0:r1, 0:r1] = dY[r0:r1] V[0:r1]^T */
	kern_batch dp = pairs(B, NH, T, C, hd, C3, hd, NT, TT);
	for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
		int r1 = block_end(r0, T);
		be->sgemm_batched(false, true, r1 - r0, r1, hd, 1.0f,
		                  dout + (size_t)r0 * C, C, v, C3,
		                  0.0f, datt + (size_t)r0 * T, T, &dp);
	}
	/* softmax backward, the score scale folded in:
	 * dS = scale * P * (dP - sum_j P dP) */
	#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
	for (long row = 0; row < (long)B * NH * T; row++) {
		int t = (int)(row % T);
		softmax_back_row(datt + row * T, att + row * T, t + 1, block_end(t, T),
		                 scale);
	}
	/* dQ[r0:r1] += dS[r0:r1, 0:r1] K[0:r1] */
	kern_batch dqb = pairs(B, NH, T, NT, TT, C3, hd, C3, hd);
	for (int r0 = 0; r0 < T; r0 += KERN_ATT_BLOCK) {
		int r1 = block_end(r0, T);
		be->sgemm_batched(false, false, r1 - r0, hd, r1, 1.0f,
		                  datt + (size_t)r0 * T, T, k, C3,
		                  1.0f, dq + (size_t)r0 * C3, C3, &dqb);
	}
	/* By column block [c0, c1), only rows t >= c0 are non-zero:
	 * dK[c0:c1] += dS[c0:T, c0:c1]^T Q[c0:T]
	 * dV[c0:c1] += P[c0:T, c0:c1]^T dY[c0:T] */
	kern_batch dkb = pairs(B, NH, T, NT, TT, C3, hd, C3, hd);
	kern_batch dvb = pairs(B, NH, T, NT, TT, C, hd, C3, hd);
	for (int c0 = 0; c0 < T; c0 += KERN_ATT_BLOCK) {
		int c1 = block_end(c0, T);
		be->sgemm_batched(true, false, c1 - c0, hd, T - c0, 1.0f,
		                  datt + (size_t)c0 * T + c0, T, q + (size_t)c0 * C3, C3,
		                  1.0f, dk + (size_t)c0 * C3, C3, &dkb);
		be->sgemm_batched(true, false, c1 - c0, hd, T - c0, 1.0f,
		                  att + (size_t)c0 * T + c0, T, dout + (size_t)c0 * C, C,
		                  1.0f, dv + (size_t)c0 * C3, C3, &dvb);
	}
}
