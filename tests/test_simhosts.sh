#!/bin/sh
# cotrain tests: the host simulator (tests/bench/simhosts) against a real
# cotrain-server and PostgreSQL: 30 simulated hosts, some leaving and some
# dying mid-unit, take a fresh project through 2 rounds; both commit with
# peers accepted, and the simulator saw no unexpected answer.  Keeps
# simhosts from rotting; the figures are tests/bench/bench-scale.sh's.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-simhosts-XXXXXX)
. "$top_srcdir/tests/bench/simhosts-lib.sh"
trap 'sim_stop; rm -rf "$T"' EXIT INT TERM
plan 4

sim_setup || bail_out "could not set up the database"
sim_server || bail_out "the server did not start: $(cat "$T/server.log")"
sim_project smoke 240 || bail_out "could not create the project: $(cat "$T/smoke.out")"
timeout 300 "$B/tests/bench/simhosts" --url "http://127.0.0.1:$PORT" --project smoke --key "$KEY" \
	--hosts 30 --rounds 2 --seconds 240 --speed 8 --leave 0.02 --die 0.02 --seed 5 >"$T/sim.out" 2>"$T/sim.err"
rc=$?
is "$rc" 0 "simhosts ran 30 hosts to version 2 without an unexpected answer"
[ "$rc" = 0 ] || diag "$(tail -5 "$T/sim.err")"
committed=$(sim_sql "select count(*) from round r join project p on p.id = r.project_id
  where p.name = 'smoke' and r.state = 'committed' and r.version < 2")
is "$committed" 2 "rounds 0 and 1 committed"
accepted=$(sim_sql "select count(distinct m.version) from round_member m join project p on p.id = m.project_id
  where p.name = 'smoke' and m.accepted and m.version < 2")
is "$accepted" 2 "each has peers accepted by parameter hash"
hosts=$(sed -n 's/^hosts=\([0-9]*\).*/\1/p' "$T/sim.out")
ok $([ "${hosts:-0}" -ge 30 ] && echo 0 || echo 1) "the simulator started its 30 hosts ($(cat "$T/sim.out"))"
done_testing
