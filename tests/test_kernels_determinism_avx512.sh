#!/bin/sh
# tests/test_kernels_determinism with the GEMM driver's AVX-512 kernel
# (COTRAIN_GEMM=avx512), the path of a CPU with AVX-512 but without
# AMX-BF16; on such a CPU this repeats the C test, and on one with AMX the
# C test on its own covers the AMX kernel.  The C test skips, saying so, on
# a CPU without AVX-512F (where the driver would quietly run its AVX2
# kernel), and fails if the driver could run the AVX-512 kernel but runs
# another.
COTRAIN_GEMM=avx512
export COTRAIN_GEMM
. "$top_srcdir/tests/tap.sh"
prog=$top_builddir/tests/test_kernels_determinism
[ -x "$prog" ] || bail_out "$prog is missing (make check builds it)"
exec "$prog"
