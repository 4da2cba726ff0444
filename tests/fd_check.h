/* cotrain tests: finite-difference gradient checks in double precision.
 *
 * A check perturbs one double input of an oracle objective f (a plain
 * double forward) by +-FD_H and compares the central difference with the
 * float backward's gradient: |fd - analytic| <= rtol |fd| + atol scale,
 * scale the largest |fd| of the coordinates checked. */
#ifndef COT_TESTS_FD_CHECK_H
#define COT_TESTS_FD_CHECK_H

#include "kernels/model.h"
#include "kernels/rng.h"

#include <stddef.h>

#define FD_H 1e-5    /* central-difference step, in double */
#define FWD_TOL 1e-5 /* float forward vs the double one, relative to max */

/* The generator of fd_randv and of fd_check's coordinate sampling; seed it. */
extern kern_rng fd_rng;

/* Zeroed memory or a bail-out; the caller frees. */
void *fd_xcalloc(size_t n, size_t size);
/* n floats N(0, std^2) from fd_rng; zeroed floats; zeroed doubles. */
float *fd_randv(size_t n, double std);
float *fd_zerov(size_t n);
double *fd_zerod(size_t n);
/* A double copy of x[0..n). */
double *fd_tod(const float *x, size_t n);
/* sum w_i x_i in double. */
double fd_dot(const float *w, const double *x, size_t n);
double fd_maxabs(const float *x, size_t n);
/* The tensor called name of model m within p, a double copy of its flat
 * parameters (the same offsets); bails out when m has none. */
const double *fd_view(const kern_model *m, const double *p, const char *name);

/* out[M,N] = inp[M,K] W[K,N] + b[N] (b may be NULL). */
void fd_lin(double *out, const double *inp, const double *W, const double *b, int M, int K, int N);
/* LayerNorm of the N rows of inp[N,C], biased variance, epsilon eps. */
void fd_ln(double *out, const double *inp, const double *w, const double *b, int N, int C, double eps);

typedef double (*fd_objective)(void *ctx);

/* Compare grad[] (the float backward) with central differences of f over
 * x[] (the double inputs f reads): all coordinates when n <= samples, else
 * `samples` distinct random ones.  Reports one TAP line. */
void fd_check(const char *what, fd_objective f, void *ctx, double *x, const float *grad, size_t n,
              size_t samples, double rtol, double atol);
/* The float forward's output against the double one's (FWD_TOL). */
void fd_check_forward(const char *what, const float *out, const double *want, size_t n);
/* The backward run twice must give twice the gradient. */
void fd_check_accumulates(const char *what, const float *once, const float *twice, size_t n);

#endif
