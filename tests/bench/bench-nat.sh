#!/bin/sh
# cotrain benchmark: the NAT ladder across emulated home routers (the
# topology of tests/test_nat_netns.sh, every site's link shaped to MBIT
# Mbit/s with DELAY ms each way).  Prints the fraction of pairs connected
# without the relay, the time to connect per rung, and the throughput of a
# TLS stream through the relay beside the same stream over a punched (direct)
# path between sites with the same shaped links, measured in this run, as a
# ratio (goal: at least 0.8), and against the nominal link rate.  Then a
# real collaborative run (tests/nat/round-lib.sh: cotrain-client daemons at
# the four NAT sites, a 3.2M-parameter model): the all-reduce time of its
# rounds, first with every router endpoint-independent (every pair punched,
# a direct path), then, with the daemons restarted, every router symmetric
# (every pair through the relay), on the same shaped links in the same run.
# Then pairs that train alone, where the ladder learns (doc/nat.md, "Plans
# from history"): a pair whose punch cannot work (a dual-WAN router, as in
# tests/test_nat_ladder_netns.sh), its first round with a punch planned
# (which fails and pays the punch window) and its later rounds (relayed at
# once by history), beside a pair that the relay carries from its first
# round (goal: later rounds within 10%); and two hosts of one
# household behind a router that does not hairpin (the lan rung), beside a
# pair of public hosts that dial each other directly (goal: within 10%).
# Root only; not run by make check.
#
#   tests/bench/bench-nat.sh [MBIT] [DELAY_MS] [MIB] [ROUNDS]
#
# ROUNDS (3) full rounds are timed on each path (and for each pair after
# its first); 0 leaves the rounds out.
#
# Run from the build directory (top_builddir), or set top_builddir.
set -u
MBIT=${1:-50} DELAY=${2:-0} MIB=${3:-16} ROUNDS=${4:-3}
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
export top_builddir top_srcdir PG_BINDIR
B=$top_builddir
. "$top_srcdir/tests/netns.sh"
netns_check || { echo "SKIP: $NETNS_WHY"; exit 0; }
[ -n "${COTRAIN_DB:-}" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/nat-lib.sh"
. "$top_srcdir/tests/nat/netns-nat.sh"
. "$top_srcdir/tests/nat/round-lib.sh"
T=$(mktemp -d /tmp/cotrain-natbench-XXXXXX)
NETNS_EXIT_HOOK='rm -rf "$T"'
netns_init
die() { echo "bench-nat: $*" >&2; exit 1; }

"$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" db migrate >/dev/null || die "migrate"
nat_seed "11:0 12:0 13:0 15:0 20:0"
"$B/tests/nat/nat_driver" mkca "$T" nattest || die "CA"
chmod 755 "$T"
netns_hub_new || die "hub"
netns_hub_attach srv 1 0 || die "srv"
netns_hub_attach h20 20 "$MBIT" "$DELAY" || die "h20"
# Sites: routers shaped on their hub link.
natns_router r11 11 192.168.11 eim && natns_router r12 12 192.168.12 eim &&
	natns_router r13 13 192.168.13 symmetric && natns_cgnat r15 15 192.168.15 || die "routers"
SRV=$(netns_ip 1)
# The pairs: a household of two hosts (r21: h21, h22), a dual-WAN router
# (r23, second address at 24), a second public host (h26).
natns_router r21 21 192.168.21 eim && natns_household r21 22 192.168.22 &&
	natns_router r23 23 192.168.23 eim && natns_dualwan r23 24 "$SRV" || die "the pairs' routers"
netns_hub_attach h26 26 "$MBIT" "$DELAY" || die "h26"
for i in 11 12 13 15 21 23; do
	netns_shape "r$i" eth0 "$MBIT" "$DELAY" && netns_shape hub "p$i" "$MBIT" "$DELAY" || die "shape $i"
done
netns_bg srv "$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --listen "$SRV" \
	--port 8080 --relay-port 7001 --round-interval 3600 --kdf-iterations 1000 --log-level warn \
	>/dev/null 2>"$T/server.log"
BSPID=$NETNS_LAST_PID
n=100; while [ $n -gt 0 ] && ! grep -q 'listening on' "$T/server.log"; do sleep 0.1; n=$((n - 1)); done
grep -q 'listening on' "$T/server.log" || die "the server did not start"

drv() { _h=$1; _c=$2; shift 2
	netns_exec "h$_h" "$B/tests/nat/nat_driver" "$_c" --server "$SRV" --nat-port 7001 --host "$_h" \
		--token "$(nat_token "$_h")" --listen-port 40000 --ca-dir "$T" --seconds 60 "$@"; }
# run DIALER ACCEPTOR BYTES: prints the dialer's RUNG line
run() {
	drv "$2" accept --peer "$1" --bytes "$3" >/dev/null 2>&1 &
	_ap=$!
	sleep 0.3
	drv "$1" dial --peer "$2" --target "$(netns_ip "$2"):40000" --bytes "$3" 2>/dev/null | grep '^RUNG'
	wait $_ap
	natns_flush
}
for h in 11 12 13 15 20; do drv $h observe >/dev/null 2>&1 || die "observe $h"; done

: >"$T/pairs"
for d in 11 12 13 15 20; do for a in 11 12 13 15 20; do
	[ $d = $a ] && continue
	out=$(run $d $a 65536)
	echo "$d $a ${out:-RUNG failed connect_ms=0}" >>"$T/pairs"
done; done
total=$(wc -l <"$T/pairs")
nondirect=$(grep -c "RUNG relay\|RUNG failed" "$T/pairs")
echo "pairs: $total ordered pairs; without the relay: $((total - nondirect)) ($(awk -v a=$((total - nondirect)) -v b=$total 'BEGIN{printf "%.2f", a/b}'))"
for r in direct punch relay failed; do
	awk -v r=$r '$4 == r { split($5, x, "="); s += x[2]; n++ }
		END { if (n) printf "  %-6s %2d pairs, connect %.0f ms on average\n", r, n, s / n }' "$T/pairs"
done
bytes=$((MIB * 1048576))
punch=$(run 12 11 $bytes | sed -n 's/.*mbit_s=\([0-9.]*\).*/\1/p')
relay=$(run 13 11 $bytes | sed -n 's/.*mbit_s=\([0-9.]*\).*/\1/p')
echo "throughput of $MIB MiB over TLS, links shaped to $MBIT Mbit/s, ${DELAY} ms each way:"
echo "  punched (direct) path: ${punch:-?} Mbit/s; relay: ${relay:-?} Mbit/s"
awk -v p="${punch:-0}" -v r="${relay:-0}" -v m="$MBIT" 'BEGIN {
	if (p > 0) printf "  relay / direct = %.2f (goal >= 0.8)\n", r / p
	printf "  relay / nominal link = %.2f\n", r / m }'

