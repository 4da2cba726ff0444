#!/bin/sh
# cotrain tests: a peer alone in its averaging group is checked like any
# member (issue 18; doc/credit.md, "A second seed, drawn after the bytes are
# pinned").  Alone, a peer's group sum is its own vector, sent to the server
# as it is; it sketches it as the aggregator of the whole vector that
# received its own result (shared/averaging/allreduce_alone.c), with its
# outcome under the work unit's seed and after the commit under the second
# seed, with its blocks.  A real PostgreSQL, cotrain-server and one
# cotrain-client at a time, so every round has one peer in one group:
#   - an honest client's rounds are checked under the second seed (its
#     blocks tile its microbatches and add up to what it sent), it is never
#     flagged and its round grants are granted;
#   - the server sketches each group sum a lone peer uploads itself, and a
#     sum other than what the peer committed is flagged (check 4 of
#     round_sketch_verify, its alone claims aside);
#   - a client with COTRAIN_CHEAT=orthogonal (g + p, p orthogonal to the
#     work unit's sketch seed, honest blocks) passes the check under the
#     work unit's seed, is flagged under the second seed in a round in which
#     it was alone, is denied its grant, and gets no work unit after it.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-seed2-alone-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill -9 "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'val'"; }
start_client() { # N THREADS [ENV...]
	c_n=$1 c_t=$2
	shift 2
	mkdir -p "$T/cl$c_n"
	env "$@" "$B/client/cotrain-client" --state-dir "$T/cl$c_n" --socket "$T/cl$c_n/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$c_t" \
		--set socket_group=nonexistent --set log_level=info \
		--set spot_interval=3600 2>>"$T/client$c_n.log" &
	CPIDS="$CPIDS $!"
	eval "P$c_n=$!"
	_key=$(echo secretpassword | admin user create --password-stdin "c$c_n@example.org" "client $c_n" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$c_n/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$c_n/control.sock" attach "http://127.0.0.1:$PORT/projects/val" \
			--key "$_key" >/dev/null &&
		wait_for 30 grep -qs '"host_id": *[0-9]' "$T/cl$c_n/state.json" &&
		eval "H$c_n=$(grep -o '"host_id": *[0-9]*' "$T/cl$c_n/state.json" | grep -o '[0-9]*$' | head -1)"
}
stop_client() { # N
	eval "_p=\$P$1"
	kill "$_p" 2>/dev/null
	wait "$_p" 2>/dev/null
	CPIDS=$(echo "$CPIDS" | sed "s/ $_p\$//; s/ $_p / /")
}

plan 7

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/val.json" <<JSON
{"name": "val", "title": "val", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 64, "microbatch_size": 4, "seed": 11, "work_unit_seconds": 20}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/val.json" >/dev/null || bail_out "could not set up the project"
pid=$(sql "select id from project where name = 'val'")
# Sketched (the policy hands out the seed and k), no spot checks (no
# other host could answer them): a grant waits for the check under the
# second seed only.  8-bit slices: alone, nothing is encoded.
sql "update spot_policy set first_rate = 0, trusted_after = 1000000 where project_id = $pid" >/dev/null
sql "update project set config = config || '{\"compression\": \"8bit\"}' where id = $pid" >/dev/null

"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 4 --round-average-timeout 30 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

# Rounds of which host $1 was the only included peer of its group, checked
# under the second seed with its blocks.
alone_checked() {
	sql "select count(*) from round_member m join round r using (project_id, version)
	  where m.project_id = $pid and m.host_id = $1 and m.included and r.seed2_checked_at is not null
	    and m.seed2_sketches ? 'blocks' and m.seed2_sketches ? 'aggregated'
	    and (select count(*) from round_member o where o.project_id = m.project_id and o.version = m.version
	          and o.group_id = m.group_id and o.included) = 1"
}
honest_done() { [ "$(alone_checked "$H1")" -ge 3 ]; }

start_client 1 2 || bail_out "client 1 did not start"
wait_for 300 honest_done
n1=$(alone_checked "$H1")
f1=$(sql "select count(*) from round_sketch_flag where host_id = $H1")
ok $([ "$n1" -ge 3 ] && [ "$f1" -eq 0 ] && echo 0 || echo 1) \
	"an honest host alone in its group: $n1 rounds checked under the second seed (its blocks, its own aggregator's sketches), $f1 flags"
stop_client 1
g1=$(sql "select count(*) from credit_grant g join round r using (project_id, version)
  where g.project_id = $pid and g.host_id = $H1 and g.kind = 'round' and g.status = 'granted' and r.seed2_checked_at is not null")
p1=$(sql "select count(*) from credit_grant g join round r using (project_id, version)
  where g.project_id = $pid and g.host_id = $H1 and g.kind = 'round' and g.status <> 'granted' and r.seed2_checked_at is not null")
ok $([ "$g1" -ge 3 ] && [ "$p1" -eq 0 ] && echo 0 || echo 1) \
	"its round grants are granted once checked ($g1 granted, $p1 not)"

start_client 2 1 COTRAIN_CHEAT=orthogonal || bail_out "client 2 did not start"
grep -q "test hook COTRAIN_CHEAT=orthogonal:" "$T/client2.log"
ok $? "client 2 (host $H2) sends its gradient plus a vector orthogonal to the sketch seed's"
flagged2() { [ "$(sql "select count(*) from round_sketch_flag where host_id = $H2 and seed2")" -ge 1 ]; }
wait_for 300 flagged2
v2=$(sql "select min(version) from round_sketch_flag where host_id = $H2 and seed2")
t2="(select min(created_at) from round_sketch_flag where host_id = $H2 and seed2)"
why=$(sql "select role || ': ' || reason || ', distance ' || round(distance::numeric, 3) || ' against ' || round(tolerance::numeric, 3) from round_sketch_flag where host_id = $H2 and seed2 order by id limit 1")
diag "orthogonal alone (host $H2), round $v2: $why"
alone=$(sql "select count(*) from round_member o join round_member m using (project_id, version, group_id)
  where m.project_id = $pid and m.version = ${v2:-0} and m.host_id = $H2 and m.included and o.included")
n_s=$(sql "select count(*) from round_sketch_flag where host_id = $H2 and not seed2")
checked_s=$(sql "select count(*) from round_member where project_id = $pid and version = ${v2:-0} and host_id = $H2 and sketches ? 'aggregated'")
ok $([ -n "$v2" ] && [ "$alone" -eq 1 ] && [ "$n_s" -eq 0 ] && [ "$checked_s" -eq 1 ] &&
	[ "$(sql "select role from round_sketch_flag where host_id = $H2 and seed2 order by id limit 1")" = member ] &&
	echo 0 || echo 1) \
	"alone in its group (of $alone) in round $v2, it passes the check under the work unit's seed ($n_s flags over its sketched outcome) and fails the member check under the second seed"

den=$(sql "select status from credit_grant where project_id = $pid and host_id = $H2 and version = ${v2:-0} and kind = 'round'")
paid=$(sql "select count(*) from credit_grant where project_id = $pid and host_id = $H2 and kind = 'round' and status = 'granted'")
# Its next request for work is refused with the flag as the reason.
wait_for 60 grep -q "asking for work: server: host $H2 may not take work of project" "$T/client2.log"
units=$(sql "select count(*) from work_unit where host_id = $H2 and created_at > $t2")
refused=$(grep -c "asking for work: server: host $H2 may not take work of project" "$T/client2.log")
ok $([ "$den" = denied ] && [ "$paid" -eq 0 ] && [ "$units" -eq 0 ] && [ "$refused" -ge 1 ] && echo 0 || echo 1) \
	"its round grant of version $v2 is $den ($paid granted), and it gets no work unit after the flag ($units; refused $refused times)"
stop_client 2

# The server's own sketch of each group sum a lone peer uploaded (check 4
# of round_sketch_verify): kept for every such round of the honest host,
# each within the spot tolerance of the sketch it committed.
lone="round_group_sum s join round r using (project_id, version)
  where s.project_id = $pid and r.state = 'committed' and s.included = jsonb_build_array($H1)"
n_lone=$(sql "select count(*) from $lone")
n_sk=$(sql "select count(*) from $lone and s.sketch is not null and round_sketch_norm(s.sketch,
  round_sketch_committed(s.project_id, s.version, $H1, cardinality(s.sketch), s.samples)) <= 1e-3 * round_sketch_norm(s.sketch)")
ok $([ "$n_lone" -ge 3 ] && [ "$n_sk" = "$n_lone" ] && echo 0 || echo 1) \
	"the server sketched the $n_lone group sums host $H1 uploaded alone, and $n_sk match the sketches it committed"
# A lone upload whose bytes are not what the peer committed (as if it lied
# about its own bytes): the server's sketch, doubled here, is flagged.
v1=$(sql "select min(s.version) from $lone and s.sketch is not null")
sql "update round_group_sum set sketch = array(select 2 * x from unnest(sketch) x)
  where project_id = $pid and version = ${v1:-0} and included = jsonb_build_array($H1)" >/dev/null
bad=$(sql "select round_sketch_verify($pid, ${v1:-0})")
why=$(sql "select reason from round_sketch_flag where host_id = $H1 and version = ${v1:-0} order by id desc limit 1")
ok $([ "$bad" = "{$H1}" ] && [ "$why" = "the group sum it uploaded alone differs from the sketches it committed" ] &&
	echo 0 || echo 1) "a lone group sum other than the committed sketches is flagged (round $v1: $bad, $why)"
