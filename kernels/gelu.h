/* cotrain kernels: GELU, tanh approximation (PyTorch's approximate='tanh'):
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
#ifndef KERN_GELU_H
#define KERN_GELU_H

#include <stddef.h>

/* out[n] = gelu(inp[n]); out may equal inp. */
void kern_gelu_forward(float *out, const float *inp, size_t n);

/* dinp[n] += dout[n] * gelu'(inp[n]), inp being the forward's input. */
void kern_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* dinp[n] = dout[n] * gelu'(inp[n]), dinp's old contents ignored: the same
 * values as kern_gelu_backward into zeros, without the pass that zeroes. */
void kern_gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n);

/* The same on the calling thread only (no OpenMP region), for a product's
 * epilogue: kern_gelu_forward's and kern_gelu_backward_set's values, bit
 * for bit, on a span of n elements. */
void kern_gelu_forward_span(float *out, const float *inp, size_t n);
void kern_gelu_backward_set_span(float *dinp, const float *inp, const float *dout, size_t n);

/* The exact GELU of BERT (PyTorch's default, approximate='none'):
 *   gelu(x) = 0.5 x (1 + erf(x / sqrt(2)))
 * erf is the C library's erff, so its last bit may differ between C
 * libraries (unlike the tanh form, made of basic operations only); on one
 * machine the results do not depend on the thread count. */
void kern_gelu_erf_forward(float *out, const float *inp, size_t n);
/* dinp[n] = dout[n] * gelu'(inp[n]) (old contents ignored). */
void kern_gelu_erf_backward_set(float *dinp, const float *inp, const float *dout, size_t n);

#endif
