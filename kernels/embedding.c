/* cotrain kernels: token and position embeddings.  See embedding.h. */
#include "kernels/embedding.h"

#include "kernels/backend.h"

#include <stddef.h>

void kern_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                            int T, int C)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 64) if (nt > 1)
	for (int bt = 0; bt < B * T; bt++) {
		float *o = out + (size_t)bt * C;
		const float *te = wte + (size_t)tokens[bt] * C;
		const float *pe = wpe + (size_t)(bt % T) * C;
		for (int c = 0; c < C; c++)
			o[c] = te[c] + pe[c];
	}
}

void kern_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                             int C)
{
	/* Several positions may hold the same token, so threads split the
	 * channels, never the positions: no two threads touch one element and
	 * every element is summed in (b, t) order. */
	enum { CB = 32 };
	int nt = kern_threads();
	int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
	for (int blk = 0; blk < nblocks; blk++) {
		int c0 = blk * CB, nc = C - c0 < CB ? C - c0 : CB;
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++) {
				const float *d = dout + ((size_t)b * T + t) * C + c0;
				float *te = dwte + (size_t)tokens[b * T + t] * C + c0;
				float *pe = dwpe + (size_t)t * C + c0;
				for (int j = 0; j < nc; j++) {
					te[j] += d[j];
					pe[j] += d[j];
				}
			}
	}
}

void kern_embedding_seg_forward(float *out, const int32_t *tokens, const int32_t *segments, const float *wte,
                                const float *wpe, const float *wtt, int B, int T, int C)
{
	int nt = kern_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 64) if (nt > 1)
	for (int bt = 0; bt < B * T; bt++) {
		float *o = out + (size_t)bt * C;
		const float *te = wte + (size_t)tokens[bt] * C;
		const float *se = wtt + (size_t)segments[bt] * C;
		if (!wpe) { /* relative positions: no position row */
			for (int c = 0; c < C; c++)
				o[c] = te[c] + se[c];
			continue;
		}
		const float *pe = wpe + (size_t)(bt % T) * C;
		for (int c = 0; c < C; c++)
			o[c] = (te[c] + se[c]) + pe[c];
	}
}

void kern_embedding_seg_backward(float *dwte, float *dwpe, float *dwtt, const float *dout,
                                 const int32_t *tokens, const int32_t *segments, int B, int T, int C)
{
	/* threads split the channels, as kern_embedding_backward */
	enum { CB = 32 };
	int nt = kern_threads();
	int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
	for (int blk = 0; blk < nblocks; blk++) {
		int c0 = blk * CB, nc = C - c0 < CB ? C - c0 : CB;
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++) {
				size_t bt = (size_t)b * T + t;
				const float *d = dout + bt * C + c0;
				float *te = dwte + (size_t)tokens[bt] * C + c0;
				float *se = dwtt + (size_t)segments[bt] * C + c0;
				if (!dwpe) { /* relative positions: no position row */
					for (int j = 0; j < nc; j++) {
						te[j] += d[j];
						se[j] += d[j];
					}
					continue;
				}
				float *pe = dwpe + (size_t)t * C + c0;
				for (int j = 0; j < nc; j++) {
					te[j] += d[j];
					se[j] += d[j];
					pe[j] += d[j];
				}
			}
	}
}
