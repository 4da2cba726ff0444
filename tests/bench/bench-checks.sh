#!/bin/sh
# cotrain benchmark: what spot checks of microbatch sketches cost (issue
# 18; doc/credit.md, "Spot checks").  PEERS cotrain-client daemons (one
# thread each; each its own account, so that they check one another), a
# real server and PostgreSQL, the demo's model (packaging/demo/project.json)
# in sync mode with its target_batch and microbatch_size, ROUNDS rounds,
# every host new (first_rate 1) under the project's adaptive policy (TRUST
# adaptive: the rate falls as a host's record of agreeing checks grows), or
# checked on every round (TRUST never: never trusted).
#
#   tests/bench/bench-checks.sh [PEERS] [ROUNDS] [MICROBATCHES] [TRUST]
#
# Prints, from the server's record, the microbatches the checkers and third
# hosts recomputed against every microbatch trained (the compute of the
# checks, as a share of the training they check: the reference is the run's
# own training), the same for whole-range checks of the same work units (a
# checker and the host each recomputing the range, as before issue 18), and
# then tests/bench/bench_sketch's cost of the per-microbatch sketch beside a
# microbatch at the demo size and at 19M parameters.  Nothing is asserted.
# Not run by make check.  Run from the build directory, or set top_builddir.
set -u
PEERS=${1:-4} ROUNDS=${2:-4} MBS=${3:-2} TRUST=${4:-adaptive}
case $TRUST in
adaptive) POLICY="first_rate = 1" ;;
never) POLICY="first_rate = 1, trusted_after = 1000000" ;;
*) echo "bench-checks: TRUST must be adaptive or never, not \"$TRUST\"" >&2; exit 2 ;;
esac
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
export top_builddir top_srcdir PG_BINDIR
B=$(cd "$top_builddir" && pwd)
for f in "$B/server/cotrain-server" "$B/client/cotrain-client" "$B/tests/with-pgtmp" "$B/tests/bench/bench_sketch"; do
	[ -x "$f" ] || { echo "bench-checks: $f is missing; run make first" >&2; exit 1; }
done
[ -n "${COTRAIN_DB:-}" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$PEERS" "$ROUNDS" "$MBS" "$TRUST"
T=$(mktemp -d /tmp/cotrain-benchchecks-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill -9 "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
die() { echo "bench-checks: $*" >&2; exit 1; }
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }

mkdir -p "$T/text"
cp "$top_srcdir/packaging/demo/corpus.txt" "$T/text/"
/usr/bin/python3 - "$top_srcdir/packaging/demo/project.json" >"$T/p.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for k in ("mode", "inner_batch", "outer"):
    p.pop(k, None)
p.update(name="checks", title="checks", dataset="bench")
p["optimizer"]["schedule"]["total_steps"] = 100000
print(json.dumps(p))
PY
admin db migrate >/dev/null && admin dataset import bench "$T/text" >/dev/null &&
	admin project create "$T/p.json" >/dev/null || die "setup"
sql "update spot_policy set $POLICY, microbatches = $MBS" >/dev/null
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --log-level warn 2>"$T/server.log" &
SPID=$!
n=200; while [ $n -gt 0 ] && ! grep -qs 'listening on' "$T/server.log"; do sleep 0.1; n=$((n - 1)); done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
[ -n "$PORT" ] || die "the server did not start"
for i in $(seq 1 "$PEERS"); do
	d="$T/cl$i"
	mkdir -p "$d"
	"$B/client/cotrain-client" --state-dir "$d" --socket "$d/control.sock" \
		--set heartbeat_interval=2 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 --set spot_interval=1 \
		--set socket_group=nonexistent --set log_level=warn 2>>"$d/log" &
	CPIDS="$CPIDS $!"
	key=$(echo secretpassword | admin user create --password-stdin "b$i@example.org" "bench $i" |
		sed -n 's/^account key: //p')
	n=300; while [ $n -gt 0 ] && [ ! -S "$d/control.sock" ]; do sleep 0.1; n=$((n - 1)); done
	"$B/client/cotrainctl" --socket "$d/control.sock" attach "http://127.0.0.1:$PORT/projects/checks" \
		--key "$key" >/dev/null || die "attach $i"
done
n=0
while [ "$(sql "select current_version from project where name = 'checks'")" -le "$ROUNDS" ]; do
	sleep 1; n=$((n + 1)); [ $n -lt 3600 ] || die "no $ROUNDS rounds in an hour"
done
# Let the checks of the last rounds be answered.
sleep 20
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=
sql "select 'rounds=' || count(distinct version) || ' checks=' || count(*) ||
  ' answered=' || count(*) filter (where fp_checker is not null) ||
  ' agreed=' || count(*) filter (where state = 'agreed') ||
  ' disputed=' || count(*) filter (where disputed_at is not null)
  from spot_check where microbatches is not null"
trained=$(sql "select sum(mb_done) from work_unit w where state in ('done', 'returned')
  and exists (select 1 from round r where r.project_id = w.project_id and r.version = w.version and r.state = 'committed')")
checked=$(sql "select coalesce(sum(cardinality(microbatches) * ((fp_checker is not null)::int + (fp_third is not null)::int)), 0)
  from spot_check where microbatches is not null")
whole=$(sql "select coalesce(sum(2 * (hi - lo)), 0) from spot_check where microbatches is not null and fp_checker is not null")
echo "$checked $trained $whole $PEERS $MBS $TRUST" | awk '{printf "microbatches_recomputed=%d microbatches_trained=%d check_share=%.4f whole_range_check_share=%.4f (peers=%d, %d microbatches a check, first_rate 1, trust %s)\n", $1, $2, $1 / $2, $3 / $2, $4, $5, $6}'
"$B/tests/bench/bench_sketch" --model demo
"$B/tests/bench/bench_sketch" --model sahaj --steps 3
