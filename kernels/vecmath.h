/* cotrain kernels: elementwise math shared by the layers (internal).
 *
 * Our own exp and tanh, made of IEEE basic operations only, for two reasons:
 * the loops that call them vectorise (libm's expf and tanhf do not without
 * -ffast-math), and their results are the same with every C library, so a
 * forward pass gives the same bits on every machine with the same BLAS.
 * Accuracy: kern_expf within 2 ulp over [-87, 88] (inputs are clamped to that
 * range: exp(-87) ~ 1.6e-38 stands for anything smaller); kern_tanhf within
 * 1e-7 absolute.  The library is built with -ffp-contract=off so that no
 * compiler fuses a multiply-add differently on another CPU. */
#ifndef KERN_VECMATH_H
#define KERN_VECMATH_H

#include <stdint.h>

/* Hot elementwise loops are compiled for AVX-512, AVX2 and baseline x86-64,
 * the best chosen at load time (an ifunc), since the library is built for
 * baseline x86-64.  The clones give identical results: contraction is off
 * and every operation is IEEE-exact or done in a fixed order. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERN_SIMD __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define KERN_SIMD
#endif

static inline float kern_expf(float x)
{
	union {
		int32_t i;
		float f;
	} s;
	x = x < -87.0f ? -87.0f : x;
	x = x > 88.0f ? 88.0f : x;
	/* x = n ln2 + r, |r| <= ln2/2; n rounded to nearest by the 1.5*2^23
	 * trick (|x log2 e| < 2^22) */
	float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	float r = x - n * 0.693359375f;
	r = r - n * -2.12194440e-4f;
	/* Cephes' minimax polynomial for exp(r) */
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	s.i = ((int32_t)n + 127) << 23;
	return p * s.f;
}

static inline float kern_tanhf(float x)
{
	float e = kern_expf(2.0f * x);
	return 1.0f - 2.0f / (e + 1.0f);
}

/* The largest of x[0..n), n >= 1, in 16 lanes (a serial max does not
 * vectorise); a maximum is exact in any order. */
static inline float kern_maxf(const float *x, int n)
{
	float lane[16], mx;
	int i = 0;
	for (int l = 0; l < 16; l++)
		lane[l] = x[0];
	for (; i + 16 <= n; i += 16)
		for (int l = 0; l < 16; l++)
			lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
	mx = lane[0];
	for (int l = 1; l < 16; l++)
		mx = lane[l] > mx ? lane[l] : mx;
	for (; i < n; i++)
		mx = x[i] > mx ? x[i] : mx;
	return mx;
}

/* Sum of x[0..n) in a fixed order (16 interleaved partial sums, combined
 * pairwise), so that the loop vectorises and gives the same result at any
 * vector width. */
static inline float kern_sumf(const float *x, int n)
{
	float acc[16] = { 0 };
	int i = 0;
	for (; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += x[i + j];
	float tail = 0.0f;
	for (; i < n; i++)
		tail += x[i];
	for (int w = 8; w >= 1; w /= 2)
		for (int j = 0; j < w; j++)
			acc[j] += acc[j + w];
	return acc[0] + tail;
}

/* Sum of x[i] * y[i], in the order of kern_sumf. */
static inline float kern_dotf(const float *x, const float *y, int n)
{
	float acc[16] = { 0 };
	int i = 0;
	for (; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += x[i + j] * y[i + j];
	float tail = 0.0f;
	for (; i < n; i++)
		tail += x[i] * y[i];
	for (int w = 8; w >= 1; w /= 2)
		for (int j = 0; j < w; j++)
			acc[j] += acc[j + w];
	return acc[0] + tail;
}

#endif
