#!/bin/sh
# cotrain tests: the check of the averaged bytes under a second seed, drawn
# when the round commits (issue 18; doc/credit.md, "A second seed, drawn
# after the bytes are pinned").  A real PostgreSQL, cotrain-server and five
# cotrain-client daemons train a tiny model in sync mode, slices and results
# in 8-bit blocks; two clients cheat.  COTRAIN_CHEAT=orthogonal sends g + p
# with p orthogonal to the k vectors of the work unit's sketch seed and
# commits honest sketches, so
#   - it passes every check under the work unit's seed (never flagged
#     before a commit; its bytes are in the step of its first round),
#   - the check under the second seed catches it: flagged, its round
#     grant denied, and it is in no committed step after the flag;
# COTRAIN_CHEAT=orthogonal-claim sends the same and claims, under the
# second seed, blocks that add up to what it sent: no check of the bytes
# flags it, and a spot check of one of its blocks (recomputed by another
# host, the sketch of their sum under the second seed compared) denies it;
# three honest hosts on 1 and 2 threads and two GEMM paths send their
# sketches under the second seed after every committed round, are never
# flagged, and their round grants are released (none left pending);
# every host is spot-checked on every round, on one block of its
# microbatches: the checker's sketches of them under the work unit's seed
# and of their sum under the second seed agree with the host's.
# With SEED2_MODE=xgroup (tests/test_sketch_seed2_xgroup.sh) the rounds are
# averaged in groups of at most 2, across groups peer to peer
# (cotrain-server --round-cross-peers): an aggregator's result is then the
# round's mean, and it sends the sketch of its group's sum before that
# stage under the second seed too; the same checks hold.  (Groups of 2:
# once both cheaters are banned, the three honest hosts still make two
# groups.)
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/val_project.sh"
SPOT_INTERVAL=2
val_init seed2

MODE=${SEED2_MODE:-groups}
XG_ARGS=
[ "$MODE" = xgroup ] && XG_ARGS="--round-cross-peers --round-max-group 2"
if [ "$MODE" = xgroup ]; then plan 13; else plan 12; fi

val_project 64
# Every host checked on every round (first_rate 1, never trusted): one
# block of 2 microbatches (the policy's default size).  8-bit slices and
# results.
sql "update spot_policy set first_rate = 1, trusted_after = 1000000 where project_id = $pid" >/dev/null
sql "update project set config = config || '{\"compression\": \"${COMP:-8bit}\"}' where id = $pid" >/dev/null

val_server 30 $XG_ARGS

start_client 1 1 && start_client 2 2 COTRAIN_GEMM=blas && start_client 3 2 &&
	start_client 4 1 COTRAIN_CHEAT=orthogonal && start_client 5 1 COTRAIN_CHEAT=orthogonal-claim ||
	bail_out "a client did not start"
HONEST="$H1,$H2,$H3"
grep -q "test hook COTRAIN_CHEAT=orthogonal:" "$T/client4.log" &&
	grep -q "test hook COTRAIN_CHEAT=orthogonal-claim:" "$T/client5.log"
ok $? "clients 4 and 5 (hosts $H4, $H5) send their gradient plus a vector orthogonal to the sketch seed's"

flagged2() { [ "$(sql "select count(*) from round_sketch_flag where host_id = $H4 and seed2")" -ge 1 ]; }
blocks_settled() { [ "$(sql "select count(*) from spot_check where project_id = $pid and seed2 is not null and state <> 'open' and host_id in ($HONEST)")" -ge 3 ]; }
claim_caught() { [ "$(sql "select count(*) from spot_check where host_id = $H5 and seed2 is not null and state = 'disagreed'")" -ge 1 ]; }
wait_for 400 flagged2
wait_for 300 claim_caught
wait_for 120 version_at_least 6
ok $? "four clients commit 5 rounds or more (version $(version))"
wait_for 120 blocks_settled
# The last round's sketches under the second seed: give them time to come.
sleep 3
# The flagged cheater's next request for work (refused: below).
wait_for 60 grep -q "asking for work: server: host $H4 may not take work" "$T/client4.log"
t_end=$(date +%s)
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=

