#!/bin/sh
# bench-encoder.sh: cotrain's ALBERT encoder against PyTorch, same model,
# batch and threads, measured in the same run (never run by make check).
#
#   tests/bench/bench-encoder.sh            (from the build directory)
#
# Environment: THREADS (2), MODELS ("demo sahaj"), BATCH_demo (8),
# BATCH_sahaj (2), STEPS_demo (5), STEPS_sahaj (2), REPEAT (2: runs per
# side, alternating), TORCH_PYTHON (/usr/bin/python3), top_srcdir /
# top_builddir.  Both sides run with GOMP_SPINCOUNT as cotrain's programs
# do (KERN_OMP_SPINCOUNT) and on the OpenBLAS core cotrain re-executes with.
#
# Prints every run's line, then per model the median training tokens/s
# (sequence tokens through masking, forward, backward and AdamW) of each
# side and their ratio, and CPU seconds per step of each (less sensitive to
# other load on a shared machine).  The load average is printed before and
# after.  Timing goals are not asserted.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top_srcdir=${top_srcdir:-$(cd "$here/../.." && pwd)}
top_builddir=${top_builddir:-$(pwd)}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
MODELS=${MODELS:-"demo sahaj"}
REPEAT=${REPEAT:-2}
SPIN=$(sed -n 's/^#define KERN_OMP_SPINCOUNT "\([0-9]*\)"$/\1/p' "$top_srcdir/kernels/backend.h")
bench="$top_builddir/tests/bench/bench_encoder"
torch_bench="$top_srcdir/tests/bench/bench_encoder_torch.py"
[ -x "$bench" ] || { echo "bench-encoder: $bench not found; run make first" >&2; exit 1; }
"$TORCH_PYTHON" -c 'import torch' 2>/dev/null || { echo "bench-encoder: $TORCH_PYTHON has no torch" >&2; exit 1; }
hint=$(COTRAIN_BLAS_REEXEC=off "$top_builddir/tests/bench/bench_kernels" --coretype-hint 2>/dev/null || echo none)
[ "$hint" = none ] || [ -z "$hint" ] || export OPENBLAS_CORETYPE="$hint"
export GOMP_SPINCOUNT="$SPIN"

field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
runs=$(mktemp /tmp/bench-encoder.XXXXXX)
trap 'rm -f "$runs"' EXIT INT TERM
echo "load average (1, 5, 15 min) before: $(cut -d' ' -f1-3 /proc/loadavg)"
for model in $MODELS; do
	eval "batch=\${BATCH_$model:-}"
	eval "steps=\${STEPS_$model:-}"
	[ -n "$batch" ] || { [ "$model" = sahaj ] && batch=2 || batch=8; }
	[ -n "$steps" ] || { [ "$model" = sahaj ] && steps=2 || steps=5; }
	i=0
	while [ "$i" -lt "$REPEAT" ]; do
		o=$("$bench" --model "$model" --threads "$THREADS" --batch "$batch" --steps "$steps")
		t=$("$TORCH_PYTHON" "$torch_bench" --model "$model" --threads "$THREADS" --batch "$batch" --steps "$steps")
		echo "  $o"
		echo "  $t"
		echo "$model cot $(field tokens_per_s "$o") $(field cpu_ms "$o")" >>"$runs"
		echo "$model torch $(field tokens_per_s "$t") $(field cpu_ms "$t")" >>"$runs"
		i=$((i + 1))
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %14s %14s %7s %20s\n' model "cotrain tok/s" "torch tok/s" ratio "CPU s/step cot/torch"
sort -k1,1 -k2,2 -k3,3n "$runs" | awk '
function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ k = $1; s = $2; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
  n[k, s]++; v[k, s, n[k, s]] = $3; cpu[k, s] += $4 }
END {
	for (i = 1; i <= nk; i++) {
		k = order[i]
		for (j = 1; j <= n[k, "cot"]; j++) c[j] = v[k, "cot", j]
		for (j = 1; j <= n[k, "torch"]; j++) t[j] = v[k, "torch", j]
		mc = median(c, n[k, "cot"]); mt = median(t, n[k, "torch"])
		printf "%-6s %14.0f %14.0f %6.2fx %9.2f/%-9.2f\n", k, mc, mt, mc / mt,
		       cpu[k, "cot"] / n[k, "cot"] / 1000, cpu[k, "torch"] / n[k, "torch"] / 1000
	}
}'
