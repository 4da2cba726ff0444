#!/bin/sh
# cotrain benchmark: the server at scale (issue 21, doc/scale.md).  A real
# cotrain-server and PostgreSQL on loopback and tests/bench/simhosts: for
# the reference (10 hosts) and then each host count (default 100 1000), a
# fresh project of a tiny model whose round target is 16 samples per host
# (about 4 s of each host's fake compute), ROUNDS rounds (default 4; round
# 0 is the warm-up: registration, the first one-microbatch units).  Prints,
# per host count and as a ratio to the reference:
#   plan s      from the round's close (round.closed_at) to the last host
#               holding its plan, mean and largest over the measured rounds
#   p99 ms      p99 latency of the API calls (long polls excluded) started
#               between a round's close and its last plan delivered
#   cpu s/rnd   the server's CPU seconds (/proc/PID/stat) per measured round
#   B/rnd/host  bytes on the wire (requests and answers, headers included,
#               counted by the simulated hosts) per round per host
#   assign/s    work units handed out per second over the whole run
#   report s    from the close to the last report (mean): hosts hear of the
#               close at their next heartbeat (wu_seconds / 4 = 2 s here)
#   planned s   from the close to the coordinator's plan (mean)
# SERVER_ARGS go to cotrain-server (--round-server-mean: averaging through
# the server, each group's members uploading its sum; by default a round of
# three peers or more averages between the peers, no gradient reaching it) and
# SIM_ARGS to simhosts (--no-close-watch: hosts that hear of the close only
# at their next heartbeat, as clients before the close notice).
# A host count written N/S runs its N hosts against S server processes on
# the same database (host i speaks to the (i mod S)-th; the CPU is theirs
# together), so that "1000 1000/2" compares one process with two in one
# run.  KEEP=1 keeps the scratch folder (its path is printed): the logs per
# run.  PIN=1 puts the server processes and PostgreSQL on the first CPU and
# simhosts on the others (taskset), so that the simulated hosts' threads do
# not take the server's CPU.  "acceptq" is the most connections seen waiting
# in the first server process's accept queue (ss, sampled every 0.2 s).
# PROFILE=1 has PostgreSQL time its functions (track_functions = pl: it
# costs a little) and writes each run's calls, total and self milliseconds
# per function to functions.tsv in its folder (with KEEP=1).
# Nothing is asserted.  Not run by make check (tests/test_simhosts.sh is
# its smoke test).  One address holds at most 4096 connections
# (server/http.c): each host keeps one, so the host count stops there.
#
#   tests/bench/bench-scale.sh [HOSTS...]      (from the build directory)
set -u
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
export top_builddir top_srcdir PG_BINDIR
B=$(cd "$top_builddir" && pwd)
for f in "$B/server/cotrain-server" "$B/tests/bench/simhosts" "$B/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-scale: $f is missing; run make first" >&2; exit 1; }
done
[ -n "${COTRAIN_DB:-}" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
HOSTS=${*:-100 1000}
ROUNDS=${ROUNDS:-4}
T=$(mktemp -d /tmp/cotrain-benchscale-XXXXXX)
[ -n "${KEEP:-}" ] && echo "bench-scale: keeping $T" >&2
. "$top_srcdir/tests/bench/simhosts-lib.sh"
MON=
XPIDS= # the extra server processes
trap '[ -n "$MON" ] && kill "$MON" 2>/dev/null; for x in $XPIDS; do kill "$x" 2>/dev/null; done; sim_stop; [ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT INT TERM
die() { echo "bench-scale: $*" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
TCK=$(getconf CLK_TCK)

sim_setup || die "could not set up the database"
if [ -n "${PROFILE:-}" ]; then
	sim_sql "DO \$\$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = pl', current_database()); END \$\$" >/dev/null || die "could not set track_functions"
fi
# shellcheck disable=SC2086 # SERVER_ARGS are words
sim_server ${SERVER_ARGS:-} || die "the server did not start: $(cat "$T/server.log")"
PIDS=$SPID URLS=http://127.0.0.1:$PORT PORT0=$PORT
# More processes for the N/S counts, the first one's arguments each.
max=$(for h in $HOSTS; do case $h in */*) echo "${h#*/}" ;; *) echo 1 ;; esac; done | sort -n | tail -1)
i=2
while [ "$i" -le "$max" ]; do
	# shellcheck disable=SC2086 # SERVER_ARGS are words
	sim_server_at "$T/server$i.log" ${SERVER_ARGS:-} || die "server process $i did not start: $(cat "$T/server$i.log")"
	XPIDS="$XPIDS $SPID" PIDS="$PIDS $SPID" URLS="$URLS,http://127.0.0.1:$PORT"
	i=$((i + 1))
done
SPID=${PIDS%% *} # sim_stop stops the first process; the trap the others
SIM_PIN=
if [ -n "${PIN:-}" ]; then
	[ "$(nproc)" -ge 2 ] || die "PIN=1 needs 2 CPUs"
	# PostgreSQL's postmaster (its later backends inherit the CPU) and its
	# backends so far, then the server processes, every thread.
	pm=$(head -1 "$(sim_sql "show data_directory")/postmaster.pid")
	for x in $pm $(pgrep -P "$pm") $PIDS; do taskset -apc 0 "$x" >/dev/null || die "taskset failed on $x"; done
	SIM_PIN="taskset -c 1-$(($(nproc) - 1))"
fi
# cpu_ticks S: the CPU ticks of the first S server processes together
cpu_ticks() { for x in $(echo $PIDS | cut -d' ' -f1-"$1"); do awk '{ print $14 + $15 }' "/proc/$x/stat"; done |
	awk '{ s += $1 } END { print s }'; }

# run N[/S]: one measured run; prints "N[/S] plan_mean plan_max p99 cpu bytes assign"
run() {
	n=${1%/*} sv=1 p=scale$(echo "$1" | tr / x)
	case $1 in */*) sv=${1#*/} ;; esac
	urls=$(echo "$URLS" | cut -d, -f1-"$sv")
	sim_project "$p" $((n * 16)) || die "project $p: $(cat "$T/$p.out")"
	pid=$(sim_sql "select id from project where name = '$p'")
	mkdir -p "$T/$p"
	# The server's CPU when each version opens.
	(
		last=-1
		while :; do
			v=$(sim_sql "select current_version from project where id = $pid")
			[ "$v" != "$last" ] && echo "$v $(cpu_ticks "$sv")" >>"$T/$p/cpu" && last=$v
			ss -Hltn "( sport = :$PORT0 )" | awk '{ print $2 }' >>"$T/$p/acceptq"
			sleep 0.2
		done
	) &
	MON=$!
	[ -n "${PROFILE:-}" ] && sim_sql "select pg_stat_reset()" >/dev/null
	# shellcheck disable=SC2086 # SIM_ARGS are words
	$SIM_PIN "$B/tests/bench/simhosts" --url "$urls" --project "$p" --key "$KEY" --hosts "$n" \
		--rounds "$ROUNDS" --seconds 900 --speed 4 --ramp $((n / 200 + 2)) --seed 7 --out "$T/$p" ${SIM_ARGS:-} \
		>"$T/$p/sim.out" 2>"$T/$p/sim.err" || echo "bench-scale: simhosts at $n hosts: $(tail -1 "$T/$p/sim.err")" >&2
	sleep 0.5
	kill "$MON" 2>/dev/null
	wait "$MON" 2>/dev/null
	MON=
	if [ -n "${PROFILE:-}" ]; then
		sleep 1 # the backends' function counts reach the statistics within a second
		sim_sql "select funcname, calls, round(total_time::numeric, 1), round(self_time::numeric, 1)
		           from pg_stat_user_functions order by self_time desc" | tr '|' '\t' >"$T/$p/functions.tsv"
	fi
	sim_sql "select r.version, extract(epoch from r.closed_at),
	         extract(epoch from (select max(q.reported_at) from round_report q
	                              where q.project_id = r.project_id and q.version = r.version) - r.closed_at),
	         extract(epoch from r.planned_at - r.closed_at)
	    from round r where r.project_id = $pid and r.state = 'committed' and r.version >= 1
	   order by r.version" | tr '|' ' ' >"$T/$p/closed"
	rounds=$(wc -l <"$T/$p/closed")
	[ "$rounds" -gt 0 ] || { echo "$1 - - - - - - - - -"; return; }
	split=$(awk '{ r += $3; p += $4 } END { printf "%.2f %.2f", r / NR, p / NR }' "$T/$p/closed")
	# Per measured round: the close and the last plan delivered.
	awk 'NR == FNR { c[$1] = $2; next } ($1 in c) { if ($2 > last[$1]) last[$1] = $2 }
	     END { for (v in c) if (v in last) print v, c[v], last[v] }' "$T/$p/closed" "$T/$p/plans.tsv" >"$T/$p/storm"
	plan=$(awk '{ d = $3 - $2; s += d; if (d > m) m = d; k++ } END { printf "%.2f %.2f", k ? s / k : 0, m }' "$T/$p/storm")
	p99=$(awk 'NR == FNR { lo[NR] = $2; hi[NR] = $3; k = NR; next }
	      $3 == "api" { for (i = 1; i <= k; i++) if ($1 >= lo[i] && $1 <= hi[i]) { print $2; break } }' \
		"$T/$p/storm" "$T/$p/lat.tsv" | sort -n | awk '{ a[NR] = $1 } END { i = int(NR * 0.99); if (i < 1) i = 1; print NR ? a[i] : 0 }')
	c1=$(awk '$1 == 1 { print $2 }' "$T/$p/cpu") c2=$(awk -v v=$((rounds + 1)) '$1 == v { print $2 }' "$T/$p/cpu")
	cpu=$(echo "(${c2:-0} - ${c1:-0}) / $TCK / $rounds" | bc -l)
	bytes=$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' "$T/$p/sim.out")
	assign=$(sed -n 's/.* assignments=\([0-9]*\).* seconds=\([0-9.]*\).*/\1 \2/p' "$T/$p/sim.out")
	all=$(sim_sql "select count(*) from round where project_id = $pid and state = 'committed'")
	acq=$(sort -n "$T/$p/acceptq" | tail -1)
	printf "%s %s %s %.3f %.0f %s %s %s\n" "$1" "$plan" "$p99" "$cpu" "$(echo "${bytes:-0} / $all / $n" | bc -l)" \
		"$(echo "$assign" | awk '{ printf "%.1f", ($2 > 0 ? $1 / $2 : 0) }')" "$split" "${acq:-0}"
}

printf "scale: simhosts %s against cotrain-server %s (N/S: S processes)%s on loopback, %s, %s cores, load %s\n" \
	"${SIM_ARGS:-}" "${SERVER_ARGS:-}" "${PIN:+, pinned: the server and PostgreSQL on CPU 0}" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
	"$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "  %6s %17s %9s %10s %11s %9s %9s %9s %8s\n" hosts "plan s mean/max" "p99 ms" "cpu s/rnd" "B/rnd/host" \
	"assign/s" "report s" "planned s" acceptq
row() {
	echo "$1" | awk -v r="$2" '{
		printf "  %6s %8s/%-8s %9s %10s %11s %9s %9s %9s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
		if (r != "") { split(r, q, " ")
			printf "  %6s %7.1fx/%-7s %8.1fx %9.1fx %10.2fx %8.1fx  (against the reference)\n", "",
			       q[2] ? $2 / q[2] : 0, sprintf("%.1fx", q[3] ? $3 / q[3] : 0), q[4] ? $4 / q[4] : 0, q[5] ? $5 / q[5] : 0,
			       q[6] ? $6 / q[6] : 0, q[7] ? $7 / q[7] : 0 } }'
}
REF=$(run 10)
row "$REF" ""
for n in $HOSTS; do
	row "$(run "$n")" "$REF"
done
