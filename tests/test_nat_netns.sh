#!/bin/sh
# cotrain tests: the NAT ladder across emulated home routers, in network
# namespaces (root only; SKIP otherwise).  An "internet" (the hub) holds the
# server and a public host; home sites sit behind routers with nftables NAT:
# two endpoint-independent "home" NATs that drop unsolicited inbound
# silently, a symmetric NAT (a new port per connection), a carrier-grade
# NAT (two layers), and, when Debian's miniupnpd is installed, a home router
# with a UPnP IGD and one with NAT-PMP only, where the client maps its
# listener's port (client/portmap.h), is classified "mapped" and is dialed
# directly; behind the carrier-grade NAT the mapping fails quickly and
# cleanly.  Each host registers (the server classifies it), then
# pairs connect through the brokered ladder with TLS end to end, and the
# test asserts the rung each pair used.  Connection tracking is flushed
# between cases; everything is torn down on exit.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
. "$top_srcdir/tests/netns.sh"
. "$top_srcdir/tests/nat/netns-nat.sh"
natns_require
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/nat-lib.sh"
T=$(mktemp -d /tmp/cotrain-natns-XXXXXX)
NAT_DATA=$T
NETNS_EXIT_HOOK='[ -n "$NAT_KEEP" ] && cp "$T"/*.log "$NAT_KEEP"/ 2>/dev/null; rm -rf "$T"'
netns_init

plan 19
"$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" db migrate >/dev/null ||
	bail_out "could not migrate"
# Hosts are named by their site: 11, 12 home (EIM), 13 symmetric, 15 CGNAT, 20 public,
# 16 UPnP IGD, 17 NAT-PMP only.
nat_seed "11:0 12:0 13:0 15:0 20:0 16:0 17:0"
"$B/tests/nat/nat_driver" mkca "$T" nattest || bail_out "could not make the CA"
chmod 755 "$T"

netns_hub_new || bail_out "no hub"
netns_hub_attach srv 1 0 || bail_out "no server namespace"
netns_hub_attach h20 20 0 || bail_out "no public host"
natns_router r11 11 192.168.11 eim || bail_out "no router 11"
natns_router r12 12 192.168.12 eim || bail_out "no router 12"
natns_router r13 13 192.168.13 symmetric || bail_out "no router 13"
natns_cgnat r15 15 192.168.15 || bail_out "no CGNAT site"
UPNP_WHY=
if [ ! -x "$NATNS_MINIUPNPD" ]; then
	UPNP_WHY="miniupnpd is not installed (packaging/install-deps.sh)"
else
	natns_upnp r16 16 192.168.16 upnp || bail_out "no UPnP site"
	natns_upnp r17 17 192.168.17 natpmp || bail_out "no NAT-PMP site"
fi
SRV=$(netns_ip 1)
netns_bg srv "$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --listen "$SRV" \
	--port 8080 --relay-port 7001 --round-interval 3600 --kdf-iterations 1000 >/dev/null 2>"$T/server.log"
SPID=$NETNS_LAST_PID
n=100; while [ $n -gt 0 ] && ! grep -q 'listening on' "$T/server.log"; do sleep 0.1; n=$((n - 1)); done
grep -q 'listening on' "$T/server.log" || { cat "$T/server.log" >&2; bail_out "the server did not start"; }

drv() { _h=$1; _c=$2; shift 2
	netns_exec "h$_h" "$B/tests/nat/nat_driver" "$_c" --server "$SRV" --nat-port 7001 --host "$_h" \
		--token "$(nat_token "$_h")" --listen-port 40000 --ca-dir "$T" --seconds 40 "$@"; }

# Registration: how the server sees each site.
for hc in "20 public independent" "11 nat independent" "13 nat dependent" "15 nat independent"; do
	set -- $hc
	out=$(drv "$1" observe 2>&1)
	case $out in "SEEN $2 $3 "*) st=0 ;; *) st=1 ;; esac
	ok $st "host $1 is classified $2, mapping $3 ($out)"
	natns_flush
done

