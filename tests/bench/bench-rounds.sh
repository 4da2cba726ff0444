#!/bin/sh
# cotrain benchmark: collaboration efficiency of rounds (issue 17).  PEERS
# cotrain-client daemons (one thread each) on this machine, a real server
# and PostgreSQL, the demo's model (packaging/demo/project.json) on the
# demo corpus with microbatch_size 4.
#
#   tests/bench/bench-rounds.sh [PEERS] [SECONDS] [ROUND_LENGTHS...]
#
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
# Only the sync mode exists (doc/design.md, "The round").  Nothing is
# asserted.  Not run by make check.
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

project() { # NAME TARGET WU_SECONDS
	/usr/bin/python3 - "$top_srcdir/packaging/demo/project.json" "$1" "$2" "$3" >"$T/$1.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p.update(name=sys.argv[2], title=sys.argv[2], dataset="bench", microbatch_size=4,
         target_batch=int(sys.argv[3]), work_unit_seconds=int(sys.argv[4]))
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

# The reference: the same clients, alone (no round ever closes).
project alone 10000000 20
start_clients alone
pid=$(sql "select id from project where name = 'alone'")
done_samples() { sql "select coalesce(sum(mb_done), 0) * 4 from version_progress where project_id = $pid"; }
sleep 10 # downloads, model loads, the first units
s0=$(done_samples) t0=$(now)
sleep "$SECONDS_"
s1=$(done_samples) t1=$(now)
stop_clients
REF=$(echo "($s1 - $s0) / ($t1 - $t0)" | bc -l)
printf "rounds: %d peers, one thread each, the demo model (microbatch 4), %s\n" "$PEERS" \
	"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "  reference: the same clients computing alone: %.1f samples/s (%d samples in %.1f s)\n" \
	"$REF" $((s1 - s0)) "$(echo "$t1 - $t0" | bc -l)"
printf "  %-8s %7s %9s %11s %11s %13s %13s %13s\n" "round" "target" "rounds" "samples/s" "efficiency" \
	"overshoot" "close->commit" "commit->work"
printf "  %-8s %7s %9s %11s %11s %13s %13s %13s\n" "" "" "" "" "" "mean/max" "mean/max s" "mean/max s"

for L in $LENGTHS; do
	target=$(echo "$REF * $L / 4" | bc) # microbatches
	target=$(( (target < 1 ? 1 : target) * 4 ))
	wu=$(( L < 5 ? 5 : L ))
	project "r$L" "$target" "$wu"
	pid=$(sql "select id from project where name = 'r$L'")
	start_clients "r$L"
	# Two rounds of warm-up, then at least SECONDS and 3 rounds.
	n=$((600 * 10)); while [ $n -gt 0 ] && [ "$(version "r$L")" -lt 2 ]; do sleep 0.1; n=$((n - 1)); done
	v0=$(version "r$L")
	t0=$(now)
	while :; do
		v1=$(version "r$L")
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
	      order by r.version" | tr '|' ' ' >"$T/r$L.rows"
	awk -v L="$L" -v tgt="$target" -v ref="$REF" '
		{ n++; s += $2; t += $3; o = ($2 - tgt) / tgt; os += o; if (o > om) om = o
		  cs += $4; if ($4 > cm) cm = $4; if ($5 != "") { bn++; bs += $5; if ($5 > bm) bm = $5 } }
		END {
			if (n == 0 || t <= 0) { printf "  %-8s %7d %9s\n", L " s", tgt, "no round"; exit }
			printf "  %-8s %7d %9d %11.1f %11.3f %6.3f/%-6.3f %6.2f/%-6.2f %6.2f/%-6.2f\n", L " s", tgt, n,
			       s / t, s / t / ref, os / n, om, cs / n, cm, (bn ? bs / bn : 0), bm
		}' "$T/r$L.rows"
done
