#!/bin/sh
# cotrain tests: several cotrain-server processes on one PostgreSQL
# (doc/design.md, "Several server processes").  Two servers share one
# database and one file store behind a plain TCP balancer
# (tests/tcp_balancer.py, connections handed out in turn); four clients
# attach through it, so their requests land on both.  Then:
#   - exactly one process holds the round coordinator's duty (its advisory
#     lock), and both serve requests;
#   - a duty whose lock session ends (pg_terminate_backend) is lost by its
#     holder and taken again;
#   - killing that process (SIGKILL) in the middle of a round, the other
#     takes the duty over within seconds and the run goes on on the
#     survivor alone;
#   - the model never forks and the single-process replay matches, as in
#     tests/test_rounds_e2e.sh (tests/rounds_checks.sh).
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
[ -x /usr/bin/python3 ] || skip_all "no /usr/bin/python3 for the TCP balancer"
T=$(mktemp -d /tmp/cotrain-multi-XXXXXX)
SPIDS= CPIDS= LBPID=
cleanup() {
	for p in $CPIDS; do kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	for p in $SPIDS; do kill_ours "$p" && wait "$p" 2>/dev/null; done
	[ -n "$LBPID" ] && kill_ours "$LBPID" && wait "$LBPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'tiny'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
round_state() { sql "select state from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.version = $1"; }
now() { date +%s.%N; }

plan 21

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<JSON
{"name": "tiny", "title": "tiny rounds", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 192, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 20}
JSON
admin db migrate >/dev/null || bail_out "could not migrate the database"
admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null 2>&1 || bail_out "could not import the text"
admin project create "$T/project.json" >"$T/project.out" 2>&1 || bail_out "could not set up the project: $(cat "$T/project.out")"

start_server() { # NAME: same database, same file store
	"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 3 --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --round-report-timeout 15 --round-average-timeout 20 \
		--log-level info 2>"$T/$1.log" &
	eval "SPID_$1=$!"
	SPIDS="$SPIDS $!"
	wait_for 20 grep -qs 'listening on' "$T/$1.log" || bail_out "server $1 did not start"
	eval "PORT_$1=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/$1.log")"
}
start_server a
start_server b
/usr/bin/python3 "$top_srcdir/tests/tcp_balancer.py" "$T/lb.port" "$PORT_a" "$PORT_b" 2>"$T/lb.log" &
LBPID=$!
wait_for 10 test -s "$T/lb.port" || bail_out "the TCP balancer did not start"
PORT=$(cat "$T/lb.port")

start_client() { # N THREADS
	mkdir -p "$T/cl$1"
	"$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$2" \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=2 2>>"$T/client$1.log" &
	CPIDS="$CPIDS $!"
	_key=$(echo secretpassword | admin user create --password-stdin "c$1@example.org" "client $1" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$1/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$1/control.sock" attach "http://127.0.0.1:$PORT/projects/tiny" \
			--key "$_key" >/dev/null
}
start_client 1 1 && start_client 2 2 && start_client 3 1 && start_client 4 2 || bail_out "a client did not start"
wait_for 180 version_at_least 4
ok $? "four clients behind the balancer commit four rounds on two server processes (version $(version))"

# The duty's lock: classid 'cotr' (0x636f7472), objid 1 (server/duty.h).
holders() { sql "select count(*) from pg_locks where locktype = 'advisory' and classid = 1668248690
  and objid = 1 and granted"; }
taken() { grep -c 'round coordinator duty taken' "$T/$1.log"; }
is "$(holders) $(($(taken a) + $(taken b)))" "1 1" "one process holds the round coordinator's advisory lock"
served() { # NAME: work requests answered, from its /metrics
	curl -s "http://127.0.0.1:$1/metrics" |
		awk '/^cotrain_http_requests_total/ { n += $NF } END { print n + 0 }'
}
na=$(served "$PORT_a") nb=$(served "$PORT_b")
ok $([ "$na" -gt 20 ] && [ "$nb" -gt 20 ]; echo $?) "both processes serve the clients ($na and $nb requests)"
# Each process's listener (server/db_listen.c): its session's last query is
# its LISTEN, which it never follows with another.
is "$(sql "select count(*) from pg_stat_activity where datname = current_database()
  and query = 'LISTEN \"cotrain_round\"'")" 2 \
	"both processes listen for the database's notifications that a round moved (db/functions/round_notify.sql)"
# A process that loses the lock's connection loses the duty: end the
# reaper's lock session from the database side; the duty is held again
# (by either process) and its old holder says it lost it.
sql "select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory'
  and classid = 1668248690 and objid = 2" >/dev/null
reaper_again() { grep -qs 'reaper duty lost' "$T/a.log" "$T/b.log" &&
	[ "$(sql "select count(*) from pg_locks where locktype = 'advisory' and classid = 1668248690
	  and objid = 2 and granted")" = 1 ]; }
wait_for 15 reaper_again
ok $? "the reaper's duty, its session ended, is lost and held again ($(grep -ho 'reaper duty [a-z]*' "$T/a.log" "$T/b.log" | tr '\n' ',' | sed 's/,$//'))"
if [ "$(taken a)" = 1 ]; then HOLDER=a OTHER=b; else HOLDER=b OTHER=a; fi
eval "HPID=\$SPID_$HOLDER"

# Kill the holder in the middle of a round: while the current round closes
# or averages (its plan in the peers' hands).
mid_round() { _v=$(version); case $(round_state "$_v") in closing | averaging) KV=$_v KS=$(round_state "$_v") ;; *) false ;; esac; }
KV= KS=
wait_for 180 mid_round && kill -9 "$HPID"
ok $? "the coordinator's process ($HOLDER) killed while round ${KV:-?} was ${KS:-never caught mid-round}"
t0=$(now)
wait "$HPID" 2>/dev/null
SPIDS=$(pids_without "$SPIDS" "$HPID")
wait_for 30 grep -q 'round coordinator duty taken' "$T/$OTHER.log"
took=$?
dt=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
ok $took "the other process ($OTHER) takes the round coordinator over (${dt} s after the kill)"
is "$(holders)" 1 "exactly one holder again"
# The reaper's and the evaluator's duties too (1, 2, 3 in server/duty.h),
# whichever process held them.
duties() { [ "$(sql "select count(distinct objid) from pg_locks where locktype = 'advisory'
  and classid = 1668248690 and objid in (1, 2, 3) and granted")" = 3 ]; }
