#!/bin/sh
# cotrain tests: rounds keep their promise (issue 17).  A real PostgreSQL,
# cotrain-server and four cotrain-client daemons at different speeds
# (threads, CPU share) train a tiny model with target_batch 32,
# microbatch_size 4 and 20 s work units, every host spot-checked on every
# round (first_rate 1, never trusted):
#   - every committed step's batch is within [target, target + peers x
#     microbatch_size], over at least 20 rounds;
#   - no work unit of a client passes its deadline, no gradient is dropped,
#     and yet spot checks are answered (they run between rounds, bounded);
#   - the batch of every step is recorded (GET .../rounds) and the stream
#     is tiled exactly afterwards (tests/invariants.sh);
#   - the dashboard's samples per second now reads the hosts computing;
#   - with min_batch_fraction 1, a peer that dies after the close (fault
#     point before-report) leaves too few samples: the round reopens for
#     the rest in the same attempt instead of stepping, the survivor keeps
#     its gradient and computes on, and it commits with the full target.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-target-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill_ours -CONT "$p"; kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = '$1'"; }
version_at_least() { [ "$(version "$1")" -ge "$2" ] 2>/dev/null; }
start_client() { # N PROJECT THREADS CPU_PERCENT [ENV...]
	c_n=$1 c_p=$2 c_t=$3 c_c=$4
	shift 4
	mkdir -p "$T/cl$c_n"
	env "$@" "$B/client/cotrain-client" --state-dir "$T/cl$c_n" --socket "$T/cl$c_n/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$c_t" \
		--set cpu_percent="$c_c" --set socket_group=nonexistent --set log_level=info \
		--set spot_interval=1 2>>"$T/client$c_n.log" &
	CPIDS="$CPIDS $!"
	eval "CPID$c_n=$!"
	# Each volunteer its own account: spot checks pair hosts of different
	# accounts.
	_key=$(echo secretpassword | admin user create --password-stdin "c$c_n@example.org" "client $c_n" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$c_n/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$c_n/control.sock" attach "http://127.0.0.1:$PORT/projects/$c_p" \
			--key "$_key" >/dev/null
}
stop_clients() {
	for p in $CPIDS; do kill "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	CPIDS=
}
project() { # NAME TARGET MIN_BATCH_FRACTION [WORK_UNIT_SECONDS]
	cat >"$T/$1.json" <<JSON
{"name": "$1", "title": "$1", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": $2, "microbatch_size": 4, "seed": 11, "work_unit_seconds": ${4:-20},
 "min_batch_fraction": $3}
JSON
	admin project create "$T/$1.json" >/dev/null
}

plan 13

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	project t32 32 0 && project reopen 2048 1 && project slow 65536 0 3 || bail_out "could not set up the projects"
# Every host of t32 checked on every round: never trusted.  None of
# "reopen": both of its hosts compute every round.
sql "update spot_policy s set first_rate = 1, trusted_after = 1000000 from project p
  where p.id = s.project_id and p.name = 't32'" >/dev/null
sql "update spot_policy s set first_rate = 0, min_rate = 0 from project p
  where p.id = s.project_id and p.name = 'reopen'" >/dev/null

"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 4 --round-average-timeout 20 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

# Four volunteers at different speeds.
start_client 1 t32 1 100 && start_client 2 t32 2 100 && start_client 3 t32 1 50 &&
	start_client 4 t32 2 100 || bail_out "a client did not start"
wait_for 400 version_at_least t32 21
ok $? "four clients at different speeds commit 20 rounds (version $(version t32))"
stop_clients

# The batch of every committed step, from the server's record.
pid=$(sql "select id from project where name = 't32'")
bad=$(sql "select string_agg(r.version || ':' || r.gradient_samples || '/' || m.n, ' ')
  from round r cross join lateral (select count(*) n from round_member m
   where m.project_id = r.project_id and m.version = r.version and m.included) m
  where r.project_id = $pid and r.state = 'committed'
    and (r.gradient_samples < 32 or r.gradient_samples > 32 + 4 * m.n)")
batches=$(sql "select string_agg(gradient_samples::text, ' ' order by version) from round
  where project_id = $pid and state = 'committed'")
ok $([ -z "$bad" ] && echo 0 || echo 1) \
	"every committed batch is within [32, 32 + 4 x peers] (${bad:+outside: $bad; }batches: $batches)"
listed=$(curl -s "http://127.0.0.1:$PORT/v1/projects/t32/rounds?limit=100" |
	/usr/bin/python3 -c 'import json,sys; print(" ".join(str(r["samples"]) for r in sorted(json.load(sys.stdin)["rounds"], key=lambda r: r["version"]) if r["state"] == "committed"))')
is "$listed" "$batches" "GET .../rounds shows the batch of every committed step"
is "$(sql "select count(*) from round where project_id = $pid and state = 'committed' and attempt > 1")" 0 \
	"no round needed a second attempt"
is "$(grep -c 'work units expired' "$T/server.log")" 0 "no work unit passed its deadline (the reaper expired none)"
# (The round of version 21 or later is cut by the clients' stop: its drops
# are the stop's, not the scheduler's.)
dropped() { cat "$T"/client*.log | grep 'dropping the gradient\|handing back work unit' |
	grep -v 'dropping the gradient of version \(2[1-9]\|[3-9][0-9]\|[0-9]\{3,\}\) '; }
is "$(dropped | wc -l)" 0 "no client dropped a gradient or handed back a unit" ||
	dropped | head -5 | while IFS= read -r l; do diag "$l"; done
answered=$(cat "$T"/client*.log | sed -n 's/.*answered \([0-9]*\) spot check.*/\1/p' | awk '{s += $1} END {print s + 0}')
ok $([ "$answered" -ge 1 ] && echo 0 || echo 1) "spot checks were answered meanwhile ($answered fingerprints)"
coverage_exact t32 "after 20 rounds"

# Too few samples after the close: one peer trains alone, a second joins
# and dies after the close of the first round it computed for, before it
# reports (a larger target, so that both compute in that round).
start_client 6 reopen 1 100 || bail_out "a client did not start"
wait_for 120 version_at_least reopen 1 || bail_out "the first client trains nothing"
# The dashboard's "samples / s now" while one host trains: it computes
# at its measured speed, not 0 between heartbeats.
speeds=
for i in 1 2 3 4 5 6 7 8 9 10; do
	speeds="$speeds $(curl -s "http://127.0.0.1:$PORT/v1/projects/reopen/dashboard" |
		/usr/bin/python3 -c 'import json,sys; print(round(json.load(sys.stdin)["samples_per_sec"]))')"
	sleep 0.5
done
nonzero=$(echo $speeds | tr ' ' '\n' | awk '$1 > 0' | wc -l)
ok $([ "$nonzero" -ge 5 ] && echo 0 || echo 1) "the dashboard shows the samples per second now while a host trains ($speeds)"
start_client 5 reopen 1 100 COTRAIN_FAULT=before-report:die || bail_out "a client did not start"
wait_for 120 grep -q "fault point before-report: die" "$T/client5.log"
ok $? "the second client died after a close, before it reported"
rp=$(sql "select id from project where name = 'reopen'")
reopened() { [ -n "$(sql "select 1 from round where project_id = $rp and state = 'committed'
  and last_failure like 'reopened for the rest%'")" ]; }
wait_for 120 reopened
r=$(sql "select version || ': attempt ' || attempt || ', ' || gradient_samples || ' samples, ' || last_failure
  from round where project_id = $rp and last_failure like 'reopened for the rest%'")
ok $(case $r in *": attempt 1, 2048 samples, reopened for the rest"*) echo 0 ;; *) echo 1 ;; esac) \
	"the round reopened for the rest in its first attempt and stepped on the full target (${r:-no round reopened})"
grep -q "reopened for the rest of its batch; computing on" "$T/client6.log"
ok $? "the survivor kept its gradient and computed on"
stop_clients

# A slow link: a volunteer joins while the model is at version 1 or later
# with download_limit 150k, so the checkpoint (1.4 MB) takes longer to
# fetch than a work unit may live (work_unit_seconds 3: a 6 s deadline).
# It fetches the checkpoint before it asks for work, and takes part.
start_client 7 slow 1 100 && wait_for 120 version_at_least slow 2 || bail_out "the slow project trains nothing"
mkdir -p "$T/cl8"
"$B/client/cotrain-client" --state-dir "$T/cl8" --socket "$T/cl8/control.sock" \
	--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
	--set only_on_ac=false --set idle_detection=none --set max_threads=1 --set download_limit=150000 \
	--set socket_group=nonexistent --set log_level=info 2>>"$T/client8.log" &
CPIDS="$CPIDS $!"
key8=$(echo secretpassword | admin user create --password-stdin c8@example.org "client 8" |
	sed -n 's/^account key: //p')
wait_for 30 test -S "$T/cl8/control.sock" &&
	"$B/client/cotrainctl" --socket "$T/cl8/control.sock" attach "http://127.0.0.1:$PORT/projects/slow" \
		--key "$key8" >/dev/null || bail_out "the slow client did not start"
H8=$(grep -o '"host_id": *[0-9]*' "$T/cl8/state.json" | grep -o '[0-9]*$' | head -1)
joined() { [ "$(sql "select count(*) from round_member m join round r using (project_id, version)
  where r.state = 'committed' and m.host_id = ${H8:-0} and m.included")" -ge 1 ]; }
wait_for 180 joined
ok $? "a volunteer on a slow link fetched the checkpoint first and took part ($(grep -c 'before asking for work' "$T/client8.log") prefetches, $(grep -c 'handing back' "$T/client8.log") hand-backs)"
stop_clients
