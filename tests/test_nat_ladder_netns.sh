#!/bin/sh
# cotrain tests: the NAT ladder learns (doc/nat.md, "Plans from history",
# "One household", "Keepalives"), with real cotrain-client daemons in
# network namespaces (root only; SKIP otherwise).  The server sits in the
# internet namespace; four sites train in one group:
#   H1, H2  two hosts behind one home router (endpoint-independent
#           masquerade, two LAN ports), which does not hairpin: the server
#           sees them at one public address and plans a "lan" dial to each
#           other's local endpoint;
#   X       a "dual-WAN" router: flows to the server leave from one public
#           address, every other flow from a second one (both keep the
#           port), so the server classifies X "nat independent" and plans
#           punches that cannot work;
#   Y       a home router that forgets an idle connection after 15 s
#           (conntrack's established timeout), as some do.
# Asserts: H1 and H2 reach each other by "lan" in every full round; X's
# punches fail and fall back to the relay; from its next round on each
# such pair is planned "relay" at once (no punch window paid); the host views and cotrain-admin status show X's failed
# punches; once X's router is fixed mid-run, a retried punch connects and
# X punches again; the household and Y keep punching each other (one bad
# peer does not mark them); for every connection of every round the dialer's log,
# the aggregator's log and round_link name the same rung (failed punches
# included); Y takes part in every full round, and its daemon never waited
# out an HTTP timeout, also in a round that H1 holds up (stopped before it
# reports) for longer than Y's router remembers an idle connection, so
# that Y's plan long poll idles past 15 s.  The all-reduce time per round
# is printed as TAP comments.  NAT_KEEP=DIR keeps the logs.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
. "$top_srcdir/tests/netns.sh"
. "$top_srcdir/tests/nat/netns-nat.sh"
natns_require
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/round-lib.sh"
T=$(mktemp -d /tmp/cotrain-natladder-XXXXXX)
chmod 755 "$T"
NAT_DATA=$T
NETNS_EXIT_HOOK='nr_teardown'
netns_init

plan 13

SITES="H1:21 H2:22 X:23 Y:25"
netns_hub_new || bail_out "no hub"
netns_hub_attach srv 1 0 || bail_out "no server namespace"
SRV=$(netns_ip 1)
# H1 and H2: one router (r21), two LAN ports; LAN to LAN is forwarded, the
# public address is not hairpinned (masquerade only, no DNAT).
natns_router r21 21 192.168.21 eim || bail_out "no household router"
natns_household r21 22 192.168.22 || bail_out "no second host in the household"
# X: server-bound flows from the router's hub address, the rest from a second one.
natns_router r23 23 192.168.23 eim || bail_out "no router X"
natns_dualwan r23 24 "$SRV" || bail_out "could not make router X dual-WAN"
# Y: a router that forgets an established connection idle for 15 s.
natns_router r25 25 192.168.25 eim || bail_out "no router Y"
netns_exec r25 sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_established=15 ||
	bail_out "could not lower the conntrack timeout in router Y"

nr_project "$T" || bail_out "could not set up the project"
NR_REPORT_TIMEOUT=40 # the silence Y's long poll must outlive (below)
nr_server "$T" "$SRV" 8080 7001 || bail_out "the server did not start"
for s in $SITES; do
	nr_client "${s%%:*}" "${s#*:}" "http://$SRV:8080/projects/tiny" "$SRV:7001" ||
		bail_out "client ${s%%:*} did not start"
done
nr_wait 90 nr_all_registered || bail_out "not every daemon registered"
for s in $SITES; do diag "site ${s%%:*} (host $(nr_host "${s%%:*}")): $(nr_class "${s%%:*}")"; done
HX=$(nr_host X) HY=$(nr_host Y) H1=$(nr_host H1) H2=$(nr_host H2)

