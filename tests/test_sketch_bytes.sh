#!/bin/sh
# cotrain tests: the averaged bytes tied to the committed sketches (issue
# 18; doc/credit.md, "Tied to the bytes").  A real PostgreSQL,
# cotrain-server and eight cotrain-client daemons train a tiny model in sync
# mode; five of the clients cheat (test hook COTRAIN_CHEAT):
#   - random-bytes sends random values with its gradient's norm,
#   - replay sends its previous round's gradient,
#   - mismatch sends a quarter of its gradient (not what it committed),
#   - agg-noise returns its sums with noise, as an aggregator:
#     each is caught by the server's check of the sketches of what was
#     averaged, flagged (the host API's "sketch_flags"), denied credit, and
#     the round reruns without it;
#   - scale-100 sends 100 times its gradient: the aggregators' outlier
#     refusal (10 times the median norm) drops it before any sketch is
#     compared (in a group of two, where no outlier can be told apart, the
#     sketch check flags it), so no step takes its bytes and it earns nothing;
# the slices and results travel in 8-bit blocks (COMP to change it), so the
# checks' tolerance covers the encoding's error;
# the model is unharmed: no committed step includes a cheater (the
# included set of every committed round), and the loss falls; three honest
# hosts on 1 and 2 threads and two GEMM paths are never flagged (0 false
# positives over the run).
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/val_project.sh"
val_init skbytes

plan 12

val_project 128
# No spot checks (first_rate 0, never trusted): this test is about the
# averaged bytes.  The policy stays: it hands out the sketch seed and k.
sql "update spot_policy set first_rate = 0, trusted_after = 1000000 where project_id = $pid" >/dev/null
# Slices and results in 8-bit blocks (COMP=none|fp16|8bit; 8bit by
# default): the tolerance must cover the encoding's error for honest hosts.
sql "update project set config = config || '{\"compression\": \"${COMP:-8bit}\"}' where id = $pid" >/dev/null

val_server 30

start_client 1 1 && start_client 2 2 COTRAIN_GEMM=blas && start_client 3 2 &&
	start_client 4 1 COTRAIN_CHEAT=random-bytes && start_client 5 1 COTRAIN_CHEAT=replay &&
	start_client 6 1 COTRAIN_CHEAT=mismatch && start_client 7 1 COTRAIN_CHEAT=agg-noise &&
	start_client 8 1 COTRAIN_CHEAT=scale-100 || bail_out "a client did not start"
HONEST="$H1,$H2,$H3"
SKETCHED="$H4,$H5,$H6,$H7"
CHEATS="$SKETCHED,$H8"
n_hooks=0
for c in 4 5 6 7 8; do grep -q "test hook COTRAIN_CHEAT" "$T/client$c.log" && n_hooks=$((n_hooks + 1)); done
is "$n_hooks" 5 "clients 4-8 (hosts $CHEATS) cheat, one way each"

flagged_all() { [ "$(sql "select count(distinct host_id) from round_sketch_flag where host_id in ($SKETCHED)")" -eq 4 ]; }
wait_for 600 flagged_all
wait_for 120 version_at_least 7
ok $? "eight clients commit 6 rounds or more (version $(version))"
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=

# Per cheater: the rounds it was flagged in, as what, its distances beside
# the tolerance (both relative to the larger sketch).
for c in 4 5 6 7; do
	eval "h=\$H$c"
	mode=$(sed -n 's/.*test hook COTRAIN_CHEAT=\([a-z0-9-]*\).*/\1/p' "$T/client$c.log" | head -1)
	n=$(sql "select count(distinct version) from round_sketch_flag where host_id = $h")
	diag "$mode (host $h): $(sql "select coalesce(string_agg(distinct role, '/'), 'never flagged') || ', distance ' || coalesce(round(min(distance)::numeric, 3) || '..' || round(max(distance)::numeric, 3), '-') || ', tolerance up to ' || coalesce(round(max(tolerance)::numeric, 3)::text, '-') from round_sketch_flag where host_id = $h")"
	ok $([ "$n" -ge 1 ] && echo 0 || echo 1) "the $mode cheater (host $h) is caught by the sketch checks, in $n rounds"
done

fp=$(sql "select count(*) from round_sketch_flag where host_id in ($HONEST)")
checked=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and r.state = 'committed' and m.host_id in ($HONEST) and m.sketches is not null")
ok $([ "$fp" -eq 0 ] && [ "$checked" -ge 6 ] && echo 0 || echo 1) \
	"honest hosts on 1 and 2 threads, two GEMM paths: 0 flagged ($fp) over $checked checked outcomes of committed rounds"

# A cheater's bytes: every contribution of random-bytes, mismatch and
# scale-100 in a round of several peers, replay's after its first such
# round (its first sends its own gradient), agg-noise's sums (as an
# aggregator of a range).
multi="(select count(*) from round_member o where o.project_id = m.project_id and o.version = m.version) > 1"
first5=$(sql "select coalesce(min(m.version), 1000000) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and m.host_id = $H5 and m.included and r.state = 'committed' and $multi")
leaked=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and r.state = 'committed' and m.included and $multi
    and (m.host_id in ($H4, $H6, $H8) or (m.host_id = $H5 and m.version > $first5) or (m.host_id = $H7 and m.hi > m.lo))")
