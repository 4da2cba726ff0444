#!/bin/sh
# tests/test_kernels_determinism with the GEMM driver's AVX2 kernel
# (COTRAIN_GEMM=avx2), the path of a CPU with AVX2 but without AVX-512; on
# such a CPU this repeats the C test, and on one with AVX-512 it covers the
# AVX2 kernel there.  The C test skips, saying so, on a CPU without AVX2 and
# FMA, and fails if the driver could run the AVX2 kernel but runs another.
COTRAIN_GEMM=avx2
export COTRAIN_GEMM
. "$top_srcdir/tests/tap.sh"
prog=$top_builddir/tests/test_kernels_determinism
[ -x "$prog" ] || bail_out "$prog is missing (make check builds it)"
exec "$prog"
