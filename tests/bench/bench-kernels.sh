#!/bin/sh
# bench-kernels.sh: cotrain's kernels against PyTorch, same model, batch and
# threads, measured in the same run.
#
#   tests/bench/bench-kernels.sh            (from the build directory)
#
# Environment: THREADS (2), BATCH (8), STEPS (5), MODELS ("demo sahaj"),
# OPTIMIZERS ("adamw lamb"), REPEAT (1: runs per side, alternating; the best
# of each side is reported), TORCH_PYTHON (/usr/bin/python3),
# top_srcdir / top_builddir (guessed from this script and the cwd).
# OPENBLAS_CORETYPE, if set, applies to both sides: they load the same
# OpenBLAS, and 0.3.21 falls back to generic SSE code on CPUs it does not
# know (bench_kernels prints the core it got).
#
# Prints, per model and optimizer: training tokens/s of both and their ratio,
# cotrain's GFLOP/s (matrix products counted exactly, kern_flops_per_sample)
# and its fraction of the practical peak (a 2048^3 sgemm through the same
# backend and threads, measured first), and the peak resident memory of both.
# Timing goals are not asserted; the exit status only says whether both
# sides ran.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top_srcdir=${top_srcdir:-$(cd "$here/../.." && pwd)}
top_builddir=${top_builddir:-$(pwd)}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
BATCH=${BATCH:-8}
STEPS=${STEPS:-5}
MODELS=${MODELS:-"demo sahaj"}
OPTIMIZERS=${OPTIMIZERS:-"adamw lamb"}
REPEAT=${REPEAT:-1}

bench="$top_builddir/tests/bench/bench_kernels"
torch_bench="$top_srcdir/tests/bench/bench_kernels_torch.py"
if [ ! -x "$bench" ]; then
	echo "bench-kernels: $bench not found; run make first (or set top_builddir)" >&2
	exit 1
fi
if ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
	echo "bench-kernels: $TORCH_PYTHON has no torch; install python3-torch or set TORCH_PYTHON" >&2
	exit 1
fi

# field NAME LINE: the value of NAME=... in a key=value line
field() {
	printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

best() {  # best LINE1 LINE2: the line with more tokens_per_s
	if [ -z "$1" ]; then printf '%s\n' "$2"; return; fi
	a=$(field tokens_per_s "$1"); b=$(field tokens_per_s "$2")
	if awk -v a="$a" -v b="$b" 'BEGIN { exit !(b > a) }'; then
		printf '%s\n' "$2"
	else
		printf '%s\n' "$1"
	fi
}

peak_line=$("$bench" --model demo --threads "$THREADS" --batch 1 --steps 1 --peak)
peak=$(field peak_sgemm_gflops "$peak_line")
echo "backend: $(printf '%s\n' "$peak_line" | sed -n 's/.*backend="\(.*\)"/\1/p')"
echo "practical peak: $peak GFLOP/s (2048^3 sgemm, $THREADS threads)"
echo "torch: $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)')"
printf '%-6s %-6s %12s %12s %7s %10s %8s %10s %10s\n' model optim \
	"cotrain t/s" "torch t/s" ratio "cot GF/s" "of peak" "cot MiB" "torch MiB"
for model in $MODELS; do
	for opt in $OPTIMIZERS; do
		ours=; theirs=; i=0
		while [ "$i" -lt "$REPEAT" ]; do
			o=$("$bench" --model "$model" --threads "$THREADS" --batch "$BATCH" \
				--steps "$STEPS" --optimizer "$opt")
			t=$("$TORCH_PYTHON" "$torch_bench" --model "$model" --threads "$THREADS" \
				--batch "$BATCH" --steps "$STEPS" --optimizer "$opt")
			ours=$(best "$ours" "$o"); theirs=$(best "$theirs" "$t")
			i=$((i + 1))
		done
		ot=$(field tokens_per_s "$ours"); tt=$(field tokens_per_s "$theirs")
		og=$(field gflops "$ours")
		awk -v m="$model" -v op="$opt" -v ot="$ot" -v tt="$tt" -v og="$og" -v pk="$peak" \
			-v om="$(field peak_rss_mb "$ours")" -v tm="$(field peak_rss_mb "$theirs")" \
			'BEGIN { printf "%-6s %-6s %12.0f %12.0f %6.2fx %10.1f %7.0f%% %10.0f %10.0f\n",
			         m, op, ot, tt, ot / tt, og, 100 * og / pk, om, tm }'
		echo "  $ours"
		echo "  $theirs"
	done
done
