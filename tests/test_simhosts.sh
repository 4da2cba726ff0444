#!/bin/sh
# cotrain tests: the host simulator (tests/bench/simhosts) against a real
# cotrain-server and PostgreSQL: 30 simulated hosts, some leaving and some
# dying mid-unit, take a fresh project through 2 rounds averaged through
# the server (--round-server-mean); both commit with peers accepted, and
# the simulator saw no unexpected answer.  Then the same against a server
# with its default averaging path (groups of at most 4): the rounds of 30
# hosts average between the peers, one of them across several groups,
# commit from the peers' uploaded checkpoints, and the server received no
# gradient byte; then two hosts on that server: their rounds of two peers
# average through the server (server/round_coord.c: between the peers from
# three peers up), which receives their group sums.
# Keeps simhosts from rotting; the figures are tests/bench/bench-scale.sh's.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-simhosts-XXXXXX)
. "$top_srcdir/tests/bench/simhosts-lib.sh"
trap 'sim_stop; rm -rf "$T"' EXIT INT TERM
plan 13
# run_sim PROJECT OUT WHAT [SIMHOSTS ARGS...]: simhosts on PROJECT of the
# server at $PORT, its output in $T/OUT.out and .err; one check, WHAT, that
# it ran without an unexpected answer.
run_sim() {
	_p=$1 _o=$2 _what=$3
	shift 3
	timeout 300 "$B/tests/bench/simhosts" --url "http://127.0.0.1:$PORT" --project "$_p" --key "$KEY" \
		"$@" >"$T/$_o.out" 2>"$T/$_o.err"
	_rc=$?
	is "$_rc" 0 "$_what"
	[ "$_rc" = 0 ] || diag "$(tail -5 "$T/$_o.err")"
}

sim_setup || bail_out "could not set up the database"
sim_server --round-server-mean || bail_out "the server did not start: $(cat "$T/server.log")"
sim_project smoke 240 || bail_out "could not create the project: $(cat "$T/smoke.out")"
run_sim smoke sim "simhosts ran 30 hosts to version 2 without an unexpected answer" \
	--hosts 30 --rounds 2 --seconds 240 --speed 8 --leave 0.02 --die 0.02 --seed 5
committed=$(sim_sql "select count(*) from round r join project p on p.id = r.project_id
  where p.name = 'smoke' and r.state = 'committed' and r.version < 2")
is "$committed" 2 "rounds 0 and 1 committed"
accepted=$(sim_sql "select count(distinct m.version) from round_member m join project p on p.id = m.project_id
  where p.name = 'smoke' and m.accepted and m.version < 2")
is "$accepted" 2 "each has peers accepted by parameter hash"
hosts=$(sed -n 's/^hosts=\([0-9]*\).*/\1/p' "$T/sim.out")
ok $([ "${hosts:-0}" -ge 30 ] && echo 0 || echo 1) "the simulator started its 30 hosts ($(cat "$T/sim.out"))"

# Across groups between the peers, the server's default for three peers up.
sim_stop
sim_server --round-max-group 4 || bail_out "the server did not start: $(cat "$T/server.log")"
sim_project xsmoke 240 || bail_out "could not create the project: $(cat "$T/xsmoke.out")"
run_sim xsmoke xsim "across groups between the peers: simhosts ran 30 hosts to version 2 without an unexpected answer" \
	--hosts 30 --rounds 2 --seconds 240 --speed 8 --seed 6
xrounds="select r.version from round r join project p on p.id = r.project_id
  where p.name = 'xsmoke' and r.state = 'committed' and r.version < 2"
is "$(sim_sql "select count(*) from ($xrounds) x")" 2 "rounds 0 and 1 committed"
groups=$(sim_sql "select coalesce(max(r.n_groups), 0) from round r join project p on p.id = r.project_id
  where p.name = 'xsmoke' and r.state = 'committed' and r.version < 2 and r.cross_peers")
ok "$([ "$groups" -ge 2 ] && echo 0 || echo 1)" "a round averaged across $groups groups between the peers"
accepted=$(sim_sql "select count(distinct m.version) from round_member m join project p on p.id = m.project_id
  where p.name = 'xsmoke' and m.accepted and m.version < 2")
is "$accepted" 2 "each has peers accepted by parameter hash"
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
is "$(metric cotrain_gradient_bytes_received_total)" 0 "the server received no gradient byte"
ck=$(metric cotrain_checkpoint_bytes_received_total)
ok "$([ "${ck:-0}" -gt 0 ] && echo 0 || echo 1)" "it received the rounds' checkpoints from the peers ($ck bytes)"

# Two peers, on the same server: through it.  At one microbatch a second
# a host's work unit (8 s) holds half a round's 16: each round needs both.
sim_project pair 16 || bail_out "could not create the project: $(cat "$T/pair.out")"
run_sim pair psim "two hosts: simhosts ran them to version 2 without an unexpected answer" \
	--hosts 2 --rounds 2 --seconds 120 --speed 1 --speed-spread 0 --seed 7
paths=$(sim_sql "select count(*) filter (where n.peers = 2) || ' ' ||
    count(*) filter (where r.cross_peers) || ' ' || count(*)
  from round r join project p on p.id = r.project_id
  cross join lateral (select count(*) as peers from round_member m
                       where m.project_id = r.project_id and m.version = r.version) n
  where p.name = 'pair' and r.state = 'committed' and r.version < 2")
read -r n_two n_cross n_all <<EOF
$paths
EOF
ok "$([ "$n_all" = 2 ] && [ "$n_two" -ge 1 ] && [ "$n_cross" = 0 ] && echo 0 || echo 1)" \
	"rounds 0 and 1 committed through the server ($n_all committed, $n_two of two peers, $n_cross between the peers)"
gb=$(metric cotrain_gradient_bytes_received_total)
ok "$([ "${gb:-0}" -gt 0 ] && echo 0 || echo 1)" "the server received their group sums ($gb bytes)"
done_testing
