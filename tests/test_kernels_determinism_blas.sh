#!/bin/sh
# tests/test_kernels_determinism with every product on OpenBLAS's tiles
# (COTRAIN_GEMM=blas), the path a CPU without AVX2 takes; the C test on its
# own covers the backend's GEMM driver where the CPU has AVX2.
COTRAIN_GEMM=blas
export COTRAIN_GEMM
. "$top_srcdir/tests/tap.sh"
prog=$top_builddir/tests/test_kernels_determinism
[ -x "$prog" ] || bail_out "$prog is missing (make check builds it)"
exec "$prog"