[ "$ROUNDS" -gt 0 ] 2>/dev/null || exit 0
# The all-reduce of real rounds: punched (direct) paths against the relay.
kill "$BSPID" 2>/dev/null
wait "$BSPID" 2>/dev/null
netns_forget "$BSPID"
NR_MODEL='{"n_layer": 4, "n_shared": 4, "n_head": 4, "d_model": 256, "d_ff": 1024, "seq_len": 16, "vocab": 256}'
NR_TARGET=1024 NR_WU_MAX=32
# nat_seed chose its own ids: the sequences go past them.
nr_sql "select setval(pg_get_serial_sequence('account', 'id'), (select max(id) from account));
  select setval(pg_get_serial_sequence('host', 'id'), (select max(id) from host))" >/dev/null ||
	die "the id sequences"
nr_project "$T" || die "the round project"
nr_server "$T" "$SRV" 8081 7011 || die "the round server"
nr_renat r13 eim || die "r13 to eim"
natns_flush
for s in A:11 B:12 S:13 C:15; do
	nr_client "${s%%:*}" "${s#*:}" "http://$SRV:8081/projects/tiny" "$SRV:7011" || die "client ${s%%:*}"
done
# rounds_after V K: K full rounds after version V, in FULL
rounds_after() {
	FULL= _v=$1
	for _k in $(seq 1 "$2"); do
		nr_wait 300 nr_full_round_after "$_v" || return 1
		FULL="$FULL $NR_FOUND" _v=$NR_FOUND
	done
}
median() { sort -g | awk '{ x[NR] = $1 } END { if (NR) print (NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2) }'; }
rounds_after -1 "$ROUNDS" || die "no $ROUNDS rounds with all four sites (committed: $(nr_committed))"
PUNCHED=$FULL
nr_stop_clients
for r in r11 r12 r13 r15; do nr_renat "$r" symmetric || die "$r to symmetric"; done
natns_flush
V0=$(nr_sql "select current_version from project where name = 'tiny'")
for s in A:11 B:12 S:13 C:15; do nr_daemon "${s%%:*}" "${s#*:}" "$SRV:7011" || die "client ${s%%:*} again"; done
rounds_after $((V0 - 1)) "$ROUNDS" || die "no $ROUNDS relayed rounds with all four sites (committed from $V0: $(nr_committed "$V0"))"
RELAYED=$FULL
nr_stop_clients
nr_rungs "$PUNCHED $RELAYED" >"$T/rungs"
nparams=$(sed -n 's/.*groups, \([0-9]*\) parameters.*/\1/p' "$T/server.log" | head -1)
echo "all-reduce of real rounds, 4 sites (1 group), model of ${nparams:-3.2M} parameters, links $MBIT Mbit/s:"
for ph in punched relayed; do
	vs=$([ $ph = punched ] && echo "$PUNCHED" || echo "$RELAYED")
	nr_allreduce_s "$vs" >"$T/ar.$ph"
	rungs=$(for v in $vs; do awk -v v="$v" '$1 == v { print $6 }' "$T/rungs"; done | sort | uniq -c | awk '{ printf "%s%s %s", s, $1, $2; s = ", " }')
	printf "  %-8s rounds %s: all-reduce %s s (median; the slowest member's), connections: %s\n" "$ph" \
		"$(echo $vs)" "$(cut -d' ' -f2 "$T/ar.$ph" | median)" "$rungs"