diag "orthogonal (host $H4): $(sql "select coalesce(string_agg(distinct role || case when seed2 then ' (second seed)' else ' (work unit seed)' end, ', '), 'never flagged') || ', distance ' || coalesce(round(min(distance)::numeric, 3) || '..' || round(max(distance)::numeric, 3), '-') || ', tolerance up to ' || coalesce(round(max(tolerance)::numeric, 3)::text, '-') from round_sketch_flag where host_id = $H4")"
n_s=$(sql "select count(*) from round_sketch_flag where host_id = $H4 and not seed2")
n_s2=$(sql "select count(*) from round_sketch_flag where host_id = $H4 and seed2 and role = 'member'")
incl=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and m.host_id = $H4 and m.included and r.state = 'committed'
    and (select count(*) from round_member o where o.project_id = m.project_id and o.version = m.version and o.included) > 1")
ok $([ "$n_s" -eq 0 ] && [ "$n_s2" -ge 1 ] && [ "$incl" -ge 1 ] && echo 0 || echo 1) \
	"the orthogonal cheater passes every check under the work unit's seed ($n_s flags, its bytes in $incl committed steps) and fails the check under the second seed ($n_s2 flags)"

v2=$(sql "select min(version) from round_sketch_flag where host_id = $H4 and seed2")
den=$(sql "select status from credit_grant where project_id = $pid and host_id = $H4 and version = $v2 and kind = 'round'")
paid=$(sql "select count(*) from credit_grant where project_id = $pid and host_id = $H4 and kind = 'round' and status = 'granted'")
ok $([ "$den" = denied ] && [ "$paid" -eq 0 ] && echo 0 || echo 1) \
	"its round grant of version $v2 is $den; round grants granted to it: $paid"

# A round planned before the flag came may still have it in its plan: the
# commit refuses it then (the round reruns without it).
t2="(select min(created_at) from round_sketch_flag where host_id = $H4 and seed2)"
later=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and m.host_id = $H4 and m.included and r.state = 'committed' and r.committed_at > $t2")
after=$(sql "select count(*) from round where project_id = $pid and state = 'committed' and committed_at > $t2")
ok $([ "$later" -eq 0 ] && echo 0 || echo 1) \
	"once flagged (version $v2) it is in no step committed after the flag ($later of $after)"

# Nor does it get work: the scheduler refuses it with the flag as the
# reason (403), which the client logs, and the client backs off (retry_base
# 1 s, retry_max 2 s here: at least half a second, then a second, between
# two requests) rather than asking again at once.
units=$(sql "select count(*) from work_unit where host_id = $H4 and created_at > $t2")
since=$(sql "select ceil($t_end - extract(epoch from $t2))::integer")
refused=$(grep -c "asking for work: server: host $H4 may not take work of project \"val\": flagged as [a-z]* in round [0-9]*: under the second seed" "$T/client4.log")
diag "after its flag: $(grep -m1 "asking for work: server: host $H4 may not take work" "$T/client4.log" | sed 's/.*asking for work: //')"
ok $([ "$units" -eq 0 ] && [ "$refused" -ge 1 ] && [ "$refused" -le $((since + 2)) ] && echo 0 || echo 1) \
	"the scheduler hands it no work unit after the flag ($units); the client logs the refusal $refused times in the $since s after it"

