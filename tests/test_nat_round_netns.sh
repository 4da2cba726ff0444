#!/bin/sh
# cotrain tests: a full collaborative training round across emulated NAT
# sites, in network namespaces (root only; SKIP otherwise).  An "internet"
# (the hub) holds cotrain-server (HTTP and the NAT service, --relay-port);
# PostgreSQL stays in the root namespace on its unix socket, which every
# namespace reaches through the filesystem.  Five home sites each run a
# real cotrain-client daemon (tests/nat/netns-nat.sh builds the routers):
#   U  a home router with a UPnP IGD (Debian's miniupnpd): the client maps
#      its port, is classified "mapped" and is dialed directly;
#   A, B  two endpoint-independent "home" NATs: hole punching between them;
#   S  a symmetric NAT: it aggregates nothing, and its connections to NATed
#      aggregators go through the relay (to the mapped one: direct);
#   C  carrier-grade NAT (two endpoint-independent layers): port mapping
#      fails cleanly and the ladder moves on (the design punches through
#      both layers, doc/nat.md).
# One group (--round-max-group 16), so every pair meets.  Asserts: each
# site's class; rounds commit with all five peers included, two before and
# one after every daemon restarts (connection tracking is flushed while they
# are all down: the UPnP mapping is removed and made again); no fork (every
# included peer holds the server's parameters); the symmetric host
# aggregates in no round; each (dialer, aggregator) pair's rung, from the
# dialers' logs, the same in the aggregators' logs and in table round_link;
# cotrainctl status and the public host view show the relayed links.  The
# rung matrix and the mean time to connect per rung are printed as TAP
# comments.  Everything is torn down on every exit path.  Without miniupnpd
# the UPnP site is left out (its checks SKIP with the reason) and four
# sites train.  NAT_KEEP=DIR keeps the logs.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
. "$top_srcdir/tests/netns.sh"
. "$top_srcdir/tests/nat/netns-nat.sh"
natns_require
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/round-lib.sh"
T=$(mktemp -d /tmp/cotrain-natround-XXXXXX)
chmod 755 "$T"
NAT_DATA=$T
NETNS_EXIT_HOOK='nr_teardown'
netns_init
skip() { ok 0 "$1 # SKIP $2"; }

plan 22

# The sites: name, hub index, kind.  Host namespaces are hIDX.
UPNP_WHY=
[ -x "$NATNS_MINIUPNPD" ] || UPNP_WHY="miniupnpd is not installed (packaging/install-deps.sh)"
SITES="A:11 B:12 S:13 C:15"
[ -z "$UPNP_WHY" ] && SITES="U:16 $SITES"
NSITES=$(echo $SITES | wc -w)

netns_hub_new || bail_out "no hub"
netns_hub_attach srv 1 0 || bail_out "no server namespace"
natns_router r11 11 192.168.11 eim || bail_out "no router A"
natns_router r12 12 192.168.12 eim || bail_out "no router B"
natns_router r13 13 192.168.13 symmetric || bail_out "no router S"
natns_cgnat r15 15 192.168.15 || bail_out "no CGNAT site"
[ -z "$UPNP_WHY" ] && { natns_upnp r16 16 192.168.16 upnp || bail_out "no UPnP site"; }
SRV=$(netns_ip 1)

nr_project "$T" || bail_out "could not set up the project"
nr_server "$T" "$SRV" 8080 7001 || bail_out "the server did not start"
for s in $SITES; do
	nr_client "${s%%:*}" "${s#*:}" "http://$SRV:8080/projects/tiny" "$SRV:7001" ||
		bail_out "client ${s%%:*} did not start"
done

# Registration: how the NAT service classified each daemon.
nr_wait 90 nr_all_registered
want_class() { case $1 in U) echo "mapped independent" ;; S) echo "nat dependent" ;; *) echo "nat independent" ;; esac; }
bad=
for s in $SITES; do
	n=${s%%:*}
	got=$(nr_class "$n")
	[ "$got" = "$(want_class "$n")" ] || bad="$bad $n:'$got'"
	diag "site $n (host $(nr_host "$n")): $got; status: $(nr_status_net "$n")"
done
ok $([ -z "$bad" ]; echo $?) "each daemon is classified as its router makes it (${UPNP_WHY:+no U; }U mapped, S nat dependent, the rest nat independent)${bad:+; wrong:$bad}"
if [ -n "$UPNP_WHY" ]; then
	skip "the daemon behind the UPnP IGD maps its port" "$UPNP_WHY"
else
	grep -q "the router maps .* (upnp)" "$T/clU.log"
	ok $? "the daemon behind the UPnP IGD maps its port ($(grep -o 'the router maps .*' "$T/clU.log" | head -1))"
