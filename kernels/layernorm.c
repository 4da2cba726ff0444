/* cotrain kernels: layer normalisation.  See layernorm.h. */
#include "kernels/layernorm.h"

#include "kernels/backend.h"
#include "kernels/vecmath.h"

#include <math.h>
#include <stddef.h>

KERN_SIMD static void ln_fwd_row(float *o, float *mean, float *rstd, const float *x, const float *weight,
                                 const float *bias, int C, float eps)
{
	float m = kern_sumf(x, C) / C;
	/* two passes: o holds x - mean while the variance is summed */
	for (int c = 0; c < C; c++)
		o[c] = x[c] - m;
	float v = kern_dotf(o, o, C) / C;
	float s = 1.0f / sqrtf(v + eps);
	for (int c = 0; c < C; c++)
		o[c] = o[c] * s * weight[c] + bias[c];
	*mean = m;
	*rstd = s;
}

void kern_layernorm_forward_eps(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                const float *bias, int N, int C, float eps)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 32) if (nt > 1)
	for (int n = 0; n < N; n++)
		ln_fwd_row(out + (size_t)n * C, &mean[n], &rstd[n], inp + (size_t)n * C, weight, bias, C,
		           eps);
}

void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C)
{
	kern_layernorm_forward_eps(out, mean, rstd, inp, weight, bias, N, C, KERN_LN_EPS);
}

KERN_SIMD static void ln_bwd_row(float *dx, const float *d, const float *x, const float *weight, float m,
                                 float s, int C)
{
	/* the two sums in kern_sumf's order, without scratch memory */
	float a1[16] = { 0 }, a2[16] = { 0 }, t1 = 0.0f, t2 = 0.0f;
	int c = 0;
	for (; c + 16 <= C; c += 16)
		for (int j = 0; j < 16; j++) {
			float dn = d[c + j] * weight[c + j];
			a1[j] += dn;
			a2[j] += dn * ((x[c + j] - m) * s);
		}
	for (; c < C; c++) {
		float dn = d[c] * weight[c];
		t1 += dn;
		t2 += dn * ((x[c] - m) * s);
	}
	for (int w = 8; w >= 1; w /= 2)
		for (int j = 0; j < w; j++) {
			a1[j] += a1[j + w];
			a2[j] += a2[j + w];
		}
	float mean_d = (a1[0] + t1) / C, mean_dx = (a2[0] + t2) / C;
	for (c = 0; c < C; c++) {
		float dn = d[c] * weight[c], xh = (x[c] - m) * s;
		dx[c] += s * (dn - mean_d - xh * mean_dx);
	}
}

/* dweight[0..nc) += sum_n dout * xhat, dbias[0..nc) += sum_n dout over the
 * channels [c0, c0+nc) (dout and inp point at channel c0 of row 0), summed
 * in double in row order. */
KERN_SIMD static void ln_cols(float *dweight, float *dbias, const float *dout, const float *inp,
                              const float *mean, const float *rstd, int N, int C, int nc)
{
	double aw[64] = { 0 }, ab[64] = { 0 };
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
		float m = mean[n], s = rstd[n];
		for (int j = 0; j < nc; j++) {
			aw[j] += d[j] * ((x[j] - m) * s);
			ab[j] += d[j];
		}
	}
	for (int j = 0; j < nc; j++) {
		dweight[j] += (float)aw[j];
		dbias[j] += (float)ab[j];
	}
}

void kern_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C)
{
	int nt = kern_threads();
	/* dinp: rows are independent.  With dnorm = dout * weight and
	 * xhat = (x - mean) * rstd:
	 *   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) */
	/* dweight, dbias: each channel block summed over rows by one thread.
	 * Both loops in one parallel region, without a barrier between them
	 * (they write different arrays): a thread done with rows goes on to
	 * channel blocks. */
	enum { CB = 64 };
	int nblocks = (C + CB - 1) / CB;
#pragma omp parallel num_threads(nt) if (nt > 1)
	{
#pragma omp for schedule(dynamic, 32) nowait
		for (int n = 0; n < N; n++)
			ln_bwd_row(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, weight,
			           mean[n], rstd[n], C);
#pragma omp for schedule(dynamic, 1)
		for (int b = 0; b < nblocks; b++) {
			int c0 = b * CB, nc = C - c0 < CB ? C - c0 : CB;
			ln_cols(dweight + c0, dbias + c0, dout + c0, inp + c0, mean, rstd, N, C, nc);
		}
	}
}