if [ "$MODE" = xgroup ]; then
	# Rounds of several groups averaged across groups peer to peer,
	# checked under the second seed with every aggregator's group sum.
	xg=$(sql "select count(*) from round r where r.project_id = $pid and r.state = 'committed' and r.cross_peers
	  and r.n_groups >= 2 and r.seed2_checked_at is not null")
	xs=$(sql "select count(*) from round_member m join round r using (project_id, version)
	  where m.project_id = $pid and r.cross_peers and r.n_groups >= 2 and r.seed2_checked_at is not null
	    and m.included and m.hi > m.lo and m.seed2_sketches->'aggregated' ? 'group_sum'")
	diag "the orthogonal cheater's first flag under the second seed came in a round of $(sql "select n_groups || ' group(s)' || case when cross_peers then ', across groups peer to peer' else '' end from round where project_id = $pid and version = (select min(version) from round_sketch_flag where host_id = $H4 and seed2)")"
	diag "rounds committed: $(sql "select string_agg(n_groups::text || case when cross_peers then 'p' else 's' end, ' ' order by version) from round where project_id = $pid and state = 'committed'") (groups; p: across peers)"
	ok $([ "$xg" -ge 2 ] && [ "$xs" -ge 4 ] && echo 0 || echo 1) \
		"$xg rounds of several groups averaged across groups peer to peer were checked under the second seed ($xs aggregators' sketches with their group's sum)"
fi

fp=$(sql "select count(*) from round_sketch_flag where host_id in ($HONEST)")
checked=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and r.state = 'committed' and r.seed2_checked_at is not null
    and m.host_id in ($HONEST) and m.seed2_sketches ? 'blocks'")
ok $([ "$fp" -eq 0 ] && [ "$checked" -ge 6 ] && echo 0 || echo 1) \
	"honest hosts on 1 and 2 threads, two GEMM paths: 0 flagged ($fp) over $checked blocks checked under the second seed"

pend=$(sql "select count(*) from credit_grant g join round r using (project_id, version)
  where g.project_id = $pid and g.host_id in ($HONEST) and g.kind = 'round' and g.status = 'pending'
    and r.seed2_checked_at is not null and g.spot_check_id is null")
granted=$(sql "select count(*) from credit_grant where project_id = $pid and host_id in ($HONEST) and kind = 'round' and status = 'granted'")
ok $([ "$pend" -eq 0 ] && [ "$granted" -ge 6 ] && echo 0 || echo 1) \
	"honest hosts' round grants released once checked: $granted granted, $pend left pending without a spot check"

# Block checks: one block of the host's microbatches, recomputed by another
# host; the checker's values end with the sketch of the block's sum under
# the second seed.
sql "select 'block check ' || id || ' of host ' || host_id || ' version ' || version || ': microbatches ' || array_to_string(microbatches, ',') || ', ' || state || coalesce(', distance ' || round(distance::numeric, 6), '') || coalesce(' (' || outcome || ')', '') from spot_check where project_id = $pid and seed2 is not null order by id limit 12" | while read -r l; do diag "$l"; done
nb=$(sql "select count(*) from spot_check where project_id = $pid and seed2 is not null and host_id in ($HONEST) and state <> 'open'")
nagree=$(sql "select count(*) from spot_check where project_id = $pid and seed2 is not null and host_id in ($HONEST) and state = 'agreed'")
nlen=$(sql "select count(*) from spot_check where project_id = $pid and seed2 is not null and state = 'agreed'
  and cardinality(fp_checker) = k * (cardinality(microbatches) + 1)
  and microbatches[cardinality(microbatches)] - microbatches[1] = cardinality(microbatches) - 1")
ok $([ "$nb" -ge 3 ] && [ "$nagree" -eq "$nb" ] && [ "$nlen" -ge "$nagree" ] && echo 0 || echo 1) \
	"block checks of honest hosts: $nagree of $nb settled agreed, each on consecutive microbatches with the sketch of their sum under the second seed ($nlen)"
diag "the sketches under the second seed: $(sql "select count(*) from round where project_id = $pid and seed2_checked_at is not null") rounds checked of $(sql "select count(*) from round where project_id = $pid and state = 'committed'") committed; member sketching $(grep -h 'under the second seed sent' "$T"/client[123].log | sed -n 's/.*sketched in \([0-9.]*\) s.*/\1/p' | sort -n | tail -1) s at most"

# The cheater that claims false blocks: never flagged by a check of the
# bytes (its blocks add up to what it sent), denied and kept out of later
# rounds by a block check (spot_ban).
diag "orthogonal-claim (host $H5): $(sql "select count(*) || ' block checks: ' || coalesce(string_agg(state || coalesce(' ' || round(distance::numeric, 3), ''), ', ' order by id), '-') from spot_check where host_id = $H5 and seed2 is not null")"
f5=$(sql "select count(*) from round_sketch_flag where host_id = $H5 and spot_check_id is null")
b5=$(sql "select count(*) from round_sketch_flag where host_id = $H5 and spot_check_id is not null and lasting")
d5=$(sql "select count(*) from spot_check where host_id = $H5 and seed2 is not null and state = 'disagreed'")
g5=$(sql "select count(*) from credit_grant where project_id = $pid and host_id = $H5 and kind = 'round' and status = 'granted'")
n5=$(sql "select count(*) from credit_grant where project_id = $pid and host_id = $H5 and kind = 'round' and status = 'denied'")
ok $([ "$f5" -eq 0 ] && [ "$d5" -ge 1 ] && [ "$b5" -eq "$d5" ] && [ "$g5" -eq 0 ] && [ "$n5" -ge 1 ] && echo 0 || echo 1) \
	"the orthogonal-claim cheater passes the checks of the bytes ($f5 flags) and is denied by $d5 block checks, each a flag that keeps it out of later rounds ($b5): $n5 round grants denied, $g5 granted"

# The route refuses hostile bodies with the reason and stores nothing.
TOK=$(grep -o '"host_token": *"[^"]*"' "$T/cl1/state.json" | head -1 | sed 's/.*: *"\([^"]*\)"/\1/')
vs=$(sql "select max(version) from round_member where project_id = $pid and host_id = $H1 and seed2_sketches is not null")
before=$(sql "select md5(string_agg(coalesce(seed2_sketches::text, '-'), ',' order by version, host_id)) from round_member where project_id = $pid")
post() { # VERSION BODY: the status code
	curl -s -o "$T/answer.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOK" \
		-H 'Content-Type: application/json' --data "$2" "http://127.0.0.1:$PORT/v1/projects/val/rounds/$1/seed2"
}
k16='[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]'
codes="$(post "$vs" '{"host_id": '"$H1"', "sketches": [1]}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 3, "received": []}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 16, "received": [], "blocks": [{"first": 0, "count": 0, "sketch": '"$k16"'}]}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 16, "received": [], "blocks": [{"first": 0, "count": 1, "sketch": [1e400]}]}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 16, "received": [], "blocks": [{"count": 1, "sketch": '"$k16"'}]}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 16, "received": [{"sketch": '"$k16"'}]}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H2"', "sketches": {"k": 16, "received": []}}')"
codes="$codes $(post 1000000 '{"host_id": '"$H1"', "sketches": {"k": 16, "received": []}}')"
codes="$codes $(post "$vs" '{"host_id": '"$H1"', "sketches": {"k": 16, "received": []}}')"
diag "the last answer: $(cat "$T/answer.json")"
after=$(sql "select md5(string_agg(coalesce(seed2_sketches::text, '-'), ',' order by version, host_id)) from round_member where project_id = $pid")
is "$codes|$([ "$before" = "$after" ] && echo unchanged)" "400 400 400 400 400 400 403 404 409|unchanged" \
	"POST .../seed2: malformed, wrong k, empty block, huge value, block without first, result without aggregator, another host, no round, other sketches again: refused, nothing stored"

# Sketches under the second seed that never come: once the project's
# spot-check deadline has passed since the commit, the coordinator's timer
# (round_seed2_expire) checks the round with what came and flags a member
# that owed its blocks.  Shown on a checked round made to look so (host 1's
# sketches taken away, the commit moved 3 days back); last, as it flags an
# honest host.
sql "update round_member set seed2_sketches = null where project_id = $pid and version = $vs and host_id = $H1;
     update round set seed2_checked_at = null, committed_at = committed_at - interval '3 days'
      where project_id = $pid and version = $vs" >/dev/null
expired() { [ "$(sql "select count(*) from round where project_id = $pid and version = $vs and seed2_checked_at is not null")" -eq 1 ]; }
wait_for 20 expired
why=$(sql "select reason from round_sketch_flag where host_id = $H1 and version = $vs and seed2")
is "$why" "under the second seed: it sent no sketches of its blocks" \
	"round $vs checked by the timer once its deadline passed: host 1, whose sketches never came, is flagged"
