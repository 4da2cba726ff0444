#!/bin/bash
# The CUDA backend's checks and benchmarks on a GPU machine, in one run:
# the TAP test against the CPU backend (tests/test_gpu_kernels.c), a GPU
# client in rounds with CPU peers (tests/test_rounds_gpu.sh, a GPT's, and
# test_rounds_gpu_encoder.sh, an ALBERT's, and test_rounds_gpu_local.sh,
# a GPT's in local mode, on a PostgreSQL of their own,
# from rounds.tar.xz), then bench_gpu beside
# PyTorch on the same GPU (tests/bench/bench_gpu_torch.py), ending with a
# table of both.
#
#   tests/gpu-device-pack.sh BUILD_DIR     (here: a folder .devbin with the
#                                           programs and the libraries they need)
#   tests/gpu-device-check.sh [.devbin]    (there; results under $OUT if set)
#
# The GPU machines have the driver, cuBLAS and PyTorch but not cotrain's
# Debian dependencies: the pack carries OpenBLAS and its runtime, and this
# script finds cuBLAS in the CUDA toolkit or PyTorch's wheels.
# Environment: GPU_CHECK_QUICK=1 leaves out the sahaj shape's whole-model
# test and the slower benchmark modes; GPU_CHECK_PARTS names the parts to
# run (default "kernels rounds bench encbench": encbench is sahajBERT's
# ALBERT beside Hugging Face's), so that a short device call can run one.
set -u
dir=${1:-.devbin}
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
cd "$dir" || { echo "no $dir: run tests/gpu-device-pack.sh first"; exit 1; }
[ -f lib/libopenblas.so.0.xz ] && xz -d -f lib/libopenblas.so.0.xz
cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:${cublas:-}:${LD_LIBRARY_PATH:-}"
export COTRAIN_CUDA_LIB="$PWD/libcotrain-cuda.so"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
quick=${GPU_CHECK_QUICK:-0}
parts=" ${GPU_CHECK_PARTS:-kernels rounds bench encbench} "
part() { case $parts in *" $1 "*) return 0 ;; esac; return 1; }

if part kernels; then
	echo "== test_gpu_kernels"
	if [ "$quick" = 1 ]; then q=--quick; else q=; fi
	timeout 180 ./test_gpu_kernels $q 2>&1 | tee "$out/test_gpu_kernels.tap"
	echo "test_gpu_kernels: exit ${PIPESTATUS[0]}"
fi

if ! part rounds; then
	:
elif [ -f rounds.tar.xz ]; then
	# Unpacked under /tmp: PostgreSQL runs as nobody, who must reach it.
	rt=/tmp/cotrain-rounds-rt
	rm -rf "$rt" && mkdir -p "$rt" && xz -dc rounds.tar.xz | tar -C "$rt" -xf - && chmod -R a+rX "$rt"
	cp lib/* "$rt/lib/"
	[ -e /usr/share/zoneinfo/UTC ] || { mkdir -p /usr/share/zoneinfo && cp -r "$rt/UTC" "$rt/Etc" /usr/share/zoneinfo/; }
	pgbin=$(echo "$rt"/pg/usr/lib/postgresql/*/bin)
	# the GPT's rounds, then the ALBERT's
	for t in test_rounds_gpu test_rounds_gpu_encoder test_rounds_gpu_local; do
		echo "== $t"
		(
			export LD_LIBRARY_PATH="$rt/lib:/usr/local/cuda/lib64:${cublas:-}"
			export PG_BINDIR="$pgbin" COTRAIN_PG_BINDIR="$pgbin" SHELL=/bin/sh KEEP_LOGS=1
			export top_srcdir="$(cd .. && pwd)" top_builddir="$rt/build"
			export COTRAIN_TEST_CUDA_LIB="$rt/build/kernels/libcotrain-cuda.so"
			unset COTRAIN_CUDA_LIB
			timeout 300 sh "../tests/$t.sh"
		) 2>&1 | tee "$out/$t.tap"
		rc=${PIPESTATUS[0]}
		echo "$t: exit $rc"
		# the logs of a failed run (the newest kept)
		d=$(ls -td /tmp/cotrain-gpu-* 2>/dev/null | head -1)
		if { [ "$rc" != 0 ] || grep -q '^not ok' "$out/$t.tap"; } && [ -n "$d" ]; then
			tail -n 40 "$d"/server.log "$d"/client*.log >"$out/$t.logs" 2>&1
		fi
	done
else
	echo "no rounds.tar.xz: tests/gpu-device-pack.sh makes it"
fi

if part bench; then
	echo "== bench"
	bench() { timeout 60 ./bench_gpu "$@" 2>&1 | tee -a "$out/bench.txt"; }
	bench --model gpt2 --precision bf16 --client --local
	COTRAIN_CUDA_PROFILE=1 bench --model gpt2 --precision bf16 --steps 3
	echo "(the attention materialised, for comparison:)" | tee -a "$out/bench.txt"
	COTRAIN_CUDA_ATTENTION=materialized COTRAIN_CUDA_PROFILE=1 bench --model gpt2 --precision bf16 --steps 3
	bench --model gpt2-bytes --precision bf16
	bench --model sahaj --precision bf16 --client
	bench --model gpt2 --precision tf32
	[ "$quick" = 1 ] || bench --model gpt2 --precision fp32 --steps 4
	export PYTHONUNBUFFERED=1
	torchb() { timeout 200 python3 ../tests/bench/bench_gpu_torch.py "$@" 2>&1 | grep -v Warning | tee -a "$out/bench.txt"; }
	torchb --model gpt2 --modes eager-bf16,eager-tf32,compile-bf16
	torchb --model gpt2-bytes --modes eager-bf16
	torchb --model sahaj --modes eager-bf16
	[ "$quick" = 1 ] || torchb --model gpt2 --modes eager-fp32 --steps 4
fi

if part encbench; then
	echo "== encoder bench"
	timeout 120 ./bench_gpu --model sahajbert --precision bf16 --client --local 2>&1 | tee -a "$out/bench.txt"
	COTRAIN_CUDA_PROFILE=1 timeout 60 ./bench_gpu --model sahajbert --precision bf16 --steps 3 2>&1 |
		grep profile | tee -a "$out/bench.txt"
	PYTHONUNBUFFERED=1 timeout 240 python3 ../tests/bench/bench_gpu_torch.py --model sahajbert \
		--modes eager-bf16,compile-bf16 2>&1 | grep -v Warning | tee -a "$out/bench.txt"
fi

echo "== summary"
[ -f "$out/test_gpu_kernels.tap" ] &&
	echo "tap: $(grep -c '^ok' "$out/test_gpu_kernels.tap") ok, $(grep -c '^not ok' "$out/test_gpu_kernels.tap") not ok" &&
	grep -E "^not ok" "$out/test_gpu_kernels.tap"
for t in test_rounds_gpu test_rounds_gpu_encoder test_rounds_gpu_local; do
	[ -f "$out/$t.tap" ] && echo "$t: $(grep -c '^ok' "$out/$t.tap") ok, $(grep -c '^not ok' "$out/$t.tap") not ok"
done
[ -f "$out/bench.txt" ] && grep -E "client microbatch|local-mode microbatch" "$out/bench.txt"
[ -f "$out/bench.txt" ] && grep -E "tokens/s" "$out/bench.txt" | sed -E 's/^(bench_gpu[a-z_]*): ([^ ]+) on [^,]+, ([^,]+),.*: ([0-9]+) tokens\/s.*MFU ([0-9.]+)%.*/\1 \2 \3 \4 tok\/s MFU \5%/'
