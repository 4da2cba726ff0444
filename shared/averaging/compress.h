/* cotrain: wire compression of a slice of fp32 values (gradients, sums).
 *
 * Three encodings, each deterministic (the same input gives the same bytes on
 * every machine: integer and IEEE arithmetic only, round-to-nearest-even):
 *
 *   COMP_NONE    n x fp32, little-endian                       4n bytes
 *   COMP_FP16    n x IEEE binary16, little-endian; finite      2n bytes
 *                values beyond the fp16 range are clamped to
 *                +-65504, NaN and Inf stay NaN and Inf
 *   COMP_BLOCK8  per block of COMP_BLOCK values (the last one  4 ceil(n/B) + n
 *                may be shorter): fp32 LE scale = the block's
 *                absmax, then one int8 per value,
 *                q = round(x / scale * 127) in [-127, 127]
 *
 * Error bounds (for finite input): FP16 relative 2^-11 (about 4.9e-4) inside
 * the normal fp16 range, absolute 2^-25 below it; BLOCK8 absolute
 * scale/254 per value (half a step), plus fp32 rounding.
 *
 * Decoders take untrusted bytes: a payload whose size is not exactly
 * comp_encoded_size(kind, n), a BLOCK8 scale that is negative or not finite,
 * or a code of -128 is refused with COT_ERR_INVALID.  FP16 NaN/Inf decode to
 * NaN/Inf: the caller checks finiteness (the averaging code refuses them). */
#ifndef COT_COMPRESS_H
#define COT_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define COMP_BLOCK 4096                 /* values per BLOCK8 block */
#define COMP_AUTO_BLOCK8_MIN (1u << 16) /* "auto": 8-bit from this many values */

typedef enum {
	COMP_NONE = 0,
	COMP_FP16 = 1,
	COMP_BLOCK8 = 2,
} comp_kind;

typedef enum {
	COMP_POLICY_AUTO = 0, /* BLOCK8 for >= 2^16 values, FP16 below (as in
	                           "Training Transformers Together") */
	COMP_POLICY_NONE,
	COMP_POLICY_FP16,
	COMP_POLICY_BLOCK8,
} comp_policy;

/* The encoding for a tensor of n values under policy. */
comp_kind comp_choose(size_t n, comp_policy policy);

/* "none", "fp16", "block8", or "unknown"; never NULL. */
const char *comp_name(int kind);

/* True for a kind this build knows (the value may come from the wire). */
int comp_kind_valid(int kind);

/* Exact encoded size of n values; 0 for an unknown kind or when the size
 * would overflow size_t. */
size_t comp_encoded_size(int kind, size_t n);

/* Encode x[0..n) into out, which must hold exactly comp_encoded_size(kind, n)
 * bytes (outlen).  COT_ERR_INVALID for an unknown kind or a wrong outlen. */
cot_err comp_encode(int kind, const float *x, size_t n, unsigned char *out, size_t outlen, cot_errbuf *eb);

/* Decode len bytes of in into out[0..n).  Refuses (COT_ERR_INVALID, nothing
 * promised about out) a wrong size, an unknown kind, and for BLOCK8 a scale
 * that is negative or not finite, or a code of -128. */
cot_err comp_decode(int kind, const unsigned char *in, size_t len, float *out, size_t n, cot_errbuf *eb);

/* A bound on the L2 norm of x - y where y[0..n) is what the encoding of
 * kind decoded from some x (rounding to nearest): per value, 8-bit blocks
 * err by at most half a step, scale / 254, with scale the largest |y| of the
 * block; fp16 by half an ulp, at most |y| 2^-11 (normal) or 2^-25
 * (subnormal); none by nothing.  Each value's bound is increased by
 * rel |y| (0 for none; callers add the rounding of their own sums).  Used
 * for the tolerance of the sketch checks (doc/credit.md). */
double comp_error_bound(int kind, const float *y, size_t n, double rel);

/* IEEE binary16 conversions (round to nearest even; finite overflow clamps to
 * +-65504; NaN stays NaN).  Exposed for tests. */
uint16_t comp_half_from_float(float f);
float comp_half_to_float(uint16_t h);

#endif
