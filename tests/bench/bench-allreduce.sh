#!/bin/sh
# cotrain bench: all-reduce of an 18M-parameter fp32 gradient among 8 peers,
# each in its own network namespace behind one hub, links shaped with tc (htb,
# both directions) to two at 200, four at 100 and two at 50 Mbit/s.
#
# Prints, from one run:
#   - the efficiency of a plain TCP transfer over one shaped 100 Mbit/s link
#     (goodput over the shaped rate: the shaping is honest, and this is the
#     most any protocol over TCP gets);
#   - the lower bound: the largest per-peer transfer time of DeDLOC's optimal
#     shares for the shaped bandwidths (lb_shares, server/load_balance.h);
#   - the measured wall time with those shares (the slowest member's), and
#     its ratio to the bound (goal: within 1.15x);
#   - the same all-reduce with equal shares (no load balancing) and the
#     speed-up of load balancing over it (goal: above 1);
#   - the bound at TCP's goodput: the bound counts fp32 values only, but
#     every byte on a shaped link also carries Ethernet, IP and TCP headers
#     (about 5% at a 1500-byte MTU), so no protocol over TCP comes nearer
#     than the plain-TCP efficiency measured above; the wall time over that
#     figure says how much the all-reduce itself loses (reported beside the
#     goal, never instead of it);
#   - per link, from the hub's byte counters sampled every AR_LINKS_MS (100)
#     ms during each run with optimal shares: bytes each way against the
#     model (lb_shares counts V(1 + (n-2)w) each way: a peer sends and
#     receives at once, and tc shapes each direction separately at the same
#     rate, so the bound's model matches the shaping), how busy each
#     direction was, and how long it ran below half its rate; the members'
#     CPU time.
# Timings are printed, never asserted; a run where the members disagree or
# fail exits 1.  Needs root (SKIP otherwise).
#
# Environment: RATES (Mbit/s per peer), LEN (values), COMP (none, fp16,
# 8bit), REPS (runs of each, default 1; the best is kept), DELAY_MS (one-way
# delay added on each link, default 0), AR_LINKS_MS (link sampling interval,
# ms; empty: no sampling), AR_TIMELINE=1 (also print each link's Mbit/s up
# and down in bins of AR_BIN_MS, default 500 ms), AR_TRACE=1 (members log at
# debug level; per member, when its connections were ready, its first and
# last result part came, its slices were sent, and it was done; the full logs
# stay in DIR/err.* with KEEP=1).
# Usage: tests/bench/bench-allreduce.sh [BUILDDIR]
set -u
here=$(cd "$(dirname "$0")" && pwd)
top_srcdir=$(cd "$here/../.." && pwd)
builddir=${1:-${top_builddir:-.}}
BIN="$builddir/tests/bench/allreduce_peer"
RATES=${RATES:-"200 200 100 100 100 100 50 50"}
LEN=${LEN:-18000000}
COMP=${COMP:-none}
REPS=${REPS:-1}
DELAY_MS=${DELAY_MS:-0}

. "$top_srcdir/tests/netns.sh"
. "$top_srcdir/tests/bench/allreduce-lib.sh"
if [ ! -x "$BIN" ]; then
	echo "bench-allreduce: $BIN is not built (make tests/bench/allreduce_peer)" >&2
	exit 1
fi
netns_require
netns_init
DIR=$(mktemp -d /tmp/cot-arbench.XXXXXX)
NETNS_EXIT_HOOK='if [ "${KEEP:-0}" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi'
AR_LINKS_MS=${AR_LINKS_MS-100}
[ "${AR_TRACE:-0}" = 1 ] && export COTRAIN_LOG=debug
netns_cleanup_stale

# The hub with one namespace per peer, each link shaped both ways.
_i=1
netns_hub_new || exit 1
for _b in $RATES; do
	netns_hub_attach "m$_i" "$_i" "$_b" "$DELAY_MS" || exit 1
	_i=$((_i + 1))
done
AR_BIN=$BIN; AR_DIR=$DIR; AR_N=$((_i - 1))
"$BIN" --make-certs "$DIR/certs" "$AR_N" >/dev/null || exit 1
echo "all-reduce of $LEN fp32 values ($(awk -v l="$LEN" 'BEGIN {printf "%.1f", l * 4 / 1e6}') MB), comp $COMP, $AR_N peers at $RATES Mbit/s, delay ${DELAY_MS} ms"

