#!/bin/sh
# cotrain tests: retention and backup with a live run.  A real PostgreSQL,
# cotrain-server with the collector every second (keep the last 2 versions,
# no periodic ones) and two cotrain-client daemons training a tiny
# model
# (a grace of 5 s: the step stores a checkpoint a moment before its row):
#   - the clients never miss a file (no download fails) while the collector
#     removes old checkpoints, group sums and mean gradients under them;
#   - once they stop, exactly the policy's versions keep checkpoints, and
#     every row has its file;
#   - a backup taken while they train restores into a new data folder and
#     database, and a server started there carries the run on to the next
#     version.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-retain-e2e-XXXXXX)
chmod 755 "$T"
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
DB=$COTRAIN_DB
admin() { "$B/server/cotrain-admin" --db "$DB" --data-dir "$DATA" "$@"; }
sql() { "$PG_BINDIR/psql" "$DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'r'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
start_server() {
	"$B/server/cotrain-server" --db "$DB" --data-dir "$DATA" --port 0 --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --round-report-timeout 4 --round-average-timeout 20 \
		--gc-interval 1 --gc-keep-last 2 --gc-keep-every 0 --gc-grace 5 --log-level info 2>"$1" &
	SPID=$!
	wait_for 20 grep -qs 'listening on' "$1" || bail_out "the server did not start"
	PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1")
}
start_client() { # N KEY
	mkdir -p "$T/cl$1"
	"$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=1 2>>"$T/client$1.log" &
	CPIDS="$CPIDS $!"
	wait_for 30 test -S "$T/cl$1/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$1/control.sock" attach "http://127.0.0.1:$PORT/projects/r" \
			--key "$2" >/dev/null
}
stop_clients() {
	for p in $CPIDS; do kill "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	CPIDS=
}

plan 9

DATA="$T/srv"
mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/r.json" <<JSON
{"name": "r", "title": "r", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 32, "microbatch_size": 4, "seed": 11, "work_unit_seconds": 20}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/r.json" >/dev/null || bail_out "could not set up the project"
K1=$(echo secretpassword | admin user create --password-stdin c1@example.org c1 | sed -n 's/^account key: //p')
K2=$(echo secretpassword | admin user create --password-stdin c2@example.org c2 | sed -n 's/^account key: //p')

start_server "$T/server.log"
start_client 1 "$K1" && start_client 2 "$K2" || bail_out "a client did not start"
wait_for 300 version_at_least 4
ok $? "two clients train while the collector runs every second (version $(version))"
admin backup "$T/bk" >"$T/backup.out" 2>&1
ok $? "a backup taken while they train: $(cat "$T/backup.out")"
BV=$(sql "select max(version) from model_version where checkpoint_sha256 is not null" )
wait_for 300 version_at_least 8
ok $? "they go on training (version $(version))"
stop_clients
sleep 8 # past the grace period, then passes of the collector
grep -q 'file store collection: removed' "$T/server.log"
ok $? "the collector removed files meanwhile"
# (A bare "404" would match inside the sha256 of a checkpoint or a
# parameter hash, which the clients log every round.)
missed='could not download|\(404\)|HTTP 404|sha256 mismatch'
! grep -qiE "$missed" "$T"/client*.log
ok $? "no client missed a file" ||
	grep -hiE "$missed" "$T"/client*.log | head -5 | while IFS= read -r l; do diag "$l"; done
kept=$(sql "select string_agg(version::text, ',' order by version) from model_version mv
  where project_id = (select id from project where name = 'r') and checkpoint_sha256 is not null")
want=$(sql "select string_agg(v::text, ',' order by v) from (
  select p.current_version - 1 v from project p union select p.current_version from project p
  union select version from spot_check where state = 'open'
  union select version from work_unit where state = 'live') x where v >= 0")
is "$kept" "$want" "exactly the last two versions and those open spot checks name keep checkpoints ($kept)"
missing=0
for s in $(sql "select sha256 from file"); do [ -f "$DATA/files/$(echo "$s" | cut -c1-2)/$s" ] || missing=$((missing + 1)); done
is "$missing" 0 "every row has its file"
kill "$SPID"; wait "$SPID" 2>/dev/null; SPID=

# Restore the backup into a new folder and database, and go on.
sql "create database restored" >/dev/null
DB=$(echo "$COTRAIN_DB" | sed 's/dbname=[^ ]*/dbname=restored/')
DATA="$T/new"
admin restore "$T/bk" >"$T/restore.out" 2>&1
ok $? "restore: $(cat "$T/restore.out")"
V0=$(version)
start_server "$T/server2.log"
start_client 3 "$K1" || bail_out "a client did not start"
wait_for 300 version_at_least $((V0 + 1))
ok $? "a server on the restored folder carries the run from version $V0 to $(version)"
stop_clients
