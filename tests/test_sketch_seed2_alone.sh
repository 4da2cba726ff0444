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
#     it was alone, is denied its grant, and gets no work unit after it;
#   - a client with COTRAIN_CHEAT=orthogonal-hidden (the same bytes, but its
#     own sketches, under both seeds, are of its honest gradient) is caught
#     by the server's own sketch, under the second seed, of the sum it
#     uploaded (check 4 of round_seed2_verify), which is taken for every
#     honest lone round too without a flag.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/val_project.sh"
val_init seed2-alone

plan 9

val_project 64
# Sketched (the policy hands out the seed and k), no spot checks (no
# other host could answer them): a grant waits for the check under the
# second seed only.  8-bit slices: alone, nothing is encoded.
sql "update spot_policy set first_rate = 0, trusted_after = 1000000 where project_id = $pid" >/dev/null
sql "update project set config = config || '{\"compression\": \"8bit\"}' where id = $pid" >/dev/null

val_server 30

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

# The server's sketch under the second seed of each sum the honest host
# uploaded alone (round_group_sum.sketch2, check 4 of round_seed2_verify):
# taken for its rounds checked under that seed, none of which flagged it.
n_sk2=$(sql "select count(*) from $lone and s.sketch2 is not null and r.seed2_checked_at is not null")
ok $([ "$n_sk2" -ge 3 ] && [ "$f1" -eq 0 ] && echo 0 || echo 1) \
	"the server sketched $n_sk2 of host $H1's lone group sums under the second seed, with no flag"

# orthogonal-hidden: its sketches under both seeds are its honest gradient's,
# so every check of its own claims passes; the server's sketch of the bytes
# it uploaded, under the second seed, does not match its blocks.
start_client 3 1 COTRAIN_CHEAT=orthogonal-hidden || bail_out "client 3 did not start"
flagged3() { [ "$(sql "select count(*) from round_sketch_flag where host_id = $H3 and seed2")" -ge 1 ]; }
wait_for 300 flagged3
v3=$(sql "select min(version) from round_sketch_flag where host_id = $H3 and seed2")
why3=$(sql "select reason || ', distance ' || round(distance::numeric, 3) || ' against ' || round(tolerance::numeric, 3)
  from round_sketch_flag where host_id = $H3 and seed2 order by id limit 1")
diag "orthogonal-hidden alone (host $H3), round $v3: $why3"
n_s3=$(sql "select count(*) from round_sketch_flag where host_id = $H3 and not seed2")
den3=$(sql "select status from credit_grant where project_id = $pid and host_id = $H3 and version = ${v3:-0} and kind = 'round'")
stop_client 3
case "$why3" in "under the second seed: the group sum it uploaded alone is not the gradient of its blocks, "*) r3=0 ;; *) r3=1 ;; esac
ok $([ -n "$v3" ] && [ "$r3" = 0 ] && [ "$n_s3" -eq 0 ] && [ "$den3" = denied ] && echo 0 || echo 1) \
	"a lone host whose own sketches hide its bytes passes the work unit's seed ($n_s3 flags) and is caught by the server's sketch under the second seed in round $v3 (grant $den3)"
