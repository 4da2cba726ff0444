#!/bin/sh
# cotrain bench: the cost, on a round's critical path, of the sketches that
# tie the averaged bytes to the committed ones (doc/credit.md, "Tied to the
# bytes"): each member sketches every result it received, each aggregator
# every slice it summed and its result, within allreduce_run.
#
# The slices' sketches are taken part by part as they arrive (under the
# aggregator's lock, beside the decoding), the aggregator's result as it
# is summed, each aggregator's result in the member's sender thread once
# it settled: it overlaps the transfers when the network, not the CPU, is
# the limit.
#
# Runs a group of N allreduce_peer processes on loopback (no shaping), at
# the demo model's size (the parameter count bench_sketch reports for it)
# and at 18M values, in 8-bit (the encoding "auto" picks at these sizes),
# each twice: without sketches (the reference) and with k = 16.  Prints per
# size the slowest member's wall time of each and their ratio (on loopback
# the CPU is the limit, so all the sketching shows in it, and so does the
# noise of a shared machine), the largest time a member spent sketching
# (allreduce_result.sketch_s, all its threads together: an upper bound on
# what the sketches add to its critical path), and that time as a fraction
# of the averaging time with sketches (goal: at most 2%).  Loopback
# averages at memory speed, so the fraction is the worst case: over a real
# network (bench-allreduce.sh: 18M values take 12.5 s among 8 shaped peers)
# it is smaller by the ratio of the wall times, printed as the "shaped"
# figure beside it.  Timings are
# printed, never asserted; a run where a member fails exits 1.
#
# Environment: N (members, default 4), REPS (runs of each, best kept,
# default 3), SHAPED_S (the shaped reference wall time at 18M, default 12.5).
# Usage: tests/bench/bench-sketch-bytes.sh [BUILDDIR]
set -u
B=${1:-${top_builddir:-.}}
BIN=$B/tests/bench/allreduce_peer
[ -x "$BIN" ] || { echo "bench-sketch-bytes: build $BIN first (make tests/bench/allreduce_peer)" >&2; exit 1; }
N=${N:-4}
REPS=${REPS:-3}
SHAPED_S=${SHAPED_S:-12.5}
D=$(mktemp -d /tmp/cotrain-skb-XXXXXX)
trap 'rm -rf "$D"' EXIT INT TERM
"$BIN" --make-certs "$D/certs" "$N" >/dev/null || exit 1
demo=$("$B/tests/bench/bench_sketch" --model demo --steps 1 2>/dev/null | sed -n 's/.*params=\([0-9]*\).*/\1/p')
[ -n "$demo" ] || { echo "bench-sketch-bytes: could not get the demo model's size from bench_sketch" >&2; exit 1; }

# run LEN K: one all-reduce; prints "wall_ms sketch_ms" (slowest member's wall, largest sketch time)
run() {
	_len=$1 _k=$2
	"$BIN" --shares "$_len" $(seq "$N" | sed 's/.*/100/') >"$D/shares" || return 1
	{
		echo "len $_len"; echo "seed 7"; echo "comp 8bit"; echo "verify 0"; echo "sketch $_k"
		echo "timeout_s 120"; echo "start_ms $(($(date +%s%3N) + 1500))"
		awk -v port=7300 '$1 == "peer" { i = $2 + 1; printf "member %d 127.0.0.1 %d %s %s %d\n", i, port + i, $8, $10, 100 + i }' "$D/shares"
	} >"$D/plan"
	_pids=
	for _i in $(seq 0 $((N - 1))); do
		"$BIN" --plan "$D/plan" --self "$_i" --certs "$D/certs" >"$D/out.$_i" 2>"$D/err.$_i" &
		_pids="$_pids $!"
	done
	_fail=0
	for _p in $_pids; do wait "$_p" || _fail=1; done
	[ $_fail -eq 0 ] || { cat "$D"/err.* >&2; return 1; }
	cat "$D"/out.* | awk '$1 == "member" {
		for (i = 1; i < NF; i++) { if ($i == "wall_ms") w = $(i + 1); if ($i == "sketch_ms") s = $(i + 1) }
		if (w > W) W = w; if (s > S) S = s }
		END { printf "%d %.3f\n", W, S }'
}

best() { # LEN K: the run with the smallest wall of REPS
	_b=
	for _r in $(seq "$REPS"); do
		_o=$(run "$1" "$2") || return 1
		if [ -z "$_b" ] || [ "${_o%% *}" -lt "${_b%% *}" ]; then _b=$_o; fi
	done
	echo "$_b"
}

echo "members $N, 8-bit, loopback, best of $REPS"
for len in "$demo" 18000000; do
	ref=$(best "$len" 0) || exit 1
	with=$(best "$len" 16) || exit 1
	set -- $ref $with
	echo "$len $1 $3 $4" | awk -v shaped="$SHAPED_S" '{
		printf "len %d: averaging %d ms without sketches, %d ms with (ratio %.3f); a member spent at most %.1f ms sketching = %.2f%% of the averaging (goal <= 2%%)", $1, $2, $3, $3 / $2, $4, 100 * $4 / $3
		if ($1 == 18000000) printf "; %.2f%% of the shaped 8-peer averaging (%.1f s)", 100 * $4 / (shaped * 1000), shaped
		printf "\n" }'
done
