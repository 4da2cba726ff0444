#!/bin/sh
# tests/test_kernels_determinism with the GEMM driver's AVX-512 kernel
# (COTRAIN_GEMM=avx512), the path of a CPU with AVX-512 but without
# AMX-BF16; on such a CPU this repeats the C test, and on one with AMX the
# C test on its own covers the AMX kernel.
COTRAIN_GEMM=avx512
export COTRAIN_GEMM
exec "$top_builddir/tests/test_kernels_determinism"
