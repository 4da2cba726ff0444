/* cotrain kernels: the sentence-order head.  See sop_head.h. */
#include "kernels/sop_head.h"

#include "kernels/matmul.h"
#include "kernels/vecmath.h"

#include <stddef.h>

void kern_sop_head_forward(float *pooled, float *logits, const float *cls, const float *wp, const float *bp,
                           const float *ws, const float *bs, int B, int H)
{
	kern_linear_forward(pooled, cls, wp, bp, B, H, H);
	for (size_t i = 0; i < (size_t)B * H; i++)
		pooled[i] = kern_tanhf(pooled[i]);
	kern_linear_forward(logits, pooled, ws, bs, B, H, 2);
}

void kern_sop_head_backward_set(float *dcls, float *dwp, float *dbp, float *dws, float *dbs, float *dpooled,
                                const float *dlogits, const float *pooled, const float *cls, const float *wp,
                                const float *ws, int B, int H)
{
	kern_linear_backward_set(dpooled, dws, dbs, dlogits, pooled, ws, B, H, 2);
	for (size_t i = 0; i < (size_t)B * H; i++)
		dpooled[i] *= 1.0f - pooled[i] * pooled[i];
	kern_linear_backward_set(dcls, dwp, dbp, dpooled, cls, wp, B, H, H);
}
