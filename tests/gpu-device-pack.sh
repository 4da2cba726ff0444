#!/bin/bash
# Gather what tests/gpu-device-check.sh runs on a GPU machine into .devbin
# (git-ignored, carried by the device tool): the CUDA backend, the test and
# the benchmark built in BUILD_DIR (configure with CUDA_ARCHS=90 for a
# Hopper-only, faster build), and the Debian libraries they load that the
# GPU machines lack (OpenBLAS, compressed, and its Fortran runtime); and
# for tests/test_rounds_gpu.sh, rounds.tar.xz: the server, the admin, the
# client and cotrainctl of BUILD_DIR, PostgreSQL's server and psql (in
# Debian's layout, which they find their share folder from), and every
# library these load but glibc's and the C++ runtime.
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

rt=$(mktemp -d /tmp/cotrain-devpack-XXXXXX)
trap 'rm -rf "$rt"' EXIT
mkdir -p "$rt/build/server" "$rt/build/client" "$rt/build/tests" "$rt/build/kernels" "$rt/lib"
cp "$build/server/cotrain-server" "$build/server/cotrain-admin" "$rt/build/server/"
cp "$build/client/cotrain-client" "$build/client/cotrainctl" "$rt/build/client/"
cp "$build/tests/with-pgtmp" "$build/tests/test_gpu_kernels" "$rt/build/tests/"
cp "$build/kernels/libcotrain-cuda.so" "$rt/build/kernels/"
pg=$(sed -n 's/^PG_BINDIR = //p' "$build/Makefile")
pgver=$(basename "$(dirname "$pg")")
mkdir -p "$rt/pg/usr/lib/postgresql/$pgver/bin" "$rt/pg/usr/lib/postgresql/$pgver/lib" "$rt/pg/usr/share/postgresql"
cp "$pg/postgres" "$pg/initdb" "$pg/psql" "$rt/pg/usr/lib/postgresql/$pgver/bin/"
find "$pg/../lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp {} "$rt/pg/usr/lib/postgresql/$pgver/lib/" \;
cp -r "/usr/share/postgresql/$pgver" "$rt/pg/usr/share/postgresql/"
cp -r /usr/share/zoneinfo/UTC /usr/share/zoneinfo/Etc "$rt/" 2>/dev/null || true
for b in "$rt"/build/server/* "$rt"/build/client/* "$rt"/build/tests/* "$rt"/pg/usr/lib/postgresql/*/bin/* \
	"$rt"/pg/usr/lib/postgresql/*/lib/*.so; do
	ldd "$b" 2>/dev/null | awk '$3 ~ /^\// { print $3 }'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|libopenblas|libgfortran|libquadmath|libgomp)\.so|ld-linux|/usr/local/cuda' |
	while read -r l; do cp -L "$l" "$rt/lib/"; done
tar -C "$rt" -cf - . | xz -T2 -6 >"$dest/rounds.tar.xz"
grep -qx '/.devbin/' "$root/.git/info/exclude" 2>/dev/null || echo '/.devbin/' >>"$root/.git/info/exclude"
du -sh "$dest"
