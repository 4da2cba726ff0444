#!/bin/sh
# cotrain tests: the documents that describe the demo project's model say
# what packaging/demo/project.json holds (issue: they had drifted apart in
# width, sequence, batch and warm-up).  Reads the project file, computes its
# parameter count as server/project_file.c does (pf_param_count), and looks
# for each figure in kernels/model.h, doc/project-file.md and doc/kernels.md.
# A change to the demo's file fails here until the documents follow it.
. "$top_srcdir/tests/tap.sh"
command -v python3 >/dev/null 2>&1 || skip_all "no python3"
S=$top_srcdir
plan 3
# One line: width d_ff seq params(M, 2 decimals) target microbatch warmup total
set -- $(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
m = p["model"]; d, f, T, V = m["d_model"], m.get("d_ff", 4 * m["d_model"]), m["seq_len"], m.get("vocab", 256)
S = m.get("n_shared", m["n_layer"])
n = V * d + T * d + S * (4 * d * d + 2 * d * f + 9 * d + f) + 2 * d
s = p["optimizer"]["schedule"]
print(d, f, T, "%.2f" % (n / 1e6), "{:,}".format(p["target_batch"]), p["microbatch_size"], s["warmup_steps"], s["total_steps"])
' "$S/packaging/demo/project.json")
W=$1 F=$2 T=$3 PM=$4 TB=$5 MB=$6 WU=$7 TS=$8
# Text of a file with line breaks and comment stars folded into spaces.
flat() { sed 's/^ *\* *//; s/^ *\/\* *//' "$1" | tr '\n' ' ' | tr -s ' '; }
has_all() { # FILE PHRASE...: the phrases missing from FILE
	_f=$(flat "$1"); shift
	for _p in "$@"; do case "$_f" in *"$_p"*) ;; *) printf '[%s] ' "$_p" ;; esac; done
}
is "$(has_all "$S/kernels/model.h" "width $W" "d_ff $F" "sequence $T" "${PM}M parameters" "rounds of $TB" \
	"microbatches of $MB" "warm-up of $WU of $TS steps")" "" "kernels/model.h describes the demo project's model"
is "$(has_all "$S/doc/project-file.md" "width $W" "\`d_ff\` $F" "$T-token samples" "$PM M parameters" \
	"\`target_batch\` $TB" "microbatches of $MB" "warm-up of $WU of $TS steps")" "" \
	"doc/project-file.md describes the demo project's model"
is "$(has_all "$S/doc/kernels.md" "width $W" "d_ff $F" "$T-token samples" "${PM}M parameters")" "" \
	"doc/kernels.md describes the demo project's model"
