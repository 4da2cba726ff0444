#!/bin/sh
# bench-kernels.sh: cotrain's kernels against PyTorch, same model, batch and
# threads, measured in the same run.
#
#   tests/bench/bench-kernels.sh            (from the build directory)
#
# Environment: THREADS (2), BATCH (8), STEPS (5), MODELS ("demo sahaj"),
# OPTIMIZERS ("adamw lamb"), REPEAT (3: runs per side, alternating),
# CORETYPES ("hint loaded"; also "blas"), TORCH_PYTHON (/usr/bin/python3), top_srcdir /
# top_builddir (guessed from this script and the cwd).
#
# Modes (CORETYPES):
#   hint    what cotrain's programs run with: bench_kernels, like every
#           program, re-executes itself with OPENBLAS_CORETYPE set to
#           kern_blas_coretype_hint() (OpenBLAS 0.3.21 runs generic SSE code
#           on CPUs it does not know, Sapphire/Emerald Rapids among them) and
#           GOMP_SPINCOUNT=$SPIN (KERN_OMP_SPINCOUNT: idle OpenMP threads
#           spin about 0.2 ms, then sleep).  PyTorch gets the same two
#           variables: it loads the same OpenBLAS and the same libgomp.
#   loaded  both sides on the OpenBLAS core as it loads (the re-exec
#           forbidden), both with GOMP_SPINCOUNT=$SPIN.  cotrain's large
#           products do not depend on the core where its own GEMM driver
#           runs (AVX2 and up).
#   blas    as hint, with cotrain's GEMM driver off (COTRAIN_GEMM=blas):
#           every product on OpenBLAS tiles, the path of a CPU without
#           AVX2 (not in the default list).
#   avx512  as hint, with the driver's AMX kernel off (COTRAIN_GEMM=avx512),
#           the path of a CPU with AVX-512 but without AMX-BF16 (not in the
#           default list).
#   avx2    as hint, with the driver on its AVX2 kernel (COTRAIN_GEMM=avx2),
#           the path of a CPU without AVX-512 (not in the default list).
#
# Prints, per model and optimizer, over REPEAT alternating runs of each side:
# training tokens/s (zero_grad, forward, backward, optimizer step; mean over
# the steps of a run) as min-max and median, the ratio of the medians, the
# ratio of the fastest single steps, cotrain's GFLOP/s (matrix products
# counted exactly, kern_flops_per_sample) and its fraction of
#   - the CPU's fp32 peak: cores x the FMA rate one core reaches on
#     independent register-only FMAs (= clock x FMA units x lanes x 2,
#     measured, see bench_kernels --cpu-peak), and
#   - the practical peak: the best 2048^3 sgemm through the same backend;
# CPU seconds per step of both (user + system: less sensitive to other load
# than wall time), and the peak resident memory of both (ru_maxrss).  The
# machine's load average is printed before and after: on a shared machine
# the wall-time figures move with it.  Timing goals are not asserted; the
# exit status only says whether both sides ran.
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
REPEAT=${REPEAT:-3}
CORETYPES=${CORETYPES:-"hint loaded"}
# the spin count cotrain's programs run with (KERN_OMP_SPINCOUNT in kernels/backend.h)
SPIN=$(sed -n 's/^#define KERN_OMP_SPINCOUNT "\([0-9]*\)"$/\1/p' "$top_srcdir/kernels/backend.h")
[ -n "$SPIN" ] || { echo "bench-kernels: no KERN_OMP_SPINCOUNT in $top_srcdir/kernels/backend.h" >&2; exit 2; }

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
runs=$(mktemp /tmp/bench-kernels.XXXXXX)
trap 'rm -f "$runs"' EXIT INT TERM