# links of host $1 in round $2 (both directions): "plan/rung" words
links_of() {
	nr_sql "select coalesce(string_agg(coalesce(l.plan, '-') || '/' || l.rung, ' ' order by l.host_id, l.peer_id), '')
	  from round_link l join project p on p.id = l.project_id
	 where p.name = 'tiny' and l.version = $2 and (l.host_id = $1 or l.peer_id = $1)"
}
# the first round in which X's punches were tried and failed
first_fail() {
	FAILV=$(nr_sql "select min(l.version) from round_link l join project p on p.id = l.project_id
	  where p.name = 'tiny' and (l.host_id = $HX or l.peer_id = $HX) and l.plan = 'punch' and l.rung = 'relay'")
	[ -n "$FAILV" ]
}
# a committed round after $1 in which X has links
x_round_after() {
	NEXTV=$(nr_sql "select min(l.version) from round_link l join project p on p.id = l.project_id
	  join round r on r.project_id = l.project_id and r.version = l.version
	  where p.name = 'tiny' and r.state = 'committed' and l.version > $1 and (l.host_id = $HX or l.peer_id = $HX)")
	[ -n "$NEXTV" ]
}

FULL=
nr_wait 150 nr_full_round_after "" && FULL=$NR_FOUND
nr_wait 120 first_fail
ok $([ -n "$FAILV" ]; echo $?) "X's punches fail behind the dual-WAN router and the relay saves them (round ${FAILV:-none}: $( [ -n "$FAILV" ] && links_of "$HX" "$FAILV"))"
# For each pair of X whose punches failed in a round: "V:H-H=PLAN", the
# plan of the pair's next round with links ("" when none came yet).
pairs_next() {
	nr_sql "select coalesce(string_agg(f.v || ':' || f.a || '-' || f.b || '=' || coalesce(n.plan, '?'), ' ' order by f.v, f.a), '')
	  from (select distinct l.version v, least(l.host_id, l.peer_id) a, greatest(l.host_id, l.peer_id) b
	          from round_link l where l.plan = 'punch' and l.rung <> 'punch'
	           and (l.host_id = $HX or l.peer_id = $HX) and l.version < $1) f
	  left join lateral (select l2.plan from round_link l2
	         where least(l2.host_id, l2.peer_id) = f.a and greatest(l2.host_id, l2.peer_id) = f.b
	           and l2.version > f.v order by l2.version, l2.plan = 'punch' desc limit 1) n on true"
}
LATER=
# every pair whose punch failed had a round since
next_known() { LATER=$(pairs_next 1000000); case "$LATER" in ""|*=\?*) return 1 ;; esac; }
[ -n "$FAILV" ] && nr_wait 90 next_known
case " $LATER " in *=punch*|*=\?*|"  ") r=1 ;; *) r=0 ;; esac
ok $r "from its next round on each pair whose punch failed is planned relay at once (round:pair=next plan: ${LATER:-none})"
# What the owner and the admin see while X is relayed by history.
view=$(netns_exec srv curl -fsS "http://$SRV:8080/v1/hosts/$HX/network" 2>&1)
case $view in *'"history"'*'"skipped": true'*) r=0 ;; *) r=1 ;; esac
ok $r "X's public host view shows its failed punches and the pairs relayed at once ($(echo "$view" | grep -o '"history": {[^]]*]' | cut -c1-300))"
st=$(nr_admin status 2>&1 | awk -v h="$HX" '$1 == h')
fails=$(echo "$st" | awk '{print $(NF-1)}')
ok $([ "${fails:-0}" -ge 2 ] 2>/dev/null; echo $?) "cotrain-admin status shows X's failed punches in a row ($st)"
grep "history:" "$T/server.log" | tail -2 | while IFS= read -r l; do diag "server: $l"; done