# A plain TCP transfer over one shaped link pair: from peer a to peer b, both
# links at the same rate when RATES has two equal entries (else the smaller).
a=3; b=4; [ "$AR_N" -lt 4 ] && { a=1; b=2; }
ra=$(echo "$RATES" | awk -v i=$a '{print $i}'); rb=$(echo "$RATES" | awk -v i=$b '{print $i}')
rmin=$(awk -v x="$ra" -v y="$rb" 'BEGIN {print (x < y ? x : y)}')
mb=$(awk -v r="$rmin" 'BEGIN {m = int(r * 4 / 8); print (m < 8 ? 8 : m)}')   # about 4 s
netns_bg "m$b" "$BIN" --tcp-sink 5201 >"$DIR/tcp.out"
sink=$NETNS_LAST_PID
sleep 0.3
netns_exec "m$a" "$BIN" --tcp-source "$(netns_ip $b)" 5201 "$mb" || exit 1
wait "$sink"
netns_forget "$sink"
tcp=$(awk '{print $6}' "$DIR/tcp.out")
printf "plain TCP over a shaped %s Mbit/s link: %s Mbit/s, efficiency %.3f\n" "$rmin" "$tcp" \
	"$(awk -v t="$tcp" -v r="$rmin" 'BEGIN {print t / r}')"

# best WALL of REPS runs of plan file $1; fails when a run is not consistent
run_best() {
	_best=
	_r=0
	while [ "$_r" -lt "$REPS" ]; do
		ar_run "$1"
		if [ "$AR_OK" -ne "$AR_N" ] || [ "$AR_SUMS" -ne 1 ]; then
			echo "bench-allreduce: $AR_OK of $AR_N members succeeded, $AR_SUMS distinct checksums" >&2
			cat "$1.out" "$DIR"/err.* >&2
			return 1
		fi
		echo "  $(basename "$1") run $((_r + 1)): $AR_WALL_S s; per member (host:s):" \
			"$(awk '$1 == "member" {printf "%s:%.2f ", $4, $6 / 1000}' "$1.out")"
		echo "    the members' CPU time, all together: $AR_CPU_S s"
		if [ -n "$AR_LINKS_MS" ] && [ "$(basename "$1")" = lb ]; then
			# shellcheck disable=SC2086
			ar_links "$1" $RATES
		fi
		if [ "${AR_TRACE:-0}" = 1 ] && [ "$(basename "$1")" = lb ]; then
			ar_trace
		fi
		_best=$(awk -v a="${_best:-1e300}" -v b="$AR_WALL_S" 'BEGIN {print (b < a ? b : a)}')
		_r=$((_r + 1))
	done
	BEST=$_best
}

# shellcheck disable=SC2086
ar_plan "$DIR/lb" "$LEN" "$COMP" 0 $RATES || exit 1
bound=$AR_BOUND_S
echo "optimal shares: $(awk '$1 == "peer" {printf "%s ", $6}' "$DIR/lb.shares")"
run_best "$DIR/lb" || exit 1
lb=$BEST
equal_rates=$(echo "$RATES" | awk '{for (i = 1; i <= NF; i++) printf "1 "}')
# shellcheck disable=SC2086
ar_plan "$DIR/eq" "$LEN" "$COMP" 0 $equal_rates || exit 1
# the model time of equal shares on the real bandwidths: max (1 + (n-2)/n) V / b
eqmodel=$(echo "$RATES" | awk -v l="$LEN" '{n = NF; for (i = 1; i <= n; i++) {
	t = (1 + (n - 2) / n) * l * 32 / ($i * 1e6); if (t > m) m = t } printf "%.3f", m}')
run_best "$DIR/eq" || exit 1
eq=$BEST
if [ "$COMP" != none ]; then
	echo "(the bound counts fp32 values; with $COMP on the wire it is not a bound)"
fi
printf "lower bound (optimal shares, lb_shares): %8.3f s\n" "$bound"
printf "measured, optimal shares:                %8.3f s   ratio to bound %.3f (goal <= 1.15)\n" \
	"$lb" "$(awk -v a="$lb" -v b="$bound" 'BEGIN {print a / b}')"
printf "measured, equal shares:                  %8.3f s   (its model time %.3f s)\n" "$eq" "$eqmodel"
printf "speed-up of load balancing:              %8.3f x   (goal > 1)\n" \
	"$(awk -v a="$lb" -v b="$eq" 'BEGIN {print b / a}')"
tcpbound=$(awk -v b="$bound" -v t="$tcp" -v r="$rmin" 'BEGIN {printf "%.3f", b / (t / r)}')
printf "the bound at plain TCP's goodput:        %8.3f s   ratio to it %.3f (the protocol's own loss)\n" \
	"$tcpbound" "$(awk -v a="$lb" -v b="$tcpbound" 'BEGIN {print a / b}')"