# field NAME LINE: the value of NAME=... in a key=value line
field() {
	printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

load() { cut -d' ' -f1-3 /proc/loadavg; }

peak_of() {
	field peak_sgemm_gflops "$("$bench" --model demo --threads "$THREADS" --batch 1 --steps 1 --peak)"
}

# table: REPEAT alternating runs of every model and optimizer in the
# current environment, then the summary
table() {
	echo "load average (1, 5, 15 min) before: $(load)"
	peak=$(peak_of)
	line=$("$bench" --model demo --threads "$THREADS" --batch 1 --steps 1)
	echo "backend: $(printf '%s\n' "$line" | sed -n 's/.*backend="\(.*\)"/\1/p');" \
		"torch $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)')"
	: >"$runs"
	for model in $MODELS; do
		for opt in $OPTIMIZERS; do
			i=0
			while [ "$i" -lt "$REPEAT" ]; do
				o=$("$bench" --model "$model" --threads "$THREADS" --batch "$BATCH" \
					--steps "$STEPS" --optimizer "$opt")
				t=$("$TORCH_PYTHON" "$torch_bench" --model "$model" \
					--threads "$THREADS" --batch "$BATCH" --steps "$STEPS" --optimizer "$opt")
				echo "  $o"
				echo "  $t"
				for l in "$o" "$t"; do
					case $l in impl=cotrain*) side=cot ;; *) side=torch ;; esac
					echo "$model $opt $side $(field tokens_per_s "$l") $(field best_tokens_per_s "$l")" \
						"$(field gflops "$l") $(field cpu_ms "$l") $(field peak_rss_mb "$l")" >>"$runs"
				done
				i=$((i + 1))
			done
		done
	done
	p2=$(peak_of)
	peak=$(awk -v a="$peak" -v b="$p2" 'BEGIN { print (b > a ? b : a) }')
	echo "load average after: $(load)"
	echo "CPU fp32 peak: $cpupeak GFLOP/s ($cpuline)"
	echo "practical peak: $peak GFLOP/s (best 2048^3 sgemm, $THREADS threads, before and after)"
	printf '%-6s %-6s %23s %23s %7s %7s %8s %6s %6s %13s %13s\n' model optim \
		"tokens/s cotrain" "tokens/s torch" "ratio" "best" "cot GF/s" "%cpu" "%sgemm" \
		"CPU s/step" "peak MiB"
	printf '%-6s %-6s %23s %23s %7s %7s %8s %6s %6s %13s %13s\n' "" "" \
		"min-max (median)" "min-max (median)" "median" "step" "median" "peak" "peak" \
		"cot/torch" "cot/torch"
	sort -k1,1 -k2,2 -k3,3 -k4,4n "$runs" | awk -v cpk="$cpupeak" -v pk="$peak" -v threads="$THREADS" '
	function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
	{
		k = $1 " " $2; s = $3
		if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
		n[k, s]++; tps[k, s, n[k, s]] = $4
		if ($5 > best[k, s]) best[k, s] = $5
		gf[k, s, n[k, s]] = $6; cpu[k, s] += $7; rss[k, s] = $8 > rss[k, s] ? $8 : rss[k, s]
	}
	END {
		for (i = 1; i <= nk; i++) {
			k = order[i]; split(k, mo, " ")
			nc = n[k, "cot"]; nt = n[k, "torch"]
			for (j = 1; j <= nc; j++) { c[j] = tps[k, "cot", j]; g[j] = gf[k, "cot", j] }
			for (j = 1; j <= nt; j++) t[j] = tps[k, "torch", j]
			# gflops sorted with tokens/s (same order: proportional)
			mc = median(c, nc); mt = median(t, nt); mg = median(g, nc)
			printf "%-6s %-6s %7.0f-%-7.0f(%6.0f) %7.0f-%-7.0f(%6.0f) %6.2fx %6.2fx %8.1f %5.0f%% %5.0f%% %6.2f/%-6.2f %6.0f/%-6.0f\n",
			       mo[1], mo[2], c[1], c[nc], mc, t[1], t[nt], mt, mc / mt,
			       best[k, "cot"] / best[k, "torch"], mg, 100 * mg / cpk, 100 * mg / pk,
			       cpu[k, "cot"] / nc / 1000, cpu[k, "torch"] / nt / 1000,
			       rss[k, "cot"], rss[k, "torch"]
		}
	}'
}

cpuline=$("$bench" --cpu-peak)
cpupeak=$(field cpu_peak_gflops "$cpuline")
hint=$(COTRAIN_BLAS_REEXEC=off "$bench" --coretype-hint)
for mode in $CORETYPES; do
	case $mode in
	loaded)
		echo "== OpenBLAS as it loads${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}, GOMP_SPINCOUNT=$SPIN for both"
		COTRAIN_BLAS_REEXEC=off GOMP_SPINCOUNT=$SPIN table ;;
	hint)
		if [ "$hint" = none ]; then
			echo "== as cotrain's programs run (no better OpenBLAS core for this CPU), GOMP_SPINCOUNT=$SPIN for both"
			GOMP_SPINCOUNT=$SPIN table
		else
			echo "== as cotrain's programs run: OPENBLAS_CORETYPE=$hint (kern_blas_coretype_hint), GOMP_SPINCOUNT=$SPIN for both"
			OPENBLAS_CORETYPE=$hint GOMP_SPINCOUNT=$SPIN table
		fi ;;
	blas|avx512|avx2)
		h=${hint#none}
		case $mode in
		blas) what="cotrain's GEMM driver off" ;;
		avx512) what="cotrain's AMX kernel off" ;;
		avx2) what="cotrain's GEMM driver on its AVX2 kernel" ;;
		esac
		echo "== $what (COTRAIN_GEMM=$mode)${h:+, OPENBLAS_CORETYPE=$h}, GOMP_SPINCOUNT=$SPIN for both"
		if [ -n "$h" ]; then
			COTRAIN_GEMM=$mode OPENBLAS_CORETYPE=$h GOMP_SPINCOUNT=$SPIN table
		else
			COTRAIN_GEMM=$mode GOMP_SPINCOUNT=$SPIN table
		fi ;;
	*)
		echo "bench-kernels: unknown mode $mode in CORETYPES" >&2
		exit 2 ;;
	esac
done