fi
line=$(grep -o "no port mapping on the router .*" "$T/clC.log" | head -1)
ok $([ -n "$line" ]; echo $?) "behind carrier-grade NAT the port mapping fails cleanly and the daemon goes on (${line:-no such line})"

# The rounds: one with every site included; then every daemon stops (the
# UPnP mapping goes), the routers' connection tracking is flushed (only
# with the daemons down: a router that forgets a live connection drops the
# server's answers to it, and the daemon waits out its HTTP timeout), the
# daemons start again, register again, and another round includes them all.
FULL=
nr_wait 150 nr_full_round_after "" && FULL=$NR_FOUND
ok $([ -n "$FULL" ]; echo $?) "a round commits with all $NSITES peers included (round ${FULL:-none}; committed rounds and their peers: $(nr_committed))"
# A second one before the restart: the daemons' later rounds reuse their
# registration.
[ -n "$FULL" ] && nr_wait 90 nr_full_round_after "$FULL" && FULL="$FULL $NR_FOUND"
nr_stop_clients
if [ -n "$UPNP_WHY" ]; then
	skip "the UPnP mapping is removed when the daemon stops" "$UPNP_WHY"
else
	rules=$(netns_exec r16 nft list chain inet filter prerouting_miniupnpd 2>&1)
	case $rules in *dnat*) st=1 ;; *) st=0 ;; esac
	ok $st "the UPnP mapping is removed when the daemon stops"
fi
natns_flush
left=0
for r in $NATNS_ROUTERS; do left=$((left + $(netns_exec "$r" conntrack -C 2>/dev/null || echo 1))); done
V0=$(nr_sql "select current_version from project where name = 'tiny'")
for s in $SITES; do
	nr_daemon "${s%%:*}" "${s#*:}" "$SRV:7001" || bail_out "client ${s%%:*} did not start again"
done
if nr_wait 150 nr_full_round_after "$((V0 - 1))"; then FULL="$FULL $NR_FOUND"; else NR_FOUND=; fi
ok $([ "$(echo $FULL | wc -w)" -ge 3 ]; echo $?) \
	"before and after a restart of every daemon, with the routers' connection tracking flushed ($left entries left), rounds commit with all $NSITES peers (full rounds: ${FULL:-none}; from round $V0 on: $(nr_committed "$V0"))"
if [ -n "$UPNP_WHY" ]; then
	skip "the restarted daemon maps its port again" "$UPNP_WHY"
else
	n=$(grep -c "the router maps .* (upnp)" "$T/clU.log")
	ok $([ "$n" -ge 2 ]; echo $?) "the restarted daemon behind the UPnP IGD maps its port again ($n mappings made)"
fi
# What the volunteer sees (cotrainctl status) and the public host view.
# The daemon notes a round's connections once it hears the round's outcome,
# which may come a moment after the commit the wait above saw.
sym_links() {
	st=$("$top_builddir/client/cotrainctl" --socket "$T/clS/control.sock" status 2>&1 |
		sed -n "s/^ *last round's connections: //p")
	case $st in *relay*) return 0 ;; *) return 1 ;; esac
}
nr_wait 30 sym_links
r=$?
ok $r "cotrainctl status at the symmetric site shows its last round's connections (${st:-none})"
view=$(netns_exec srv curl -fsS "http://$SRV:8080/v1/hosts/$(nr_host S)/network" 2>&1)
case $view in *'"dependent"'*'"relay"'*|*'"relay"'*'"dependent"'*) r=0 ;; *) r=1 ;; esac
ok $r "the server's public view of the symmetric host shows its mapping and its relayed links"
diag "GET /v1/hosts/$(nr_host S)/network: $(echo "$view" | cut -c1-400)"
nr_stop_clients
nfull=$(echo $FULL | wc -w)

