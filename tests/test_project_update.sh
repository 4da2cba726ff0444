#!/bin/sh
# cotrain tests: `cotrain-admin project update` mid-run (doc/project-file.md
# "changes", doc/design.md "Changing a run").  A real PostgreSQL
# (tests/with-pgtmp), cotrain-server and three cotrain-client daemons train
# a tiny sync-mode model; after two versions the learning rate and the
# target batch change from the next round still open; then:
#   - hostile updates (an unknown setting, a negative learning rate, a
#     target batch below the microbatch size, a version in the past, a
#     non-number) are refused with a message and change nothing;
#   - every included peer of every round, before and after the change,
#     holds exactly the server's parameters (each applied the optimizer in
#     force at its version);
#   - the rounds API shows the old target before the change and the new one
#     from its version on, and each committed round holds its target;
#   - a single process replaying the same global batches with the stored
#     config (its "changes" included) reaches the server's checkpoint of
#     every version, while a replay without the change departs from it
#     right after the change.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-update-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'tiny'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
config() { sql "select config::text from project where name = 'tiny'"; }

start_client() { # N THREADS
	mkdir -p "$T/cl$1"
	"$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$2" \
		--set socket_group=nonexistent --set log_level=info 2>>"$T/client$1.log" &
	CPIDS="$CPIDS $!"
	_key=$(echo secretpassword | admin user create --password-stdin "c$1@example.org" "client $1" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$1/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$1/control.sock" attach "http://127.0.0.1:$PORT/projects/tiny" \
			--key "$_key" >/dev/null
}

plan 12

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<JSON
{"name": "tiny", "title": "tiny rounds with a change", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 96, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 20}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/project.json" >"$T/project.out" || bail_out "could not set up the project"

"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 3 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 15 --round-average-timeout 20 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

start_client 1 1 && start_client 2 2 && start_client 3 1 || bail_out "a client did not start"
wait_for 180 version_at_least 2
ok $? "three clients commit two rounds (version $(version))"

# Hostile updates: each refused with a message, the config unchanged.
before=$(config)
refused=
try_bad() { # WHAT ARGS...: must fail, say why, and change nothing
	_what=$1; shift
	if admin project update "$@" >"$T/bad.out" 2>"$T/bad.err"; then refused="$refused [$_what: accepted]"
	elif ! grep -q '^cotrain-admin: ' "$T/bad.err"; then refused="$refused [$_what: no message]"
	elif [ "$(config)" != "$before" ]; then refused="$refused [$_what: config changed]"
	else echo "# $_what: $(head -1 "$T/bad.err")"; fi
}
try_bad "unknown setting" tiny optimizer.beta1=0.5
try_bad "negative lr" tiny optimizer.lr=-0.001
try_bad "target batch below the microbatch size" tiny target_batch=1
try_bad "target batch not a multiple of the microbatch size" tiny target_batch=97
try_bad "a version in the past" --at 0 tiny optimizer.lr=0.01
try_bad "not a number" tiny optimizer.lr=fast
try_bad "no setting" tiny
try_bad "no such project" nosuch optimizer.lr=0.01
try_bad "an unknown decay" tiny optimizer.schedule.decay=sideways
try_bad "warm-up past the schedule's end" tiny optimizer.schedule.warmup_steps=5000
is "${refused:-none}" none "hostile updates are refused with a message and change nothing"

# The change: lr 0.003 -> 0.01 and target 96 -> 192, from the round still open.
admin project update --json tiny optimizer.lr=0.01 target_batch=192 >"$T/update.json" 2>"$T/update.err"
ok $? "project update records the change" || cat "$T/update.err" >&2
VCH=$(sed -n 's/.*"version": *\([0-9]*\).*/\1/p' "$T/update.json")
is "$(sql "select (config->'changes'->0->>'version') || ' ' || (config->'changes'->0->'optimizer'->>'lr') || ' ' ||
  (config->'changes'->0->>'target_batch') from project where name = 'tiny'")" "$VCH 0.01 192" \
	"the change is kept in the project's config with its version ($VCH) ($(cat "$T/update.json"))"
admin project show tiny | grep -q '"changes"'
ok $? "project show lists the change"

wait_for 240 version_at_least $((VCH + 3))
ok $? "the run goes on for three rounds after the change (version $(version))"
V=$(version)
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=
is "$(sql "select target_batch from project where name = 'tiny'")" 192 "the scheduler's target is the new one"

# The rounds API: the target in force at each version, and each committed
# round's batch is its target.
curl -sf "http://127.0.0.1:$PORT/v1/projects/tiny/rounds?limit=100" >"$T/rounds.json" ||
	echo '{}' >"$T/rounds.json"
api=$(python3 -c '
import json, sys
rs = [r for r in json.load(open(sys.argv[1])).get("rounds", []) if r["state"] == "committed"]
vch = int(sys.argv[2])
bad = [r["version"] for r in rs if r["target_batch"] != (192 if r["version"] >= vch else 96)]
short = [r["version"] for r in rs if r["samples"] != r["target_batch"]]
print("%d rounds, wrong target %s, batch not the target %s" % (len(rs), bad, short))' "$T/rounds.json" "$VCH")
is "$api" "$V rounds, wrong target [], batch not the target []" \
	"the rounds API shows target 96 before version $VCH and 192 from it, and each committed batch is its target"

forks=$(sql "select count(*) from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.outcome = 'ok' and m.params_sha256 <> r.params_sha256")
shared=$(sql "select count(*) from (select r.version from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.params_sha256 = r.params_sha256 and r.version >= $VCH
  group by r.version having count(*) >= 2) x")
ok $([ "$forks" = 0 ] && [ "$shared" -ge 1 ]; echo $?) \
	"every included peer holds the server's parameters after every round ($shared rounds of several peers after the change, $forks forks)"

sql "select rr.version, w.lo, w.lo + rr.mb_done
  from round_report rr join work_unit w on w.id = rr.work_unit_id
  join round r on r.project_id = rr.project_id and r.version = rr.version
  join round_member m on m.project_id = rr.project_id and m.version = rr.version and m.host_id = rr.host_id
  join project p on p.id = rr.project_id
  where p.name = 'tiny' and r.state = 'committed' and m.included and rr.mb_done > 0
  order by rr.version, w.lo" | tr '|' ' ' >"$T/rounds.txt"
MANIFEST=$(sql "select d.manifest_sha256 from dataset d where d.name = 'tiny'")
ck() { _s=$(sql "select checkpoint_sha256 from model_version m join project p on p.id = m.project_id
  where p.name = 'tiny' and version = $1"); echo "$T/srv/files/$(echo "$_s" | cut -c1-2)/$_s"; }
config >"$T/stored.json"
mkdir -p "$T/replay" "$T/replay-old"
"$B/tests/replay_rounds" --project "$T/stored.json" --rounds "$T/rounds.txt" --store "$T/srv/files" \
	--manifest "$MANIFEST" --checkpoint "$(ck 0)" --out "$T/replay" >"$T/replay.out" 2>"$T/replay.err"
ok $? "the replay with the stored config runs" || cat "$T/replay.err" >&2
# The tolerance of tests/test_rounds_e2e.sh (fp32 sums in another order).
worst=ok
v=1
while [ "$worst" = ok ] && [ $v -le "$V" ]; do
	"$B/tests/replay_rounds" --compare "$T/replay/v$v.safetensors" "$(ck $v)" --tolerance 5e-5 \
		>"$T/cmp$v.out" 2>&1 || worst="version $v: $(cat "$T/cmp$v.out")"
	v=$((v + 1))
done
is "$worst" ok "the server's checkpoint of every version (1 to $V) equals the replay's, before and after the change"

# Without the change the replay departs at the first step after it: the
# step really used the new learning rate.
"$B/tests/replay_rounds" --project "$T/project.json" --rounds "$T/rounds.txt" --store "$T/srv/files" \
	--manifest "$MANIFEST" --checkpoint "$(ck 0)" --out "$T/replay-old" >/dev/null 2>"$T/replay-old.err"
"$B/tests/replay_rounds" --compare "$T/replay-old/v$VCH.safetensors" "$(ck "$VCH")" --tolerance 5e-5 >/dev/null 2>&1
same_before=$?
"$B/tests/replay_rounds" --compare "$T/replay-old/v$((VCH + 1)).safetensors" "$(ck $((VCH + 1)))" \
	--tolerance 5e-5 >"$T/cmp-old.out" 2>&1
departs=$?
ok $([ "$same_before" = 0 ] && [ "$departs" = 1 ]; echo $?) \
	"a replay that ignores the change matches up to version $VCH and departs at $((VCH + 1)): $(head -1 "$T/cmp-old.out")"
done_testing
