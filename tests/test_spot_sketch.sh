#!/bin/sh
# cotrain tests: spot checks of committed microbatch sketches (issue 18;
# doc/credit.md, "Spot checks").  A real PostgreSQL, cotrain-server and
# five cotrain-client daemons train a tiny model in sync mode with every
# host checked on every round (first_rate 1, never trusted), two
# microbatches a check:
#   - four honest hosts on different thread counts and GEMM paths (the
#     backend's own and OpenBLAS's, COTRAIN_GEMM=blas) never disagree: 0
#     false positives over the run;
#   - a host that skips half of its microbatches, reports made-up sketches
#     for them and sends bytes that match them (the test hook
#     COTRAIN_CHEAT=skip-half: only a spot check can tell) is caught: a
#     check disagrees, a third host settles each dispute against it, its
#     credit is denied, and no round committed after that takes its bytes;
#   - the checked host never recomputes anything: the checks' compute is
#     the microbatches the checkers and third hosts recomputed, printed as a
#     fraction of the microbatches trained;
#   - the cheater, stopped (as if detached), still has its open checks
#     settled by the others from the sketches it committed;
#   - no host answered two consecutive checks of the same host (a friend
#     cannot vouch for a host every time);
#   - checks past their deadline expire on the server's timer, with no
#     client listing or claiming checks.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/val_project.sh"
SPOT_INTERVAL=1
val_init sketch

plan 13

val_project 96
# A dispute no host may settle (each may answer at most every other check
# of a host) is denied at its deadline: 60 s, within the test's waits.
sql "update spot_policy set first_rate = 1, trusted_after = 1000000, deadline_s = 60 where project_id = $pid" >/dev/null

val_server 20

start_client 1 1 && start_client 2 2 COTRAIN_GEMM=blas && start_client 3 2 &&
	start_client 4 1 COTRAIN_GEMM=blas && start_client 5 1 COTRAIN_CHEAT=skip-half ||
	bail_out "a client did not start"
HONEST="$H1,$H2,$H3,$H4"
CHEAT=$H5
grep -q "COTRAIN_CHEAT=skip-half" "$T/client5.log"
ok $? "client 5 (host $CHEAT) cheats: it skips half of its microbatches"

caught() { [ "$(sql "select count(*) from round_sketch_flag where host_id = $CHEAT and spot_check_id is not null")" -ge 1 ]; }
wait_for 400 version_at_least 16
ok $? "five clients commit 15 rounds (version $(version))"
wait_for 120 caught
n_sk=$(sql "select count(*) from work_unit_sketch ws join work_unit w on w.id = ws.work_unit_id
  where w.project_id = $pid")
ok $([ "$n_sk" -ge 15 ] && echo 0 || echo 1) "the reports committed the sketches of their microbatches ($n_sk work units)"
# Its bytes were in no round since: four more rounds commit without it.
banned_at=$(sql "select min(created_at) from round_sketch_flag where host_id = $CHEAT and spot_check_id is not null")
v_ban=$(version)
wait_for 120 version_at_least $((v_ban + 4))
since=$(sql "select count(*) || ' ' || count(*) filter (where exists (select 1 from round_member m
    where m.project_id = r.project_id and m.version = r.version and m.host_id = $CHEAT and m.included))
  from round r where r.project_id = $pid and r.state = 'committed' and r.committed_at > '$banned_at'")
set -- $since
ok $([ "$1" -ge 4 ] && [ "$2" -eq 0 ] && echo 0 || echo 1) \
	"no round committed after the cheater was caught took its bytes ($2 of $1 rounds)"

# The cheater, stopped as if detached: its open checks are settled
# without it, from what it committed.
stop_client 5
open_of_cheat() { sql "select count(*) from spot_check where host_id = $CHEAT and state = 'open'"; }
before=$(open_of_cheat)
settled() { [ "$(open_of_cheat)" -eq 0 ]; }
wait_for 120 settled
ok $? "the stopped cheater's $before open checks were settled without it ($(open_of_cheat) left)"
stop_clients

