/* cotrain tests: finite-difference checks of the kernels' backward passes
 * against plain double-precision forwards (the oracle), shared by
 * tests/test_kernels_gradcheck.c (the GPT) and tests/test_encoder_gradcheck.c
 * (the encoders).  See test_kernels_gradcheck.c for why the tolerances hold. */
#include "tests/fd_check.h"

#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kern_rng fd_rng;

void *fd_xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		bail_out("out of memory");
	return p;
}

float *fd_randv(size_t n, double std)
{
	float *x = fd_xcalloc(n, sizeof *x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * kern_rng_normal(&fd_rng));
	return x;
}

float *fd_zerov(size_t n) { return fd_xcalloc(n, sizeof(float)); }
double *fd_zerod(size_t n) { return fd_xcalloc(n, sizeof(double)); }

/* A double copy of x[0..n) (exact), owned by the caller. */
double *fd_tod(const float *x, size_t n)
{
	double *d = fd_zerod(n);
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

double fd_dot(const float *w, const double *x, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)w[i] * x[i];
	return s;
}

double fd_maxabs(const float *x, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fabs(x[i]) > m ? fabs(x[i]) : m;
	return m;
}

/* ---- the oracle: plain double forwards ----------------------------------- */

/* out[M,N] = inp[M,K] W[K,N] + b[N] (b may be NULL) */
void fd_lin(double *out, const double *inp, const double *W, const double *b, int M, int K, int N)
{
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double s = b ? b[n] : 0;
			for (int k = 0; k < K; k++)
				s += inp[(size_t)m * K + k] * W[(size_t)k * N + n];
			out[(size_t)m * N + n] = s;
		}
}

void fd_ln(double *out, const double *inp, const double *w, const double *b, int N, int C, double eps)
{
	for (int n = 0; n < N; n++) {
		const double *x = inp + (size_t)n * C;
		double m = 0, v = 0;
		for (int c = 0; c < C; c++)
			m += x[c];
		m /= C;
		for (int c = 0; c < C; c++)
			v += (x[c] - m) * (x[c] - m);
		double s = 1 / sqrt(v / C + eps);
		for (int c = 0; c < C; c++)
			out[(size_t)n * C + c] = (x[c] - m) * s * w[c] + b[c];
	}
}

/* ---- the comparison ------------------------------------------------------ */

/* Compare grad[] (the float backward) with central differences of f over
 * x[] (the double inputs f reads): all coordinates when n <= samples, else
 * `samples` distinct random ones.  Reports one TAP line. */
void fd_check(const char *what, fd_objective f, void *ctx, double *x, const float *grad, size_t n,
              size_t samples, double rtol, double atol)
{
	size_t count = n <= samples ? n : samples;
	size_t *idx = fd_xcalloc(n, sizeof *idx);
	double *fd = fd_zerod(count);
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	for (size_t k = 0; k < count; k++) {
		if (count < n) { /* partial Fisher-Yates: distinct coordinates */
			size_t j = k + (size_t)(kern_rng_next(&fd_rng) % (n - k)), t = idx[k];
			idx[k] = idx[j];
			idx[j] = t;
		}
		size_t i = idx[k];
		double old = x[i];
		x[i] = old + FD_H;
		double fp = f(ctx);
		x[i] = old - FD_H;
		double fm = f(ctx);
		x[i] = old;
		fd[k] = (fp - fm) / (2 * FD_H);
	}
	double scale = 0;
	for (size_t k = 0; k < count; k++)
		scale = fmax(scale, fabs(fd[k]));
	double worst = 0, worst_abs = 0;
	size_t worst_k = 0;
	for (size_t k = 0; k < count; k++) {
		double an = grad[idx[k]], d = fabs(fd[k] - an);
		double tol = rtol * fabs(fd[k]) + atol * scale;
		double r = d / (tol > 0 ? tol : 1e-300);
		worst_abs = fmax(worst_abs, d);
		if (r > worst) {
			worst = r;
			worst_k = k;
		}
	}
	ok(worst <= 1 && scale > 0,
	   "%s: %zu coordinates, max |grad| %.3g, max error "
	   "%.2g (%.3g of tolerance)",
	   what, count, scale, worst_abs / (scale > 0 ? scale : 1), worst);
	if (worst > 1)
		diag("  at %zu: finite difference %.10g, analytic %.10g", idx[worst_k], fd[worst_k],
		     (double)grad[idx[worst_k]]);
	free(idx);
	free(fd);
}

/* The float forward's output against the double one's. */
void fd_check_forward(const char *what, const float *out, const double *want, size_t n)
{
	double e = 0, s = 0;
	for (size_t i = 0; i < n; i++) {
		e = fmax(e, fabs(out[i] - want[i]));
		s = fmax(s, fabs(want[i]));
	}
	ok(s > 0 && e <= FWD_TOL * s, "%s: float forward matches double, relative error %.3g", what,
	   s > 0 ? e / s : e);
}

/* The backward run twice must give twice the gradient. */
void fd_check_accumulates(const char *what, const float *once, const float *twice, size_t n)
{
	double scale = fd_maxabs(once, n), worst = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)twice[i] - 2.0 * once[i]);
		worst = d > worst ? d : worst;
	}
	ok(worst <= 1e-5 * scale && scale > 0, "%s accumulates: max |twice - 2 once| %.3g", what, worst);
}

const double *fd_view(const kern_model *m, const double *p, const char *name)
{
	for (int v = 0; v < m->n_views; v++)
		if (strcmp(m->views[v].name, name) == 0)
			return p + m->views[v].offset;
	bail_out("the model has no tensor %s", name);
}
