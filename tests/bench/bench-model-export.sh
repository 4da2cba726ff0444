#!/bin/sh
# cotrain benchmark: `cotrain-admin model export` of the 19M-parameter shape
# (6 layers, width 512, 8 heads, d_ff 2048, 256-token samples, vocabulary
# 256: 19,177,472 parameters, sahajBERT's size, tests/bench/bench_kernels.c
# "sahaj"), in both formats, beside a reference measured in the same run:
# copying the stored checkpoint file to the same disk and fsyncing it (what
# any export must at least do: read the checkpoint and write a file of its
# size; --format cotrain writes exactly those bytes, --format hf a third of
# them, the parameters without the two Adam moments).  The fixed cost of a
# cotrain-admin command (start, database connection, schema check) is
# printed beside them: `project list`.
#
#   tests/bench/bench-model-export.sh [RUNS]
#
# A real PostgreSQL (tests/with-pgtmp); the project's version-0 checkpoint
# (the model initialised from its seed) is what is exported.  Runs each
# export and the reference RUNS times (default 3), alternating; prints the
# best and median wall time of each, the ratio of the bests to the
# reference's, and the size of every file written.  Nothing is asserted.
# Not run by make check.  Run from the build directory (top_builddir), or
# set top_builddir.
set -eu
runs=${1:-3}
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
for f in "$b/server/cotrain-admin" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-model-export: $f is missing; run make first" >&2; exit 1; }
done
work=$(mktemp -d /tmp/cotrain-bench-export-XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
chmod 755 "$work"
mkdir -p "$work/text"
head -c 200000 "$src/packaging/demo/corpus.txt" >"$work/text/a.txt"
cat >"$work/project.json" <<'JSON'
{"name": "sahaj", "title": "19M-parameter export benchmark", "dataset": "bench",
 "model": {"n_layer": 6, "n_shared": 6, "n_head": 8, "d_model": 512, "d_ff": 2048, "seq_len": 256, "vocab": 256},
 "optimizer": {"type": "adamw"}, "target_batch": 8, "microbatch_size": 8, "eval_every": 0}
JSON
cat >"$work/inner.sh" <<EOS
set -eu
admin() { "$b/server/cotrain-admin" --db "\$COTRAIN_DB" --data-dir "$work/srv" "\$@"; }
admin db migrate >/dev/null
admin dataset import bench "$work/text" >/dev/null
admin project create "$work/project.json" | sed -n 's/^\([0-9]*\) parameters.*/params=\1/p'
sha=\$(psql -Atqc "select checkpoint_sha256 from model_version where version = 0")
ck="$work/srv/files/\$(echo "\$sha" | cut -c1-2)/\$sha"
echo "checkpoint_bytes=\$(wc -c <"\$ck")"
now() { date +%s.%N; }
i=0
while [ \$i -lt $runs ]; do
	rm -rf "$work/hf" "$work/raw" "$work/ref"; sync
	t0=\$(now)
	admin model export --format hf sahaj "$work/hf" >/dev/null
	t1=\$(now)
	admin model export --format cotrain sahaj "$work/raw" >/dev/null
	t2=\$(now)
	mkdir "$work/ref" && cp "\$ck" "$work/ref/checkpoint.safetensors" && sync -f "$work/ref/checkpoint.safetensors"
	t3=\$(now)
	admin project list >/dev/null
	t4=\$(now)
	echo "hf_s=\$(echo "\$t1 - \$t0" | bc -l) cotrain_s=\$(echo "\$t2 - \$t1" | bc -l) copy_s=\$(echo "\$t3 - \$t2" | bc -l) admin_s=\$(echo "\$t4 - \$t3" | bc -l)"
	i=\$((i + 1))
done
for f in "$work"/hf/* "$work"/raw/*; do echo "file=\$(basename "\$(dirname "\$f")")/\$(basename "\$f"):\$(wc -c <"\$f")"; done
EOS
"$b/tests/with-pgtmp" sh "$work/inner.sh" >"$work/out"
tr ' ' '\n' <"$work/out" | grep = | awk -F= '
	$1 == "hf_s" { h[++nh] = $2 } $1 == "cotrain_s" { c[++nc] = $2 } $1 == "copy_s" { r[++nr] = $2 } $1 == "admin_s" { a[++na] = $2 }
	$1 == "file" { files[++nf] = $2 } $1 == "params" || $1 == "checkpoint_bytes" { v[$1] = $2 }
	function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
	END {
		sort(h, nh); sort(c, nc); sort(r, nr); sort(a, na)
		printf "model export: %d parameters, stored checkpoint %d bytes, %d runs\n", v["params"], v["checkpoint_bytes"], nh
		printf "  %-48s %9s %9s %12s\n", "", "best s", "median s", "best / copy"
		printf "  %-48s %9.3f %9.3f %12.2f\n", "model export --format hf", h[1], h[int((nh + 1) / 2)], h[1] / r[1]
		printf "  %-48s %9.3f %9.3f %12.2f\n", "model export --format cotrain", c[1], c[int((nc + 1) / 2)], c[1] / r[1]
		printf "  %-48s %9.3f %9.3f %12s\n", "reference: cp of the checkpoint + fsync", r[1], r[int((nr + 1) / 2)], "1.00"
		printf "  %-48s %9.3f %9.3f %12s\n", "fixed cost: cotrain-admin project list", a[1], a[int((na + 1) / 2)], ""
		printf "  %-48s %14s\n", "file", "bytes"
		for (i = 1; i <= nf; i++) { split(files[i], x, ":"); printf "  %-48s %14d\n", x[1], x[2]; t[substr(x[1], 1, index(x[1], "/") - 1)] += x[2] }
		printf "  %-48s %14d (%.2f bytes per parameter)\n", "hf, all files", t["hf"], t["hf"] / v["params"]
		printf "  %-48s %14d (%.2f bytes per parameter)\n", "cotrain, all files", t["raw"], t["raw"] / v["params"]
	}'