summary=$(sql "select
  count(*) filter (where host_id in ($HONEST)) || ' ' ||
  count(*) filter (where host_id in ($HONEST) and state = 'agreed') || ' ' ||
  count(*) filter (where host_id in ($HONEST) and (state = 'disagreed' or disputed_at is not null)) || ' ' ||
  count(*) filter (where host_id = $CHEAT) || ' ' ||
  count(*) filter (where host_id = $CHEAT and state = 'disagreed') || ' ' ||
  count(*) filter (where host_id = $CHEAT and state = 'agreed') || ' ' ||
  count(*) filter (where host_id = $CHEAT and fp_third is not null) || ' ' ||
  coalesce(max(distance) filter (where host_id in ($HONEST)), 0)
  from spot_check where project_id = $pid and microbatches is not null")
set -- $summary
h_all=$1 h_agreed=$2 h_bad=$3 c_all=$4 c_dis=$5 c_agr=$6 c_third=$7 h_maxd=$8
diag "honest hosts: $h_all checks, $h_agreed agreed, $h_bad disputed or disagreed, largest distance $h_maxd"
diag "cheater: $c_all checks, $c_dis disagreed, $c_agr agreed (both microbatches drawn among those it computed), $c_third settled by a third host"
ok $([ "$h_agreed" -ge 10 ] && [ "$h_bad" -eq 0 ] && echo 0 || echo 1) \
	"honest hosts on 1 and 2 threads, two GEMM paths: $h_agreed checks agreed, 0 false positives ($h_bad)"
if ! ok $([ "$c_dis" -ge 1 ] && echo 0 || echo 1) "the cheater is caught: $c_dis of its $c_all checks disagreed"; then
	sql "select 'check ' || id || ' v' || version || ' ' || state || ': ' || coalesce(outcome, '') from spot_check
	  where host_id = $CHEAT order by id" | while read -r l; do diag "$l"; done
	sql "select status || ': ' || count(*) from credit_grant where host_id = $CHEAT
	  group by status order by status" | while read -r l; do diag "grants $l"; done
	sql "select 'flag v' || version || ' ' || role || ': ' || reason from round_sketch_flag
	  where host_id = $CHEAT order by version" | while read -r l; do diag "$l"; done
	sql "select 'v' || version || ' accepted ' || coalesce(accepted::text, 'null') || ' ' || coalesce(outcome, '-')
	  from round_member where host_id = $CHEAT order by version" | while read -r l; do diag "$l"; done
fi
ok $([ "$c_third" -ge 1 ] && [ "$c_third" -ge "$c_dis" ] && echo 0 || echo 1) \
	"every dispute over the cheater was settled by a third host ($c_third of $c_dis)"
# From the cheater's first round to its first denial.
caught_after=$(sql "select round(extract(epoch from min(c.resolved_at) - min(r.opened_at))::numeric, 1) || ' s, '
  || (select count(*) from round_member m join spot_check d on d.host_id = m.host_id
       where m.host_id = $CHEAT and m.project_id = $pid and d.id = (select min(id) from spot_check
         where host_id = $CHEAT and state = 'disagreed') and m.version <= d.version) || ' of its rounds'
  from spot_check c, round r join round_member m using (project_id, version)
  where c.host_id = $CHEAT and c.state = 'disagreed' and m.host_id = $CHEAT")
diag "the cheater's first denial came $caught_after after its first round opened"
grants=$(sql "select count(*) filter (where status = 'denied') || ' ' || count(*) filter (where status = 'granted')
  || ' ' || count(*) filter (where status = 'pending') from credit_grant where project_id = $pid and host_id = $CHEAT and kind = 'round'")
set -- $grants
ok $([ "$1" -ge "$c_dis" ] && [ "$1" -gt "$2" ] && echo 0 || echo 1) \
	"the cheater's credit is denied: $1 round grants denied, $2 granted, $3 pending"
h_denied=$(sql "select count(*) from credit_grant where project_id = $pid and host_id in ($HONEST) and status = 'denied'")
is "$h_denied" 0 "no honest host was denied credit"
# Checkers agreeing with the cheater's made-up sketches would be flagged.
is "$(sql "select count(*) from spot_check where project_id = $pid and outcome like '%the checker disagreed%'
  and host_id = $CHEAT")" 0 "no third host sided with the cheater"

# No host vouches for another twice in a row.
pairs=$(sql "select count(*) from spot_check c join spot_check o on o.host_id = c.host_id
  and o.id = (select max(id) from spot_check p where p.host_id = c.host_id and p.id < c.id)
  where c.project_id = $pid
    and (c.checker_id in (o.checker_id, o.third_id) or c.third_id in (o.checker_id, o.third_id))")
is "$pairs" 0 "no host answered two consecutive checks of the same host"

# The compute the checks took: the microbatches recomputed by checkers and
# third hosts, against every microbatch trained.
checked=$(sql "select coalesce(sum(cardinality(microbatches) * ((fp_checker is not null)::int + (fp_third is not null)::int)), 0)
  from spot_check where project_id = $pid")
trained=$(sql "select sum(mb_done) from work_unit where project_id = $pid and state in ('done', 'returned')")
diag "checks recomputed $checked microbatches of the $trained trained: $(echo "$checked $trained" | awk '{printf "%.1f%%", 100 * $1 / $2}') (first_rate 1, 2 microbatches a check)"

# Expiry on the server's timer: no client runs, so nothing lists or claims
# checks now.  The checks left open are made overdue, and one more opens
# (a copy of a settled one, due in 3 s) to be sure there is one.
sql "update spot_check set deadline = now() - interval '1 second' where project_id = $pid and state = 'open'" >/dev/null
late=$(sql "insert into spot_check (project_id, version, work_unit_id, host_id, lo, hi, samples, seed, k,
    tolerance, created_at, deadline, microbatches, fp_host)
  select project_id, version, work_unit_id, host_id, lo, hi, samples, seed, k, tolerance, now(),
    now() + interval '3 seconds', microbatches, fp_host
  from spot_check where project_id = $pid and microbatches is not null order by id limit 1 returning id")
left=$(sql "select count(*) from spot_check where project_id = $pid and state = 'open'")
none_open() { [ "$(sql "select count(*) from spot_check where project_id = $pid and state = 'open'")" -eq 0 ]; }
wait_for 30 none_open
expired=$?
ok $([ $expired -eq 0 ] && [ "$left" -ge 1 ] &&
	[ "$(sql "select state || ': ' || outcome from spot_check where id = ${late:-0}")" = "expired: expired without a checker" ] &&
	echo 0 || echo 1) "the server's timer expired the $left checks left open once past their deadline"