done
awk -v d="$(cut -d' ' -f2 "$T/ar.punched" | median)" -v r="$(cut -d' ' -f2 "$T/ar.relayed" | median)" \
	'BEGIN { if (d > 0) printf "  relay / direct all-reduce time = %.2f\n", r / d }'

# Pairs alone.  pair_start A:IDX B:IDX: every other daemon stopped, the
# two sites' daemons started (attached first when new); V0, the project's
# version once both run.
pair_start() {
	nr_stop_clients
	natns_flush
	NR_SITES=
	for _s in "$@"; do
		if [ -n "$(nr_host "${_s%%:*}")" ]; then
			nr_daemon "${_s%%:*}" "${_s#*:}" "$SRV:7011" && NR_SITES="$NR_SITES ${_s%%:*}"
		else
			nr_client "${_s%%:*}" "${_s#*:}" "http://$SRV:8081/projects/tiny" "$SRV:7011"
		fi || return 1
	done
	V0=$(nr_sql "select current_version from project where name = 'tiny'")
}
# links "V...": what the pair's connections in rounds V were planned and
# took, counted ("2 punch/relay, 2 relay/relay")
links() {
	nr_sql "select string_agg(n || ' ' || pr, ', ' order by pr) from (select coalesce(l.plan, '-') || '/' || l.rung pr,
	  count(*) n from round_link l join project p on p.id = l.project_id
	  where p.name = 'tiny' and l.version in ($(echo $1 | tr ' ' ',')) group by 1) x"
}
# pair ROUNDS LABEL: the all-reduce median of rounds ROUNDS (printed), in MED
pair() {
	nr_allreduce_s "$1" >"$T/ar.pair"
	MED=$(cut -d' ' -f2 "$T/ar.pair" | median)
	printf "  %-34s rounds %s: all-reduce %s s (median), connections: %s\n" "$2" "$(echo $1)" "$MED" "$(links "$1")"
}
echo "pairs training alone (2 sites, links $MBIT Mbit/s):"
nr_renat r12 eim && nr_renat r15 eim || die "r12 and r15 to eim"
# The relayed pair: B and C (CGNAT), which could punch, with two failed
# punches written into their history (over their links of the last round
# before, which an outcome of theirs can no longer replace), so that the
# NAT service relays them at once for 3 rounds, as it does B and X.
HB=$(nr_host B) HC=$(nr_host C)
nr_sql "insert into round_link (project_id, version, host_id, peer_id, rung, connect_ms, plan)
  select p.id, p.current_version - 1, h.a, h.b, 'relay', 4000, 'punch' from project p,
    (values ($HB, $HC), ($HC, $HB)) h(a, b) where p.name = 'tiny'
  on conflict (project_id, version, host_id, peer_id)
  do update set rung = 'relay', connect_ms = 4000, plan = 'punch', reported_at = now()" >/dev/null ||
	die "the relayed pair's history"
