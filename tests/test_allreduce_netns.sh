#!/bin/sh
# cotrain tests: the butterfly all-reduce between 8 processes in their own
# network namespaces, links shaped with tc to unequal bandwidths (two at 200,
# four at 100, two at 50 Mbit/s) and DeDLOC's shares: every member ends with
# the same bytes, and they are the exact sum of every member's gradient
# (ascending host id, double, one rounding), recomputed by each member; then
# the same with 8-bit blockwise encoding on the wire (same bytes everywhere,
# within the encoding's error) and with equal shares.  SKIP without root.
: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${top_builddir:=.}"
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/netns.sh"
. "$top_srcdir/tests/bench/allreduce-lib.sh"

BIN="$top_builddir/tests/bench/allreduce_peer"
[ -x "$BIN" ] || skip_all "tests/bench/allreduce_peer is not built"
netns_require
netns_init
DIR=$(mktemp -d /tmp/cot-arnetns.XXXXXX)
NETNS_EXIT_HOOK='rm -rf "$DIR"'
netns_cleanup_stale

plan 11
RATES="200 200 100 100 100 100 50 50"
AR_TIMEOUT_S=60
# shellcheck disable=SC2086
ar_setup "$BIN" "$DIR" $RATES
ok $? "8 namespaces behind one hub, links shaped, certificates made"

for run in "none lb" "8bit lb" "none equal"; do
	set -- $run
	comp=$1; mode=$2
	if [ "$mode" = lb ]; then rates=$RATES; else rates="1 1 1 1 1 1 1 1"; fi
	# shellcheck disable=SC2086
	ar_plan "$DIR/plan" 1200000 "$comp" 1 $rates
	ar_run "$DIR/plan"
	is "$AR_OK" 8 "$comp, $mode shares: all 8 members succeed"
	is "$AR_SUMS" 1 "$comp, $mode shares: every member holds the same bytes (one checksum)"
	is "$AR_VERIFIED" 8 "$comp, $mode shares: the result is the sum of all 8 gradients"
	if [ "$AR_OK" -ne 8 ] || [ "$AR_VERIFIED" -ne 8 ]; then
		diag "$(cat "$DIR/plan.out" "$DIR"/err.* 2>/dev/null)"
	fi
done
is "$AR_SAMPLES" "$((101 + 102 + 103 + 104 + 105 + 106 + 107 + 108)) " "the total samples are every member's"
done_testing
