# cotrain tests: home routers for tests/netns.sh (source that first).
#
#   natns_filter NS WAN     in NS, forward only what LAN hosts started, and drop
#                           (silently) anything unsolicited arriving on WAN,
#                           for the router itself too
#   natns_router NAME IDX LAN MODE
#                           router NAME on the hub at IDX (its public address
#                           netns_ip IDX) with NAT (MODE "eim": masquerade,
#                           which keeps a host's port for every destination,
#                           endpoint-independent; "symmetric": masquerade
#                           --random-fully, a new port per connection) in front
#                           of host namespace "hIDX" at LAN.2/24 (LAN: three
#                           octets, e.g. 192.168.11)
#   natns_cgnat NAME IDX LAN
#                           carrier-grade NAT: router NAME (on the hub at IDX)
#                           NATs 100.64.IDX.0/24, where home router NAME-home
#                           NATs LAN in front of host hIDX: two layers of NAT
#   natns_flush             flush connection tracking in every router
#   natns_host NAME         the host namespace behind router NAME's site
NATNS_ROUTERS=

natns_filter() {
	netns_exec "$1" nft -f - <<NFT
table inet cotfilter {
	chain cot_forward {
		type filter hook forward priority 0; policy drop;
		ct state established,related accept
		iifname != "$2" accept
	}
	chain cot_input {
		type filter hook input priority 0; policy accept;
		iifname "$2" ct state new drop
	}
}
NFT
}

natns__nat() {
	_mode=
	[ "$3" = symmetric ] && _mode=" random,fully-random"
	netns_exec "$1" sysctl -qw net.ipv4.ip_forward=1 || return 1
	netns_exec "$1" nft -f - <<NFT || return 1
table ip cotnat {
	chain cot_post {
		type nat hook postrouting priority 100;
		oifname "$2" masquerade$_mode
	}
}
NFT
	natns_filter "$1" "$2"
}

natns_router() {
	_r=$1 _i=$2 _lan=$3 _m=$4
	netns_hub_attach "$_r" "$_i" 0 || return 1
	netns_new "h$_i" || return 1
	netns_link "$_r" lan0 "h$_i" eth0 || return 1
	netns_addr "$_r" lan0 "$_lan.1/24" && netns_addr "h$_i" eth0 "$_lan.2/24" || return 1
	ip -n "$NETNS_PREFIX-h$_i" route add default via "$_lan.1" || return 1
	natns__nat "$_r" eth0 "$_m" || return 1
	NATNS_ROUTERS="$NATNS_ROUTERS $_r"
}

natns_cgnat() {
	_r=$1 _i=$2 _lan=$3
	netns_hub_attach "$_r" "$_i" 0 || return 1
	netns_new "$_r-home" && netns_new "h$_i" || return 1
	netns_link "$_r" in0 "$_r-home" eth0 || return 1
	netns_addr "$_r" in0 "100.64.$_i.1/24" && netns_addr "$_r-home" eth0 "100.64.$_i.2/24" || return 1
	ip -n "$NETNS_PREFIX-$_r-home" route add default via "100.64.$_i.1" || return 1
	netns_link "$_r-home" lan0 "h$_i" eth0 || return 1
	netns_addr "$_r-home" lan0 "$_lan.1/24" && netns_addr "h$_i" eth0 "$_lan.2/24" || return 1
	ip -n "$NETNS_PREFIX-h$_i" route add default via "$_lan.1" || return 1
	natns__nat "$_r" eth0 eim && natns__nat "$_r-home" eth0 eim || return 1
	NATNS_ROUTERS="$NATNS_ROUTERS $_r $_r-home"
}

natns_flush() {
	for _r in $NATNS_ROUTERS; do netns_exec "$_r" conntrack -F >/dev/null 2>&1; done
	return 0
}
