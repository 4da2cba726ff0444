#!/bin/sh
# cotrain benchmark: collaboration efficiency of rounds (issue 17).  PEERS
# cotrain-client daemons (one thread each) on this machine, a real server
# and PostgreSQL, the demo's model (packaging/demo/project.json) on the
# demo corpus with microbatch_size 4.
#
#   tests/bench/bench-rounds.sh [PEERS] [SECONDS] [ROUND_LENGTHS...]
#
# MODES (environment, default "sync local") names the round modes to run:
# sync (one optimizer step per round) and local (DiLoCo: inner steps of 2
# microbatches on each peer, one outer step per round).
# First the reference, measured in the same run: the same clients
# computing alone (a target no round reaches) for SECONDS (default 40) give
# the samples per second this machine computes.  Then, for each round
# length L (default 2 5 10 20 seconds), a project whose target_batch is
# what the clients compute alone in L seconds: after two rounds of warm-up,
# the committed samples per second over at least SECONDS (and 3 rounds),
# against the reference, is the collaboration efficiency.  For each length
# it prints the efficiency, the batch overshoot per round ((batch -
# target) / target, mean and largest), the time from a round's close to
# its commit (reports, plan, all-reduce, step), and from its commit to every
# peer computing on v+1 (its first work unit of v+1), mean and largest.
# Nothing is asserted.  Not run by make check.  The overlap mode of issue
# 17 does not exist yet.
#
# Run from the build directory (top_builddir), or set top_builddir.
set -u
PEERS=${1:-4} SECONDS_=${2:-40}
[ $# -gt 2 ] && shift 2 && LENGTHS=$* || LENGTHS="2 5 10 20"
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
export top_builddir top_srcdir PG_BINDIR
B=$(cd "$top_builddir" && pwd)
for f in "$B/server/cotrain-server" "$B/client/cotrain-client" "$B/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-rounds: $f is missing; run make first" >&2; exit 1; }
done
[ -n "${COTRAIN_DB:-}" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$PEERS" "$SECONDS_" $LENGTHS
T=$(mktemp -d /tmp/cotrain-benchrounds-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill -9 "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
die() { echo "bench-rounds: $*" >&2; exit 1; }
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
now() { date +%s.%N; }
version() { sql "select current_version from project where name = '$1'"; }

project() { # NAME TARGET WU_SECONDS [MODE]
	/usr/bin/python3 - "$top_srcdir/packaging/demo/project.json" "$1" "$2" "$3" "${4:-sync}" >"$T/$1.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for k in ("mode", "inner_batch", "outer"):
    p.pop(k, None)
p.update(name=sys.argv[2], title=sys.argv[2], dataset="bench", microbatch_size=4,
         target_batch=int(sys.argv[3]), work_unit_seconds=int(sys.argv[4]))
if sys.argv[5] == "local":
    p.update(mode="local", inner_batch=2)
p["optimizer"]["schedule"]["total_steps"] = 100000
print(json.dumps(p))
PY
	admin project create "$T/$1.json" >/dev/null || die "project $1"
	# Credit's spot checks are not what is measured here.
	sql "update spot_policy s set first_rate = 0, min_rate = 0 from project p
	  where p.id = s.project_id and p.name = '$1'" >/dev/null
}
start_clients() { # PROJECT
	CPIDS=
	for i in $(seq 1 "$PEERS"); do
		d="$T/$1-cl$i"
		mkdir -p "$d"
		"$B/client/cotrain-client" --state-dir "$d" --socket "$d/control.sock" \
			--set heartbeat_interval=2 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
			--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
			--set socket_group=nonexistent --set log_level=warn 2>>"$d/log" &
		CPIDS="$CPIDS $!"
	done
	for i in $(seq 1 "$PEERS"); do
		d="$T/$1-cl$i"
		n=300; while [ $n -gt 0 ] && [ ! -S "$d/control.sock" ]; do sleep 0.1; n=$((n - 1)); done
		"$B/client/cotrainctl" --socket "$d/control.sock" attach "http://127.0.0.1:$PORT/projects/$1" \
			--key "$KEY" >/dev/null || die "attach $i"
	done
}
stop_clients() {
	for p in $CPIDS; do kill "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	CPIDS=
}

mkdir -p "$T/text"
cp "$top_srcdir/packaging/demo/corpus.txt" "$T/text/"
admin db migrate >/dev/null && admin dataset import bench "$T/text" >/dev/null || die "dataset"
KEY=$(echo secretpassword | admin user create --password-stdin bench@example.org bench |
	sed -n 's/^account key: //p')
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --log-level warn 2>"$T/server.log" &
SPID=$!
n=200; while [ $n -gt 0 ] && ! grep -qs 'listening on' "$T/server.log"; do sleep 0.1; n=$((n - 1)); done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
[ -n "$PORT" ] || die "the server did not start"

# The reference: the same clients, alone (no round ever closes), measured
# before the rounds and again after them (the machine's speed drifts; the
# efficiency is against the mean of the two).
measure_alone() { # NAME (a subshell: nothing it sets survives)
	project "$1" 10000000 20
	start_clients "$1"
	pid=$(sql "select id from project where name = '$1'")
	sleep 10 # downloads, model loads, the first units
	s0=$(sql "select coalesce(sum(mb_done), 0) * 4 from version_progress where project_id = $pid") t0=$(now)
	sleep "$SECONDS_"
	s1=$(sql "select coalesce(sum(mb_done), 0) * 4 from version_progress where project_id = $pid") t1=$(now)
	stop_clients
	echo "($s1 - $s0) / ($t1 - $t0)" | bc -l
}
REF1=$(measure_alone alone1)
REF=$REF1
printf "rounds: %d peers, one thread each, the demo model (microbatch 4), %s\n" "$PEERS" \
	"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "  reference: the same clients computing alone, before the rounds: %.1f samples/s\n" "$REF1"
printf "  %-6s %-6s %7s %7s %10s %11s %13s %13s %13s\n" "mode" "round" "target" "rounds" "samples/s" \
	"efficiency" "overshoot" "close->commit" "commit->work"
printf "  %-6s %-6s %7s %7s %10s %11s %13s %13s %13s\n" "" "" "" "" "" "" "mean/max" "mean/max s" "mean/max s"

for MODE in ${MODES:-sync local}; do
for L in $LENGTHS; do
	target=$(echo "$REF * $L / 4" | bc) # microbatches
	target=$(( (target < 1 ? 1 : target) * 4 ))
	wu=$(( L < 5 ? 5 : L ))
	P="$MODE$L"
	project "$P" "$target" "$wu" "$MODE"
	pid=$(sql "select id from project where name = '$P'")
	start_clients "$P"
	# Two rounds of warm-up, then at least SECONDS and 3 rounds.
	n=$((600 * 10)); while [ $n -gt 0 ] && [ "$(version "$P")" -lt 2 ]; do sleep 0.1; n=$((n - 1)); done
	v0=$(version "$P")
	t0=$(now)
	while :; do
		v1=$(version "$P")
		[ "$v1" -ge $((v0 + 3)) ] && [ "$(echo "$(now) - $t0 >= $SECONDS_" | bc)" = 1 ] && break
		[ "$(echo "$(now) - $t0 > $SECONDS_ * 4 + 120" | bc)" = 1 ] && break
		sleep 0.5
	done
	stop_clients
	# Rounds v0 .. v1-1 committed after round v0-1's commit.
	sql "select r.version, r.gradient_samples,
	            extract(epoch from r.committed_at - prev.committed_at),
	            extract(epoch from r.committed_at - r.closed_at),
	            extract(epoch from (select max(f.first) from (select min(w.created_at) as first from work_unit w
	                where w.project_id = r.project_id and w.version = r.version + 1 group by w.host_id) f)
	                - r.committed_at)
	       from round r join round prev on prev.project_id = r.project_id and prev.version = r.version - 1
	      where r.project_id = $pid and r.state = 'committed' and r.version >= $v0 and r.version < $v1
	      order by r.version" | tr '|' ' ' >"$T/$P.rows"
	awk -v M="$MODE" -v L="$L" -v tgt="$target" -v ref="$REF" '
		{ n++; s += $2; t += $3; o = ($2 - tgt) / tgt; os += o; if (o > om) om = o
		  cs += $4; if ($4 > cm) cm = $4; if ($5 != "") { bn++; bs += $5; if ($5 > bm) bm = $5 } }
		END {
			if (n == 0 || t <= 0) { printf "  %-6s %-6s %7d %7s\n", M, L " s", tgt, "none"; exit }
			printf "  %-6s %-6s %7d %7d %10.1f %11.3f %6.3f/%-6.3f %6.2f/%-6.2f %6.2f/%-6.2f\n", M, L " s", tgt,
			       n, s / t, s / t / ref, os / n, om, cs / n, cm, (bn ? bs / bn : 0), bm
		}' "$T/$P.rows"
done
done
REF2=$(measure_alone alone2)
printf "  reference: the same clients computing alone, after the rounds: %.1f samples/s\n" "$REF2"
printf "  (efficiency above is against the first; against the mean of both multiply by %.3f)\n" \
	"$(echo "$REF1 / (($REF1 + $REF2) / 2)" | bc -l)"
