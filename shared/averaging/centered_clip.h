/* cotrain: CenteredClip, the robust combination BTARD's aggregators use
 * (Karimireddy et al. 2021; Gorbunov et al. 2022, "Secure Distributed
 * Training at Scale"; doc/averaging.md, "Robust aggregation").
 *
 * The k contributions to one slice are gradient SUMS x_i over s_i samples.
 * CenteredClip works on their per-sample means g_i = x_i / s_i with
 * weights w_i = s_i / S (S = sum of s_i), as BTARD's implementation does:
 *
 *   v = the coordinate-wise median of the g_i (element k / 2, counting
 *       from 0, of the sorted values: the upper median for even k)
 *   repeat iters times:
 *       c_i = w_i min(1, tau / ||g_i - v||)      (c_i = w_i when the norm is 0)
 *       v  <- v + sum_i c_i (g_i - v)
 *
 * and the slice's result is S v, so that dividing by the total samples
 * (what the round does with a sum) gives v.  Every term is in double, in
 * the given order, rounded to fp32 once: the same inputs give the same
 * bits, so every peer that receives an aggregator's result holds the same
 * bytes.  A contribution can move v by at most w_i tau per iteration,
 * whatever its bytes.  tau is in the units of a per-sample mean gradient
 * of the slice (its L2 norm); BTARD's defaults are tau 1, 20 iterations. */
#ifndef COT_CENTERED_CLIP_H
#define COT_CENTERED_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define CCLIP_TAU_DEFAULT 1.0
#define CCLIP_ITERS_DEFAULT 20
#define CCLIP_ITERS_MAX 1000

/* Combine the k (1..256) contributions x[0..k) of len values, over
 * samples[0..k) (each > 0), into out[0..len) as above.  COT_ERR_INVALID
 * for a bad k, sample count, tau (must be > 0 and finite) or iters
 * (1..CCLIP_ITERS_MAX); COT_ERR_NOMEM.  out may not alias an x[i]. */
cot_err cclip_combine(const float *const *x, const uint64_t *samples, size_t k, size_t len, double tau,
                      int iters, float *out, cot_errbuf *eb);

#endif