# Fix X's router: one public address for every flow.  A retried punch
# must notice it.
V_FIX=$(nr_sql "select current_version from project where name = 'tiny'")
nr_renat r23 eim
punch_again() {
	PV=$(nr_sql "select min(l.version) from round_link l join project p on p.id = l.project_id
	  where p.name = 'tiny' and l.version > $V_FIX and (l.host_id = $HX or l.peer_id = $HX) and l.rung = 'punch'")
	[ -n "$PV" ]
}
nr_wait 200 punch_again
ok $([ -n "$PV" ]; echo $?) "after X's router is fixed (round $V_FIX) a retried punch connects and X punches again (round ${PV:-none}: $( [ -n "$PV" ] && links_of "$HX" "$PV"))"
# The pair that punched again, in its next round.
AFTER=
again_next() {
	AFTER=$(nr_sql "select string_agg(l2.version || ':' || l2.plan || '/' || l2.rung, ' ') from round_link l
	  join round_link l2 on least(l2.host_id, l2.peer_id) = least(l.host_id, l.peer_id)
	   and greatest(l2.host_id, l2.peer_id) = greatest(l.host_id, l.peer_id)
	   and l2.version = (select min(l3.version) from round_link l3
	        where least(l3.host_id, l3.peer_id) = least(l.host_id, l.peer_id)
	          and greatest(l3.host_id, l3.peer_id) = greatest(l.host_id, l.peer_id) and l3.version > $PV)
	  where l.version = $PV and l.rung = 'punch' and (l.host_id = $HX or l.peer_id = $HX)")
	[ -n "$AFTER" ]
}
[ -n "$PV" ] && nr_wait 120 again_next
case " $AFTER " in *relay/*|"  ") r=1 ;; *) r=0 ;; esac
ok $r "  and that pair keeps punching in its next round (${AFTER:-none came})"

# Y's long poll across a silence longer than its router's 15 s: H1 stops
# (SIGSTOP) before it reports in round VK, so the round is planned only at
# the report timeout (NR_REPORT_TIMEOUT, 40 s), and Y, which reported at
# once, holds its plan request (PLAN_WAIT_S, 30 s) idle meanwhile.  Without
# keepalives its router forgets the connection, the answer is lost and Y
# waits out its HTTP timeout, missing the round.
# From two rounds on: the first round H1 reports in after its restart
# (under load its restart can take more than two rounds).
VK=$(($(nr_sql "select current_version from project where name = 'tiny'") + 2))
COTRAIN_FAULT=before-report:stop:$VK+
export COTRAIN_FAULT
nr_restart H1 21 "$SRV:7001" || bail_out "H1 did not start again"
unset COTRAIN_FAULT
nr_wait 240 grep -q "fault point before-report: stop" "$T/clH1.log"
VK=$(sed -n 's/.*fault point before-report: stop (round \([0-9]*\)).*/\1/p' "$T/clH1.log" | head -1)
VK=${VK:-0}
vk_done() {
	[ -n "$(nr_sql "select 1 from round r join project p on p.id = r.project_id
	  where p.name = 'tiny' and r.version = $VK and r.state in ('committed', 'failed')")" ]
}
nr_wait 240 vk_done
kill -CONT "$NR_PID_H1" 2>/dev/null
# seconds of the day at the first line of Y's log that has $1
y_at() { grep -m1 "$1" "$T/clY.log" | awk '{ split($2, t, ":"); printf "%.1f", t[1] * 3600 + t[2] * 60 + t[3] }'; }
held=$(awk -v a="$(y_at "round $VK is closing")" -v b="$(y_at "round $VK: attempt [0-9]* planned")" \
	'BEGIN { if (a != "" && b != "") printf "%.0f", b - a; else print -1 }')
yin=$(nr_sql "select count(*) from round_member m join round r using (project_id, version) join project p on p.id = m.project_id
  where p.name = 'tiny' and r.version = $VK and r.state = 'committed' and m.host_id = $HY and m.included")
fired=$(grep -c "fault point before-report: stop" "$T/clH1.log")
ok $([ "$fired" -ge 1 ] && [ "$held" -ge 20 ] && [ "$yin" = 1 ]; echo $?) \
	"Y's plan long poll outlives its router's 15 s idle timeout: held $held s in round $VK while H1 was stopped (fault fired: $fired), and Y is in the round ($yin)"
nr_stop_clients

# Every committed round with links, as each side saw it.
ROUNDS=$(nr_sql "select string_agg(distinct l.version::text, ' ') from round_link l join round r using (project_id, version)
  join project p on p.id = l.project_id where p.name = 'tiny' and r.state = 'committed'")
nr_rungs "$ROUNDS" >"$T/rungs"
nr_matrix "$T/rungs" "$SITES" | while IFS= read -r l; do diag "$l"; done
nlan=$(awk '($4 == "H1" && $5 == "H2") || ($4 == "H2" && $5 == "H1")' "$T/rungs" | wc -l)
badlan=$(awk '(($4 == "H1" && $5 == "H2") || ($4 == "H2" && $5 == "H1")) && $6 != "lan" { printf " %s:%s->%s:%s", $1, $4, $5, $6 }' "$T/rungs")
ok $([ "$nlan" -gt 0 ] && [ -z "$badlan" ]; echo $?) "the two hosts of one household reach each other by lan, without hairpinning ($nlan connections${badlan:+; otherwise:$badlan})"
# One bad peer (X) does not make its peers' punches with others look bad.
skipped=$(nr_sql "select count(*) from round_link l join project p on p.id = l.project_id where p.name = 'tiny'
  and l.host_id in ($H1, $H2, $HY) and l.peer_id in ($H1, $H2, $HY) and l.plan = 'relay'")
pk=$(awk '($4 ~ /^H/ && $5 == "Y") || ($4 == "Y" && $5 ~ /^H/)' "$T/rungs" | awk '$6 == "punch"' | wc -l)
ok $([ "$skipped" = 0 ] && [ "$pk" -gt 0 ]; echo $?) "the household and Y keep punching each other although X's punches with them failed ($pk punched, $skipped relayed by history)"
failed=$(nr_sql "select count(*) from round_link l join project p on p.id = l.project_id where p.name = 'tiny' and l.plan = 'punch' and l.rung <> 'punch'")
mism=$(nr_accept_mismatch "$T/rungs")
ok $([ -z "$mism" ] && [ -s "$T/rungs" ]; echo $?) \
	"each aggregator logged the rung that carried each connection, as its dialer did ($(wc -l <"$T/rungs") connections, $failed failed punches among them${mism:+; differ:$mism})"
mism=$(nr_link_mismatch "$T/rungs")
ok $([ -z "$mism" ] && [ -s "$T/rungs" ]; echo $?) "round_link names the same rung for each${mism:+ (differ:$mism)}"

# Y behind the router with a 15 s idle timeout.
ny=$(nr_sql "select count(*) from round_member m join round r using (project_id, version) join project p on p.id = m.project_id
  where p.name = 'tiny' and r.state = 'committed' and m.host_id = $HY and m.included")
nfull=$(nr_sql "select count(*) from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.state = 'committed'
  and (select count(*) from round_member m where m.project_id = r.project_id and m.version = r.version and m.included) = 4")
to=$(grep -ci "timed out\|timeout was reached" "$T/clY.log")
ok $([ "$ny" -ge "$nfull" ] && [ "$nfull" -ge 2 ] && [ "$to" = 0 ]; echo $?) \
	"behind a router that forgets idle connections after 15 s, Y is in every full round (in $ny rounds, $nfull full) and never waited out an HTTP timeout ($to timeouts logged)"
nr_allreduce_s "$ROUNDS" | while read -r v s; do
	diag "round $v: all-reduce $s s (slowest member); X: $(links_of "$HX" "$v")"
done
kill -0 "$NR_SPID" 2>/dev/null
ok $? "the server is still running"
done_testing