pair_start B:12 C:15 || die "the relayed pair"
# its committed rounds whose links history relayed (at most 3: the 4th
# retries the punch), in FULL
NREL=$((ROUNDS < 3 ? ROUNDS : 3))
relayed_rounds() {
	FULL=$(nr_sql "select string_agg(version::text, ' ' order by version) from (select l.version from round_link l
	  join round r using (project_id, version) where r.state = 'committed' and l.version >= $V0
	    and ((l.host_id = $HB and l.peer_id = $HC) or (l.host_id = $HC and l.peer_id = $HB))
	  group by l.version having bool_and(l.plan = 'relay') order by l.version limit $NREL) x")
	[ "$(echo $FULL | wc -w)" -ge "$NREL" ]
}
nr_wait 600 relayed_rounds || die "no $NREL rounds of the relayed pair (rounds: ${FULL:-none})"
pair "$FULL" "relayed (history says so)"
RELAY_S=$MED
echo "    (B: $(nr_class B), C: $(nr_class C); the NAT service: $(grep -c "meet in round .*: relay (history" "$T/server.log") meetings relayed by history)"
pair_start B:12 X:23 || die "the pair that cannot punch"
HX=$(nr_host X)
first_punch() {
	FIRST=$(nr_sql "select min(l.version) from round_link l join round r using (project_id, version)
	  where r.state = 'committed' and l.plan = 'punch' and l.version > $V0
	    and ((l.host_id = $HB and l.peer_id = $HX) or (l.host_id = $HX and l.peer_id = $HB))")
	[ -n "$FIRST" ]
}
nr_wait 300 first_punch || die "the pair behind the dual-WAN router never tried a punch"
rounds_after "$FIRST" "$ROUNDS" || die "no $ROUNDS rounds of the pair that cannot punch after its first"
pair "$FIRST" "cannot punch (dual-WAN): first punch"
FIRST_S=$MED
pair "$FULL" "  later"
awk -v f="$FIRST_S" -v l="$MED" -v r="$RELAY_S" 'BEGIN { if (r > 0)
	printf "    later / relayed = %.2f (goal <= 1.10); first / relayed = %.2f\n", l / r, f / r }'
pair_start D1:20 D2:26 || die "the direct pair"
rounds_after "$V0" "$ROUNDS" || die "no $ROUNDS rounds of the direct pair"
pair "$FULL" "direct (two public hosts)"
DIRECT_S=$MED
pair_start H1:21 H2:22 || die "the household"
rounds_after "$V0" "$ROUNDS" || die "no $ROUNDS rounds of the household"
pair "$FULL" "one household (no hairpin)"
awk -v h="$MED" -v d="$DIRECT_S" 'BEGIN { if (d > 0) printf "    household / direct = %.2f (goal <= 1.10)\n", h / d }'
nr_stop_clients
