#!/bin/sh
# tests/test_kernels_determinism on the BLAS core OpenBLAS loads with: the
# C test re-executes itself with kern_blas_coretype_hint()'s core (as the
# programs do); COTRAIN_BLAS_REEXEC forbids that, so this run covers the other
# core.  On a CPU OpenBLAS knows both runs use the same core.  The large
# products go through OpenBLAS too (COTRAIN_GEMM=blas: on a CPU with AVX2
# the backend's own driver would take them whatever the core).
COTRAIN_BLAS_REEXEC=off
COTRAIN_GEMM=blas
export COTRAIN_BLAS_REEXEC COTRAIN_GEMM
unset OPENBLAS_CORETYPE
. "$top_srcdir/tests/tap.sh"
prog=$top_builddir/tests/test_kernels_determinism
[ -x "$prog" ] || bail_out "$prog is missing (make check builds it)"
exec "$prog"
