#!/bin/sh
# tests/test_kernels_determinism with every product on OpenBLAS's tiles
# (COTRAIN_GEMM=blas), the path a CPU without AVX-512 takes; the C test on
# its own covers the backend's GEMM driver where the CPU has AVX-512.
COTRAIN_GEMM=blas
export COTRAIN_GEMM
exec "$top_builddir/tests/test_kernels_determinism"
