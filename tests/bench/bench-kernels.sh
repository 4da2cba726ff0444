#!/bin/sh
# bench-kernels.sh: cotrain's kernels against PyTorch, same model, batch and
# threads, measured in the same run.
#
#   tests/bench/bench-kernels.sh            (from the build directory)
#
# Environment: THREADS (2), BATCH (8), STEPS (5), MODELS ("demo sahaj"),
# OPTIMIZERS ("adamw lamb"), REPEAT (1: runs per side, alternating; the best
# of each side is kept), TORCH_PYTHON (/usr/bin/python3), top_srcdir /
# top_builddir (guessed from this script and the cwd).
#
# Both sides load the same OpenBLAS.  Version 0.3.21 falls back to generic
# SSE code on CPUs it does not know (Sapphire/Emerald Rapids among them);
# OPENBLAS_CORETYPE, read when the library loads, overrides that.  The
# benchmark runs once with the library as it loads and, when
# kern_blas_coretype_hint() names a better core, once more with
# OPENBLAS_CORETYPE set to it for both sides (what a client that re-executes
# itself with the hint gets).  CORETYPES="loaded" or "hint" runs only one.
#
# PyTorch runs with OMP_WAIT_POLICY=PASSIVE, its faster setting here: by
# default its idle OpenMP threads spin against OpenBLAS's own threads.
#
# Prints, per model and optimizer: training tokens/s (zero_grad, forward,
# backward, optimizer step) of both, mean over the steps and of the fastest
# step (less sensitive to other load on a shared machine), their ratios,
# cotrain's GFLOP/s (matrix products counted exactly, kern_flops_per_sample)
# and its fraction of the practical peak (the best 2048^3 sgemm through the
# same backend and threads), and the peak resident memory of both.  Timing
# goals are not asserted; the exit status only says whether both sides ran.
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
CORETYPES=${CORETYPES:-"loaded hint"}

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

# keep LINE1 LINE2: the line with the higher best_tokens_per_s
keep() {
	if [ -z "$1" ]; then printf '%s\n' "$2"; return; fi
	a=$(field best_tokens_per_s "$1"); b=$(field best_tokens_per_s "$2")
	if awk -v a="$a" -v b="$b" 'BEGIN { exit !(b > a) }'; then
		printf '%s\n' "$2"
	else
		printf '%s\n' "$1"
	fi
}

peak_of() {
	field peak_sgemm_gflops "$("$bench" --model demo --threads "$THREADS" --batch 1 --steps 1 --peak)"
}

# table: one run of every model and optimizer in the current environment
table() {
	peak=$(peak_of)
	line=$("$bench" --model demo --threads "$THREADS" --batch 1 --steps 1)
	echo "backend: $(printf '%s\n' "$line" | sed -n 's/.*backend="\(.*\)"/\1/p');" \
		"torch $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)')"
	rows=
	for model in $MODELS; do
		for opt in $OPTIMIZERS; do
			ours=; theirs=; i=0
			while [ "$i" -lt "$REPEAT" ]; do
				o=$("$bench" --model "$model" --threads "$THREADS" --batch "$BATCH" \
					--steps "$STEPS" --optimizer "$opt")
				t=$(OMP_WAIT_POLICY=PASSIVE "$TORCH_PYTHON" "$torch_bench" --model "$model" \
					--threads "$THREADS" --batch "$BATCH" --steps "$STEPS" --optimizer "$opt")
				ours=$(keep "$ours" "$o"); theirs=$(keep "$theirs" "$t")
				i=$((i + 1))
			done
			echo "  $ours"
			echo "  $theirs"
			rows="$rows$model $opt $(field tokens_per_s "$ours") $(field tokens_per_s "$theirs") \
$(field best_tokens_per_s "$ours") $(field best_tokens_per_s "$theirs") $(field gflops "$ours") \
$(field peak_rss_mb "$ours") $(field peak_rss_mb "$theirs")
"
		done
	done
	p2=$(peak_of)
	peak=$(awk -v a="$peak" -v b="$p2" 'BEGIN { print (b > a ? b : a) }')
	echo "practical peak: $peak GFLOP/s (best 2048^3 sgemm, $THREADS threads, before and after)"
	printf '%-6s %-6s %21s %8s %21s %8s %9s %7s %17s\n' model optim \
		"tokens/s cotrain/torch" ratio "best step cot/torch" ratio "cot GF/s" "of peak" "peak MiB cot/torch"
	printf '%s' "$rows" | awk -v pk="$peak" 'NF {
		printf "%-6s %-6s %10.0f /%9.0f %7.2fx %10.0f /%9.0f %7.2fx %9.1f %6.0f%% %8.0f /%7.0f\n",
		       $1, $2, $3, $4, $3 / $4, $5, $6, $5 / $6, $7, 100 * $7 / pk, $8, $9 }'
}

hint=$(COTRAIN_BLAS_REEXEC=off "$bench" --coretype-hint)
for mode in $CORETYPES; do
	case $mode in
	loaded)
		echo "== OpenBLAS as it loads${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
		COTRAIN_BLAS_REEXEC=off table ;;
	hint)
		if [ "$hint" = none ]; then
			echo "== no better OpenBLAS core to suggest for this CPU"
		else
			echo "== OPENBLAS_CORETYPE=$hint for both sides (kern_blas_coretype_hint)"
			OPENBLAS_CORETYPE=$hint table
		fi ;;
	*)
		echo "bench-kernels: unknown mode $mode in CORETYPES" >&2
		exit 2 ;;
	esac
done