committed=$(sql "select count(*) from round where project_id = $pid and state = 'committed'")
attempts=$(sql "select sum(attempt) from round where project_id = $pid and state = 'committed'")
sql "select 'included cheater: version ' || m.version || ' host ' || m.host_id || ' peers ' ||
    (select count(*) from round_member o where o.project_id = m.project_id and o.version = m.version) ||
    ' range ' || m.lo || '-' || m.hi || ' sketches ' || (m.sketches is not null) || ' committed ' ||
    (round_sketch_committed(m.project_id, m.version, m.host_id, 16, m.samples) is not null) ||
    ' units ' || (select string_agg(w.mb_done || ':' || coalesce(cardinality(ws.sketches), -1), ',') from work_unit w
      left join work_unit_sketch ws on ws.work_unit_id = w.id where w.project_id = m.project_id and w.version = m.version
      and w.host_id = m.host_id and w.mb_done > 0) || ' samples ' || m.samples
  from round_member m join round r using (project_id, version)
  where m.project_id = $pid and r.state = 'committed' and m.included and m.host_id in ($CHEATS)" | while read -r l; do diag "$l"; done
# The rounds that took a cheater's bytes, member by member (to read a failure).
sql "select 'round ' || m.version || ' attempt ' || r.attempt || ': host ' || o.host_id || ' group ' || o.group_id ||
    ' range ' || o.lo || '-' || o.hi || ' ' || coalesce(o.outcome, '-') || ' included ' || o.included ||
    ' samples ' || o.samples || ' partials ' || coalesce(jsonb_array_length(o.sketches->'aggregated'->'members'), -1)
  from round_member m join round r using (project_id, version)
  join round_member o on o.project_id = m.project_id and o.version = m.version
  where m.project_id = $pid and r.state = 'committed' and m.included and $multi
    and (m.host_id in ($H4, $H6, $H8) or (m.host_id = $H5 and m.version > $first5) or (m.host_id = $H7 and m.hi > m.lo))
  order by m.version, o.host_id" | while read -r l; do diag "$l"; done
is "$leaked" 0 "no committed step includes a cheater's bytes ($committed rounds committed in $attempts attempts)"

# From a cheater's bad round to the step without it: the flag, then the
# round's rerun committing.
diag "a flagged round reran and committed without the cheaters $(sql "select round(min(extract(epoch from r.committed_at - f.created_at))::numeric, 1) || '..' || round(max(extract(epoch from r.committed_at - f.created_at))::numeric, 1) from round_sketch_flag f join round r using (project_id, version) where f.project_id = $pid and r.state = 'committed'") s after the flag"
denied=$(sql "select count(*) from credit_grant where project_id = $pid and host_id in ($SKETCHED) and status = 'denied'")
granted=$(sql "select count(*) from credit_grant g where project_id = $pid and host_id in ($H4, $H6, $H8)
  and status <> 'denied' and version in (select version from round_member m where m.project_id = $pid and m.host_id = g.host_id and $multi)")
h_denied=$(sql "select count(*) from credit_grant where project_id = $pid and host_id in ($HONEST) and status = 'denied'")
ok $([ "$denied" -ge 4 ] && [ "$granted" -eq 0 ] && [ "$h_denied" -eq 0 ] && echo 0 || echo 1) \
	"cheaters' credit: $denied round grants denied; random-bytes, mismatch, scale-100 granted or pending: $granted; honest hosts denied: $h_denied"

# scale-100: in a group of three or more the aggregators' outlier refusal
# keeps it out before any sketch is compared; in a group of two no outlier
# can be told apart, and the sketch check flags it (the round reruns).
planned8=$(sql "select count(*) from round_member m where project_id = $pid and host_id = $H8 and $multi")
incl8=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where m.project_id = $pid and m.host_id = $H8 and m.included and r.state = 'committed'")
diag "scale-100 (host $H8): in $planned8 plans of several peers, included in $incl8 committed rounds, flagged $(sql "select count(*) from round_sketch_flag where host_id = $H8") times"
ok $([ "$incl8" -eq 0 ] && echo 0 || echo 1) \
	"the scale-100 cheater is in no committed round: the outlier refusal or the sketch check keeps it out"

# The flags are visible through the API (the host page reads it).
flags_api=$(curl -s "http://127.0.0.1:$PORT/v1/credit/hosts/$H6" 2>/dev/null | grep -o '"sketch_flags" *: *{"count" *: *[0-9]*' | grep -o '[0-9]*$')
ok $([ "${flags_api:-0}" -ge 1 ] && echo 0 || echo 1) "the host API shows the mismatch cheater's flags ($flags_api)"

losses=$(sql "select round(avg(loss) filter (where version <= 2)::numeric, 3) || ' ' || round(avg(loss) filter (where version >= (select max(version) - 2 from round where project_id = $pid and state = 'committed'))::numeric, 3)
  from round where project_id = $pid and state = 'committed'")
set -- $losses
ok $(awk -v a="$1" -v b="$2" 'BEGIN { exit !(b < a) }' && echo 0 || echo 1) "the loss falls with the cheaters excluded: $1 in the first rounds, $2 in the last"
