#!/bin/sh
# cotrain tests: local mode (DiLoCo; doc/design.md "Local mode") end to end,
# in the shape of tests/test_rounds_e2e.sh.  A real PostgreSQL
# (tests/with-pgtmp), cotrain-server and three cotrain-client daemons with
# different thread counts train a tiny model with "mode": "local" (an inner
# AdamW step every 2 microbatches, Nesterov outer steps) for several rounds,
# with work units of at most 3 microbatches so that inner batches run across
# units; then:
#   - the peers never fork: every round commits with every included peer
#     accepted, holding the server's parameters bit for bit (each applied
#     the outer step to theta_v and the same mean pseudo-gradient);
#   - a single process replaying each host's ranges in the order it got them
#     (tests/replay_rounds with the HOST column) reaches the server's
#     checkpoints within 1e-5 (parameters; 1e-4 for the outer momentum and
#     the unused second moment), with the same loss curve;
#   - the inner learning rate changed mid-run (cotrain-admin project
#     update, from the next version) is taken by every peer from that
#     version on: the replay with the stored config matches, one without
#     the change departs right after it.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-local-XXXXXX)
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
version() { sql "select current_version from project where name = 'tiny'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }

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

plan 9

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<JSON
{"name": "tiny", "title": "tiny local rounds", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 1536, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 20,
 "mode": "local", "inner_batch": 2, "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/project.json" >"$T/project.out" || bail_out "could not set up the project"
is "$(sql "select config->>'mode' || ' ' || (config->>'inner_batch') from project where name = 'tiny'")" "local 2" \
	"the project is in local mode, inner batches of 2 microbatches"

"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 3 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 8 --round-average-timeout 20 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

start_client 1 1 && start_client 2 2 && start_client 3 1 || bail_out "a client did not start"
# The inner learning rate changes mid-run (cotrain-admin project update): a
# local-mode project's optimizer from the next version on, which every
# peer's inner steps take from the work units of that version.
wait_for 240 version_at_least 2
admin project update --json tiny optimizer.lr=0.001 >"$T/update.json" 2>"$T/update.err"
VCH=$(sed -n 's/.*"version": *\([0-9]*\).*/\1/p' "$T/update.json")
ok $([ -n "$VCH" ] && [ "$VCH" -gt 2 ]; echo $?) \
	"the inner learning rate changes from the next version on ($(cat "$T/update.json" "$T/update.err"))"
VCH=${VCH:-3}
wait_for 240 version_at_least $((VCH + 3))
ok $? "three clients commit local rounds together, three after the change (version $(version))"
V=$(version)
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=

# The model never forks: every included peer of every committed round was
# accepted, with the server's parameters.
forks=$(sql "select count(*) from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included
    and (m.outcome is distinct from 'ok' or not m.accepted or m.params_sha256 <> r.params_sha256)")
shared=$(sql "select count(*) from (select r.version from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.accepted and m.params_sha256 = r.params_sha256
  group by r.version having count(*) >= 2) x")
ok $([ "$forks" = 0 ] && [ "$shared" -ge 3 ]; echo $?) \
	"every round commits with every included peer accepted, holding the server's parameters ($shared rounds of several peers, $forks not)"

# Each host's ranges of each committed round, in the order it got them.
sql "select rr.version, w.lo, w.lo + rr.mb_done, rr.host_id
  from round_report rr join work_unit w on w.id = rr.work_unit_id
  join round r on r.project_id = rr.project_id and r.version = rr.version
  join round_member m on m.project_id = rr.project_id and m.version = rr.version and m.host_id = rr.host_id
  join project p on p.id = rr.project_id
  where p.name = 'tiny' and r.state = 'committed' and m.included and rr.mb_done > 0
  order by rr.version, rr.host_id, w.id" | tr '|' ' ' >"$T/rounds.txt"
nrounds=$(cut -d' ' -f1 "$T/rounds.txt" | sort -un | wc -l)
ok $([ "$V" -ge $((VCH + 3)) ] && [ "$nrounds" = "$V" ]; echo $?) \
	"the committed rounds' work units are known for every version ($nrounds of $V)"

MANIFEST=$(sql "select d.manifest_sha256 from dataset d where d.name = 'tiny'")
ck() { _s=$(sql "select checkpoint_sha256 from model_version m join project p on p.id = m.project_id
  where p.name = 'tiny' and version = $1"); echo "$T/srv/files/$(echo "$_s" | cut -c1-2)/$_s"; }
mkdir -p "$T/replay"
sql "select config::text from project where name = 'tiny'" >"$T/stored.json"
"$B/tests/replay_rounds" --project "$T/stored.json" --rounds "$T/rounds.txt" --store "$T/srv/files" \
	--manifest "$MANIFEST" --checkpoint "$(ck 0)" --out "$T/replay" >"$T/replay.out" 2>"$T/replay.err"
ok $? "the single-process replay of each host's inner steps runs" || cat "$T/replay.err" >&2

# Each peer's inner steps run microbatch by microbatch as the replay's, and
# the contributions are summed in the same order, so the replay should
# match closely; 1e-5 is the task's bound.
worst=ok
v=1
while [ "$worst" = ok ] && [ $v -le "$V" ]; do
	if ! "$B/tests/replay_rounds" --compare "$T/replay/v$v.safetensors" "$(ck $v)" --tolerance 1e-5 \
		>"$T/cmp$v.out" 2>&1; then
		worst="version $v: $(cat "$T/cmp$v.out")"
		break
	fi
	v=$((v + 1))
done
is "$worst" ok "the server's checkpoint of every version (1 to $V) equals the replay's within 1e-5 (outer momentum 1e-4): $(tr '\n' ' ' <"$T/cmp$V.out")"

sql "select version, loss from round r join project p on p.id = r.project_id
  where p.name = 'tiny' and r.state = 'committed' order by version" | tr '|' ' ' >"$T/loss.server"
awk '$1 == "round" { print $2, $6 }' "$T/replay.out" >"$T/loss.replay"
cmp_loss=$(awk 'NR == FNR { s[$1] = $2; next }
  { m++; if (!($1 in s) || s[$1] == "") { print "no server loss for round " $1; exit }
    d = s[$1] - $2; if (d < 0) d = -d; if (d > 1e-4 * ($2 > 1 ? $2 : 1)) { print "round " $1 ": server " s[$1] ", replay " $2; exit } }
  END { if (m < n) print "the replay has " m + 0 " rounds of " n }' n="$V" "$T/loss.server" "$T/loss.replay")
is "${cmp_loss:-same}" same "the loss curve matches the replay's ($(tr '\n' ' ' <"$T/loss.server"))"

# Without the change the replay departs right after it: the peers' inner
# steps took the new learning rate from its version on.
mkdir -p "$T/replay-old"
"$B/tests/replay_rounds" --project "$T/project.json" --rounds "$T/rounds.txt" --store "$T/srv/files" \
	--manifest "$MANIFEST" --checkpoint "$(ck 0)" --out "$T/replay-old" >/dev/null 2>&1
"$B/tests/replay_rounds" --compare "$T/replay-old/v$VCH.safetensors" "$(ck "$VCH")" --tolerance 1e-5 >/dev/null 2>&1
same_before=$?
"$B/tests/replay_rounds" --compare "$T/replay-old/v$((VCH + 1)).safetensors" "$(ck $((VCH + 1)))" \
	--tolerance 1e-5 >"$T/cmp-old.out" 2>&1
departs=$?
ok $([ "$same_before" = 0 ] && [ "$departs" = 1 ]; echo $?) \
	"a replay that ignores the change matches up to version $VCH and departs at $((VCH + 1)): $(head -1 "$T/cmp-old.out")"
