#!/bin/bash
# Gather what tests/gpu-device-check.sh runs on a GPU machine into .devbin
# (git-ignored, carried by the device tool): the CUDA backend, the test and
# the benchmark built in BUILD_DIR (configure with CUDA_ARCHS=90 for a
# Hopper-only, faster build), and the Debian libraries they load that the
# GPU machines lack (OpenBLAS, compressed, and its Fortran runtime).
set -eu
build=${1:?usage: gpu-device-pack.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.devbin
rm -rf "$dest"
mkdir -p "$dest/lib"
cp "$build/kernels/libcotrain-cuda.so" "$build/tests/test_gpu_kernels" "$build/tests/bench/bench_gpu" "$dest/"
for l in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libgomp.so.1; do
	p=$(ldd "$build/tests/test_gpu_kernels" | awk -v l="$l" '$1 == l { print $3 }')
	[ -n "$p" ] && cp -L "$p" "$dest/lib/$l"
done
xz -T2 -6 "$dest/lib/libopenblas.so.0"
grep -qx '/.devbin/' "$root/.git/info/exclude" 2>/dev/null || echo '/.devbin/' >>"$root/.git/info/exclude"
du -sh "$dest"