wait_for 10 duties
ok $? "the reaper's and the held-out evaluation's duties are held ($(grep -o '[a-z -]* duty taken' "$T/$OTHER.log" | sed 's/^ //; s/ duty taken//' | tr '\n' ',' | sed 's/,$//') by the survivor)"
wait_for 120 version_at_least $((KV + 1))
ok $? "round $KV commits after the takeover (version $(version), attempt, last failure: $(sql "select attempt || ', ' || coalesce(last_failure, 'none') from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.version = $KV"))"
wait_for 180 version_at_least $((KV + 5))
ok $? "the run goes on on the survivor alone (version $(version))"
# The balancer still hands every other connection to the dead process: a
# client's round call that meets it (a reset) goes again to the survivor
# (client/daemon_round.c, round_call_again) instead of failing the round
# for that host, so the survivor's rounds commit in their first attempt
# (one retried round allowed, for a host the balancer failed for longer).
first=$(sql "select count(*) filter (where r.attempt = 1) || ' of ' || count(*) from round r
  join project p on p.id = r.project_id where p.name = 'tiny' and r.state = 'committed' and r.version > $KV")
ones=${first%% *} all=${first##* }
ok $([ "$all" -ge 4 ] && [ "$ones" -ge $((all - 1)) ]; echo $?) \
	"the survivor's rounds commit in their first attempt ($first; clients' calls retried: $(cat "$T"/client*.log | grep -c 'trying again in'))"
V=$(version)
for p in $CPIDS; do kill_ours "$p"; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=

# A figure, not a check: how much later the last client than the first got
# each round's plan (its long poll answered), rounds before the kill (two
# processes: the plan wakes the holder's polls at once, the other's at its
# next look) against rounds after it (one process).
cat "$T"/client*.log | awk -v kv="$KV" '
  / attempt [0-9]+ planned:/ {
    split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3]
    match($0, /round [0-9]+: attempt [0-9]+/); k = substr($0, RSTART, RLENGTH)
    split(k, w, /[ :]+/); r[k] = w[2]
    if (!(k in lo) || s < lo[k]) lo[k] = s
    if (!(k in hi) || s > hi[k]) hi[k] = s
    n[k]++ }
  END {
    for (k in n) if (n[k] >= 3 && r[k] != kv) {
      g = r[k] < kv ? 1 : 2; sum[g] += hi[k] - lo[k]; cnt[g]++
      if (hi[k] - lo[k] > mx[g]) mx[g] = hi[k] - lo[k] }
    printf "# plan delivery spread across clients: two processes %.0f ms mean, %.0f ms max (%d rounds); one process %.0f ms mean, %.0f ms max (%d rounds)\n",
      cnt[1] ? 1000 * sum[1] / cnt[1] : 0, 1000 * mx[1], cnt[1], cnt[2] ? 1000 * sum[2] / cnt[2] : 0, 1000 * mx[2], cnt[2] }'

. "$top_srcdir/tests/rounds_checks.sh"
rounds_replay_checks
