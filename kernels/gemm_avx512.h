/* cotrain kernels: the AVX-512 helpers that the AVX-512 kernel
 * (gemm_avx512.c) and the AMX kernel (gemm_amx.c) share: the edge masks,
 * the 16 x 16 transpose, the column sums of op(B) and the epilogue's row
 * store.  Private to those two files; static inline, so that they inline
 * into both kernels' loops (each carries its file's target attribute or a
 * subset of it). */
#ifndef KERN_GEMM_AVX512_H
#define KERN_GEMM_AVX512_H

#include "kernels/gemm_kernel.h"

#if GEMM_X86

/* The first n (clamped to 0..16) lanes of a vector. */
static inline __mmask16 mask_n(int n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* Transpose 16 x 16: on entry r[i] is row i, on return r[k] is column k
 * (lane i = old row i). */
GEMM_AVX512 static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
	__m512 t[16];
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	/* r[4i + e], 128-bit lane j: rows 4i..4i+3 of column 4j + e */
	for (int i = 0; i < 4; i++) {
		r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
		r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
		r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
		r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
	}
	for (int e = 0; e < 4; e++) {
		t[e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
		t[4 + e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
		t[8 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
		t[12 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
	}
	for (int e = 0; e < 4; e++) {
		r[e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0x88);
		r[8 + e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0xdd);
		r[4 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0x88);
		r[12 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0xdd);
	}
}

/* sum[0], sum[1] += the 16 floats of x (lanes 0-7, 8-15), in double:
 * one row of kern_colsum_add's additions. */
GEMM_AVX512 static inline void colsum_add16(__m512d sum[2], __m512 x)
{
	sum[0] = _mm512_add_pd(sum[0], _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
	sum[1] = _mm512_add_pd(sum[1], _mm512_cvtps_pd(_mm256_castpd_ps(
	                                       _mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}

/* colsum[j0 + j] += sum's lane j (of GEMM_NR), for the panel's nr columns. */
GEMM_AVX512 static inline void colsum_flush(const gemm_args *g, int j0, int nr, const __m512d sum[4])
{
	double out[GEMM_NR];
	for (int q = 0; q < 4; q++)
		_mm512_storeu_pd(out + 8 * q, sum[q]);
	for (int j = 0; j < nr; j++)
		g->colsum[j0 + j] += (float)out[j];
}

/* One row of the epilogue: c[0..nr) = base + alpha * acc, where base is
 * c's old value (later K blocks, or beta 1), beta * c, r, plus bias when
 * given (first block only), or nothing (beta 0, no bias). */
GEMM_AVX512 static inline void store_row(float *c, const float *r, const float *bias, __m512 v0, __m512 v1,
                                         __mmask16 m0, __mmask16 m1, float alpha, float beta, bool first)
{
	if (alpha != 1.0f) {
		__m512 al = _mm512_set1_ps(alpha);
		v0 = _mm512_mul_ps(al, v0);
		v1 = _mm512_mul_ps(al, v1);
	}
	if (!first) {
		v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, c), v0);
		v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, c + 16), v1);
	} else {
		bool have = true;
		__m512 b0, b1;
		if (r) {
			b0 = _mm512_maskz_loadu_ps(m0, r);
			b1 = _mm512_maskz_loadu_ps(m1, r + 16);
		} else if (beta == 0.0f) {
			have = false;
			b0 = b1 = _mm512_setzero_ps();
		} else if (beta == 1.0f) {
			b0 = _mm512_maskz_loadu_ps(m0, c);
			b1 = _mm512_maskz_loadu_ps(m1, c + 16);
		} else {
			__m512 be = _mm512_set1_ps(beta);
			b0 = _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m0, c));
			b1 = _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m1, c + 16));
		}
		if (bias) {
			__m512 x0 = _mm512_maskz_loadu_ps(m0, bias);
			__m512 x1 = _mm512_maskz_loadu_ps(m1, bias + 16);
			b0 = have ? _mm512_add_ps(b0, x0) : x0;
			b1 = have ? _mm512_add_ps(b1, x1) : x1;
			have = true;
		}
		if (have) {
			v0 = _mm512_add_ps(b0, v0);
			v1 = _mm512_add_ps(b1, v1);
		}
	}
	_mm512_mask_storeu_ps(c, m0, v0);
	_mm512_mask_storeu_ps(c + 16, m1, v1);
}

#endif
#endif