# "VERSION HOST GOT WANT" per included peer whose parameters are not the
# server's
forked=$(nr_sql "select r.version, m.host_id, m.params_sha256, r.params_sha256 from round r
  join round_member m using (project_id, version) where r.state = 'committed' and m.included
  and m.outcome = 'ok' and m.params_sha256 <> r.params_sha256" | tr '|' ' ')
forks=$(printf '%s' "$forked" | grep -c .)
held=$(nr_sql "select count(*) from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.params_sha256 = r.params_sha256
    and r.version in ($(echo -1 $FULL | tr ' ' ','))")
ok $([ "$nfull" -ge 1 ] && [ "$forks" = 0 ] && [ "$held" = $((nfull * NSITES)) ]; echo $?) \
	"no fork: every included peer holds the server's parameters ($held of $((nfull * NSITES)) in the full rounds, $forks forks)"
# On a fork, say whose, and what its log and the server's say of that
# round, since the logs go with the test.  (The forks seen here were peers
# that kept a v+1 accepted in an attempt that did not commit: the client
# now checks the work unit's checkpoint, doc/client.md.)
printf '%s\n' "$forked" | while read -r v h got want; do
	[ -n "$v" ] || continue
	n=$(nr_site "$h")
	diag "fork in round $v: site $n (host $h) holds $got, the server $want"
	grep -h "round $v[:,]\|version $v\b" "$T/cl$n.log" "$T/server.log" | tail -40 |
		while IFS= read -r l; do diag "  $l"; done
done

# The aggregators (hi > lo) of the full rounds; S aggregates in no round.
HS=$(nr_host S)
aggs=$(nr_sql "select string_agg(distinct host_id::text, ' ') from round_member m
  join project p on p.id = m.project_id where p.name = 'tiny' and m.version in ($(echo -1 $FULL | tr ' ' ',')) and m.hi > m.lo")
sagg=$(nr_sql "select coalesce(string_agg(m.version::text, ' ' order by m.version), '') from round_member m
  join project p on p.id = m.project_id where p.name = 'tiny' and m.host_id = ${HS:-0} and m.hi > m.lo")
ok $([ -n "$aggs" ] && [ -z "$sagg" ]; echo $?) \
	"the host behind the symmetric NAT (host $HS) aggregates in no round (aggregators: ${aggs:-none}${sagg:+; S aggregated in rounds $sagg})"
naggs=$(echo $aggs | wc -w)
ok $([ "$naggs" = $((NSITES - 1)) ]; echo $?) "every other host aggregates ($naggs aggregators)"

# The rungs, from the dialers' logs, round by round.
nr_rungs "$FULL" >"$T/rungs"
nr_matrix "$T/rungs" "$SITES" | while IFS= read -r l; do diag "$l"; done
exp_pairs=$(( (NSITES - 1) * (NSITES - 1) ))     # every host dials every aggregator but itself
for v in $FULL; do
	n=$(awk -v v="$v" '$1 == v' "$T/rungs" | wc -l)
	[ "$n" = "$exp_pairs" ] || diag "round $v: $n pairs logged, $exp_pairs expected"
done
got_pairs=$(wc -l <"$T/rungs")
ok $([ "$got_pairs" = $((exp_pairs * nfull)) ] && [ "$nfull" -ge 1 ]; echo $?) \
	"every host reached every aggregator ($got_pairs pairs logged in $nfull full rounds, $exp_pairs a round)"

# check DESC FILTER: the pairs matching FILTER (awk on "$4 dialer site, $5
# aggregator site, $6 rung") all used the expected rung, and there is one.
check_rungs() {
	_desc=$1 _sel=$2 _want=$3
	_all=$(awk "$_sel" "$T/rungs" | wc -l)
	_bad=$(awk "($_sel) && \$6 != \"$_want\" { printf \" %s->%s:%s\", \$4, \$5, \$6 }" "$T/rungs")
	ok $([ "$_all" -gt 0 ] && [ -z "$_bad" ]; echo $?) "$_desc: $_want ($_all pairs${_bad:+; otherwise:$_bad})"
}
if [ -n "$UPNP_WHY" ]; then
	skip "the mapped aggregator is dialed directly by everyone" "$UPNP_WHY"
	skip "the mapped host reaches NATed aggregators by hole punching" "$UPNP_WHY"
else
	check_rungs "the mapped aggregator is dialed directly by everyone (S included)" '$5 == "U"' direct
	check_rungs "the mapped host reaches NATed aggregators by hole punching" '$4 == "U"' punch
fi
check_rungs "the two home NATs reach each other by hole punching" \
	'($4 == "A" && $5 == "B") || ($4 == "B" && $5 == "A")' punch
check_rungs "home and carrier-grade NAT reach each other by hole punching (through both layers)" \
	'($4 ~ /^[AB]$/ && $5 == "C") || ($4 == "C" && $5 ~ /^[AB]$/)' punch
check_rungs "the symmetric NAT reaches NATed aggregators through the relay" \
	'$4 == "S" && $5 != "U"' relay

# The other views: the aggregators' logs and the server's round_link.
mism=$(nr_accept_mismatch "$T/rungs")
ok $([ -z "$mism" ] && [ "$got_pairs" -gt 0 ]; echo $?) \
	"each aggregator logged the same plan for each host that reached it${mism:+ (differ:$mism)}"
[ "$(nr_sql "select to_regclass('round_link') is not null")" = t ] ||
	bail_out "table round_link does not exist although the tree's migrations create it"
mism=$(nr_link_mismatch "$T/rungs")
ok $([ -z "$mism" ] && [ "$got_pairs" -gt 0 ]; echo $?) \
	"the server stored each pair's rung in round_link as the dialer logged it${mism:+ (differ:$mism)}"
coverage_exact tiny "after the daemons' restarts, the stream is tiled exactly by the pool, live units and trained ranges"
kill -0 "$NR_SPID" 2>/dev/null
ok $? "the server is still running"
done_testing
