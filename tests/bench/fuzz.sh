#!/bin/sh
# cotrain bench: run every libFuzzer harness of tests/fuzz/ for a budget and
# report what each did (doc/fuzzing.md).  Needs a build configured with
# --enable-fuzzing (clang):
#
#   mkdir _build-fuzz && cd _build-fuzz && ../configure --enable-fuzzing
#   make tests/fuzz/fuzz_frame ...    (or plain make)
#   ../tests/bench/fuzz.sh [SECONDS] [HARNESS...]
#
# SECONDS (default 60) is each harness's budget; HARNESS names (frame,
# plan...) pick some, all by default.  Run from the build folder (or set
# FUZZ_BUILD).  Each harness starts from its committed corpus
# (tests/fuzz/corpus/<name>) copied into a scratch folder, so the source
# tree is never written; new inputs and crashes stay in FUZZ_OUT (default
# ./fuzz-out/<name>/).  One line per harness: executions, executions per
# second, coverage (libFuzzer's cov: edges, ft: features) and the corpus
# size at the end; then a total line (executions over every harness).
# Exit status 1 when a harness crashed or found a sanitizer report: its
# input is FUZZ_OUT/<name>/crash-* (add it to the corpus as
# tests/fuzz/corpus/<name>/crash-<what> once fixed).
set -u
secs=${1:-60}
[ $# -gt 0 ] && shift
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${FUZZ_BUILD:-$(pwd)}
out=${FUZZ_OUT:-$(pwd)/fuzz-out}
if [ $# -eq 0 ]; then
	set -- $(cd "$top/tests/fuzz/corpus" && ls)
fi

printf '%-14s %8s %12s %10s %8s %8s %8s  %s\n' harness seconds execs exec/s cov ft corpus result
failed=0
total_execs=0 total_secs=0 ran=0
for name in "$@"; do
	bin=$build/tests/fuzz/fuzz_$name
	if [ ! -x "$bin" ]; then
		printf '%-14s not built (%s); configure with --enable-fuzzing and make it\n' "$name" "$bin"
		failed=1
		continue
	fi
	if ! nm "$bin" 2>/dev/null | grep -q 'LLVMFuzzerRunDriver\|fuzzer::'; then
		printf '%-14s %s is the replay build, not libFuzzer; use a build configured with --enable-fuzzing\n' \
			"$name" "$bin"
		failed=1
		continue
	fi
	work=$out/$name
	rm -rf "$work"
	mkdir -p "$work/corpus"
	cp "$top/tests/fuzz/corpus/$name/"* "$work/corpus/" 2>/dev/null
	start=$(date +%s)
	"$bin" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$work/" \
		-rss_limit_mb=2048 -timeout=10 "$work/corpus" >"$work/log" 2>&1
	rc=$?
	end=$(date +%s)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -n 1)
	last=$(grep -E '^#[0-9]+' "$work/log" | tail -n 1)
	cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
	ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
	n=$(ls "$work/corpus" | wc -l)
	result=ok
	if [ "$rc" -ne 0 ] || ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* >/dev/null 2>&1; then
		result="FAILED (rc $rc): $(ls "$work" | grep -E '^(crash|leak|timeout|oom)-' | head -n 1); see $work/log"
		failed=1
	fi
	printf '%-14s %8s %12s %10s %8s %8s %8s  %s\n' "$name" "$((end - start))" "${execs:-?}" "${rate:-?}" \
		"${cov:-?}" "${ft:-?}" "$n" "$result"
	total_execs=$((total_execs + ${execs:-0})) total_secs=$((total_secs + end - start)) ran=$((ran + 1))
done
printf '%-14s %8s %12s  (%d harnesses, %s)\n' total "$total_secs" "$total_execs" "$ran" \
	"$([ "$failed" = 0 ] && echo "no crash" || echo "FAILED")"
exit $failed