# pair DIALER ACCEPTOR RUNGS DESC: connect through the ladder, 2 MiB over TLS.
pair() {
	_d=$1 _a=$2 _want=$3; shift 3
	drv "$_d" observe >/dev/null 2>&1
	_map=
	[ "$_a" = 16 ] && _map="--map 60"
	drv "$_a" accept --peer "$_d" --bytes 2097152 $_map >"$T/acc.out" 2>"$T/acc-$_d-$_a.log" &
	_ap=$!
	sleep 0.3
	_out=$( [ -n "$_map" ] || drv "$_a" observe >/dev/null 2>&1; drv "$_d" dial --peer "$_a" --target "$(netns_ip "$_a"):40000" \
		--bytes 2097152 2>"$T/dial-$_d-$_a.log" | grep '^RUNG')
	wait $_ap; _arc=$?
	_rung=$(echo "$_out" | awk '{print $2}')
	case " $_want " in *" $_rung "*) [ $_arc = 0 ]; _st=$? ;; *) _st=1 ;; esac
	ok $_st "$* ($_out; acceptor: $(grep -h ACCEPTED "$T/acc.out")$(tail -1 "$T/dial-$_d-$_a.log"))"
	echo "$_d $_a $_out" >>"$T/rungs"
	natns_flush
}
pair 11 20 "direct" "a NATed host dials a public host directly"
pair 20 11 "punch" "a public host reaches a NATed host by hole punching (each punch leaves from the port of its own meeting)"
pair 12 11 "punch" "two endpoint-independent home NATs connect directly by hole punching"
pair 13 11 "relay" "a host behind a symmetric NAT reaches a NATed host through the relay"
pair 11 13 "relay" "a NATed host reaches a host behind a symmetric NAT through the relay"
pair 15 11 "punch relay" "a host behind carrier-grade NAT connects (punch through both layers, or the relay)"
pair 12 15 "punch relay" "a NATed host reaches a host behind carrier-grade NAT"

# Port mapping: UPnP IGD (16), NAT-PMP (17), none behind the CGNAT (15).
if [ -n "$UPNP_WHY" ]; then
	for d in "UPnP host is mapped" "dialed directly" "mapping removed" "NAT-PMP mapping" \
		"NAT-PMP host is mapped" "CGNAT mapping fails"; do
		ok 0 "$d # SKIP $UPNP_WHY"
	done
else
	out=$(drv 16 observe --map 60 2>"$T/map16.log")
	case $out in "MAPPED upnp "*"SEEN mapped "*) st=0 ;; *) st=1 ;; esac
	ok $st "behind a UPnP IGD the host maps its port and is classified mapped ($(echo $out))"
	natns_flush
	pair 11 16 "direct" "a NATed host dials the port-mapped host directly"
	rules=$(netns_exec r16 nft list chain inet filter prerouting_miniupnpd 2>&1)
	case $rules in *dnat*) st=1 ;; *) st=0 ;; esac
	ok $st "the mapping is removed when the host exits"
	out=$(drv 17 map --map 60 2>"$T/map17.log")
	case $out in "MAPPED natpmp "*"RENEWED "*) st=0 ;; *) st=1 ;; esac
	ok $st "behind a NAT-PMP gateway the host maps its port and renews it ($(echo $out))"
	out=$(drv 17 observe --map 60 2>>"$T/map17.log")
	case $out in "MAPPED natpmp "*"SEEN mapped "*) st=0 ;; *) st=1 ;; esac
	ok $st "the NAT-PMP host is classified mapped ($(echo $out))"
	natns_flush
	out=$(drv 15 map --map 60 2>"$T/map15.log"); st=$?
	ms=$(echo "$out" | sed -n 's/^NOMAP ms=\([0-9]*\) .*/\1/p')
	case $out in "NOMAP "*"could not map port 40000 on the router"*) [ $st = 1 ] && [ "${ms:-99999}" -lt 5000 ]; st=$? ;; *) st=1 ;; esac
	ok $st "behind carrier-grade NAT the mapping fails in under 5 s with a clear error ($out)"
fi
grep -q "relaying hosts" "$T/server.log"
ok $? "the server relayed the symmetric NAT's pairs"
kill -0 "$SPID"
ok $? "the server is still running"
diag "$(cat "$T/rungs")"
done_testing
