#!/bin/sh
# tests/test_kernels_determinism with the GEMM driver's AVX2 kernel
# (COTRAIN_GEMM=avx2), the path of a CPU with AVX2 but without AVX-512; on
# such a CPU this repeats the C test, and on one with AVX-512 it covers the
# AVX2 kernel there.
COTRAIN_GEMM=avx2
export COTRAIN_GEMM
exec "$top_builddir/tests/test_kernels_determinism"
