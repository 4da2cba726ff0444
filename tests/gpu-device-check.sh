#!/bin/bash
# The CUDA backend's checks and benchmarks on a GPU machine, in one run:
# the TAP test against the CPU backend (tests/test_gpu_kernels.c), then
# bench_gpu beside PyTorch on the same GPU (tests/bench/bench_gpu_torch.py),
# ending with a table of both.
#
#   tests/gpu-device-pack.sh BUILD_DIR     (here: a folder .devbin with the
#                                           programs and the libraries they need)
#   tests/gpu-device-check.sh [.devbin]    (there; results under $OUT if set)
#
# The GPU machines have the driver, cuBLAS and PyTorch but not cotrain's
# Debian dependencies: the pack carries OpenBLAS and its runtime, and this
# script finds cuBLAS in the CUDA toolkit or PyTorch's wheels.
# Environment: GPU_CHECK_QUICK=1 leaves out the sahaj shape's whole-model
# test and the slower benchmark modes.
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

echo "== test_gpu_kernels"
if [ "$quick" = 1 ]; then q=--quick; else q=; fi
timeout 180 ./test_gpu_kernels $q 2>&1 | tee "$out/test_gpu_kernels.tap"
echo "test_gpu_kernels: exit ${PIPESTATUS[0]}"

echo "== bench"
bench() { timeout 60 ./bench_gpu "$@" 2>&1 | tee -a "$out/bench.txt"; }
bench --model gpt2 --precision bf16
COTRAIN_CUDA_PROFILE=1 bench --model gpt2 --precision bf16 --steps 3
echo "(the attention materialised, for comparison:)" | tee -a "$out/bench.txt"
COTRAIN_CUDA_ATTENTION=materialized COTRAIN_CUDA_PROFILE=1 bench --model gpt2 --precision bf16 --steps 3
bench --model gpt2-bytes --precision bf16
bench --model sahaj --precision bf16
bench --model gpt2 --precision tf32
[ "$quick" = 1 ] || bench --model gpt2 --precision fp32 --steps 4
export PYTHONUNBUFFERED=1
torchb() { timeout 200 python3 ../tests/bench/bench_gpu_torch.py "$@" 2>&1 | grep -v Warning | tee -a "$out/bench.txt"; }
torchb --model gpt2 --modes eager-bf16,eager-tf32,compile-bf16
torchb --model gpt2-bytes --modes eager-bf16
torchb --model sahaj --modes eager-bf16
[ "$quick" = 1 ] || torchb --model gpt2 --modes eager-fp32 --steps 4

echo "== summary"
echo "tap: $(grep -c '^ok' "$out/test_gpu_kernels.tap") ok, $(grep -c '^not ok' "$out/test_gpu_kernels.tap") not ok"
grep -E "^not ok" "$out/test_gpu_kernels.tap"
grep -E "tokens/s" "$out/bench.txt" | sed -E 's/^(bench_gpu[a-z_]*): ([^ ]+) on [^,]+, ([^,]+),.*: ([0-9]+) tokens\/s.*MFU ([0-9.]+)%.*/\1 \2 \3 \4 tok\/s MFU \5%/'
