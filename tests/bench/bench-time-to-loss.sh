#!/bin/sh
# cotrain benchmark: time to a held-out loss (issue 17).  One volunteer
# alone against four, each capped at half a core (a cgroup v1 CPU quota,
# 50 ms every 100 ms: root only), on the demo's model and text, for each
# round mode:
#   1. one client trains project "one-MODE" for MINUTES minutes; the loss to
#      reach is the held-out bits per byte of the last version it committed
#      (evaluated by the server on data no work unit holds);
#   2. four clients train project "four-MODE" (the same file, another name)
#      until a committed version's held-out loss is at or below that, or
#      MINUTES pass;
#   3. prints both times and the speed-up (time of one / time of four, from
#      the first work unit to the commit of the version that reached it).
# Goal: at least 3x for the best mode.  The server and its evaluator run
# uncapped beside them.  Nothing is asserted.  Not run by make check.
#
#   tests/bench/bench-time-to-loss.sh [MINUTES] [MODES]
#
# MINUTES defaults to 10, MODES to "sync local".  Run from the build
# directory (top_builddir), or set top_builddir.
set -u
MINUTES=${1:-10}
MODES=${2:-sync local}
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
export top_builddir top_srcdir PG_BINDIR
B=$(cd "$top_builddir" && pwd)
CG=/sys/fs/cgroup/cpu
if [ "$(id -u)" != 0 ] || [ ! -w "$CG" ]; then
	echo "SKIP: needs root and a writable cgroup v1 cpu controller at $CG"
	exit 0
fi
[ -n "${COTRAIN_DB:-}" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$MINUTES" "$MODES"
T=$(mktemp -d /tmp/cotrain-ttl-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill -9 "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	for g in "$CG"/cotrain-ttl-*; do [ -d "$g" ] && rmdir "$g" 2>/dev/null; done
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
die() { echo "bench-time-to-loss: $*" >&2; exit 1; }
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }

mkdir -p "$T/text"
cp "$top_srcdir/packaging/demo/corpus.txt" "$T/text/"
admin db migrate >/dev/null && admin dataset import demo "$T/text" >/dev/null || die "dataset"
KEY=$(echo secretpassword | admin user create --password-stdin bench@example.org bench |
	sed -n 's/^account key: //p')
for m in $MODES; do
	for who in one four; do
		/usr/bin/python3 - "$top_srcdir/packaging/demo/project.json" "$who-$m" "$m" >"$T/$who-$m.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p.update(name=sys.argv[2], title=sys.argv[2])
if sys.argv[3] == "sync":
    for k in ("mode", "inner_batch", "outer"):
        p.pop(k, None)
    p.update(target_batch=256)
    p["optimizer"]["schedule"].update(warmup_steps=10, total_steps=100000, decay="constant")
else:
    p["optimizer"]["schedule"].update(total_steps=100000, decay="constant")
print(json.dumps(p))
PY
		admin project create "$T/$who-$m.json" >/dev/null || die "project $who-$m"
		sql "update spot_policy s set first_rate = 0, min_rate = 0 from project p
		  where p.id = s.project_id and p.name = '$who-$m'" >/dev/null
	done
done
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --log-level warn 2>"$T/server.log" &
SPID=$!
n=200; while [ $n -gt 0 ] && ! grep -qs 'listening on' "$T/server.log"; do sleep 0.1; n=$((n - 1)); done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
[ -n "$PORT" ] || die "the server did not start"

start_clients() { # PROJECT N: N clients, each in its own cgroup of half a core
	CPIDS=
	for i in $(seq 1 "$2"); do
		d="$T/$1-cl$i" g="$CG/cotrain-ttl-$1-$i"
		mkdir -p "$d" "$g"
		echo 100000 >"$g/cpu.cfs_period_us"
		echo 50000 >"$g/cpu.cfs_quota_us"
		sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$g" \
			"$B/client/cotrain-client" --state-dir "$d" --socket "$d/control.sock" \
			--set heartbeat_interval=2 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
			--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
			--set socket_group=nonexistent --set log_level=warn 2>>"$d/log" &
		CPIDS="$CPIDS $!"
	done
	for i in $(seq 1 "$2"); do
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
# Seconds from project $1's first work unit to the commit of its first
# version whose held-out loss is at most $2 ("" when none).
time_to() {
	sql "select extract(epoch from r.committed_at - (select min(w.created_at) from work_unit w where w.project_id = p.id))
	  from model_version mv join project p on p.id = mv.project_id
	  join round r on r.project_id = p.id and r.version = mv.version - 1
	  where p.name = '$1' and mv.heldout_bpb <= $2 order by mv.version limit 1"
}
# Wait until the server has evaluated every committed version of $1.
evaluated() {
	n=0
	while [ $n -lt 300 ] && [ -n "$(sql "select 1 from model_version mv join project p on p.id = mv.project_id
	  where p.name = '$1' and mv.heldout_bpb is null and mv.heldout_error is null limit 1")" ]; do
		sleep 1
		n=$((n + 1))
	done
}

printf "time to a held-out loss: demo model and text, every client capped at half a core, %s\n" \
	"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for m in $MODES; do
	start_clients "one-$m" 1
	sleep $((MINUTES * 60))
	stop_clients
	evaluated "one-$m"
	goal=$(sql "select mv.heldout_bpb, mv.version from model_version mv join project p on p.id = mv.project_id
	  where p.name = 'one-$m' and mv.heldout_bpb is not null order by mv.version desc limit 1")
	bpb=${goal%|*}
	[ -n "$bpb" ] || { echo "  $m: the single client reached no evaluated version"; continue; }
	t1=$(time_to "one-$m" "$bpb")
	start_clients "four-$m" 4
	end=$(( $(date +%s) + MINUTES * 60 ))
	t4=
	while [ "$(date +%s)" -lt "$end" ]; do
		sleep 5
		t4=$(time_to "four-$m" "$bpb")
		[ -n "$t4" ] && break
	done
	stop_clients
	[ -n "$t4" ] || { evaluated "four-$m"; t4=$(time_to "four-$m" "$bpb"); }
	if [ -n "$t4" ]; then
		four=$(printf '%.0f s' "$t4") up=$(printf '%.2fx' "$(echo "$t1 / $t4" | bc -l)")
	else
		four="not reached in $MINUTES min" up=-
	fi
	printf "  %-6s one client: %.3f bits/byte (version %s) in %.0f s; four: %s; speed-up %s\n" "$m" "$bpb" \
		"${goal#*|}" "$t1" "$four" "$up"
done
