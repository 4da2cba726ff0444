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
#   natns_upnp NAME IDX LAN PROTO
#                           a home router like natns_router's "eim" that also
#                           runs Debian's miniupnpd (nftables backend) on its
#                           LAN side: PROTO "upnp" (UPnP IGD and NAT-PMP) or
#                           "natpmp" (NAT-PMP only).  Its forward filter lets
#                           in what a mapping forwards (ct status dnat).  Needs
#                           $NAT_DATA (config, leases, log NAME-miniupnpd.log)
#   natns_household NAME IDX LAN
#                           a second LAN port on natns_router NAME with host
#                           namespace "hIDX" at LAN.2/24 behind it: two hosts
#                           of one household, which the router forwards LAN
#                           to LAN but does not hairpin (masquerade only)
#   natns_dualwan NAME IDX SERVER
#                           make natns_router NAME "dual-WAN": a second public
#                           address (netns_ip IDX); flows to SERVER leave
#                           from the first, every other flow from the second
#                           (both keep the port).  The server then sees an
#                           endpoint-independent NAT whose punches cannot work
#   natns_flush             flush connection tracking in every router
#   natns_host NAME         the host namespace behind router NAME's site
#   natns_require           netns_require, and skip_all without nft or conntrack
NATNS_ROUTERS=

natns_require() {
	netns_require
	for _c in nft conntrack; do
		command -v $_c >/dev/null 2>&1 || skip_all "$_c is not installed (packaging/install-deps.sh)"
	done
}

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

natns_household() {
	_r=$1 _i=$2 _lan=$3
	netns_new "h$_i" && netns_link "$_r" "lan$_i" "h$_i" eth0 || return 1
	netns_addr "$_r" "lan$_i" "$_lan.1/24" && netns_addr "h$_i" eth0 "$_lan.2/24" || return 1
	ip -n "$NETNS_PREFIX-h$_i" route add default via "$_lan.1"
}

natns_dualwan() {
	_r=$1 _w2=$(netns_ip "$2")
	netns_addr "$_r" eth0 "$_w2/16" || return 1
	netns_exec "$_r" nft -f - <<NFT
flush table ip cotnat
table ip cotnat {
	chain cot_post {
		oifname "eth0" ip daddr $3 masquerade
		oifname "eth0" snat to $_w2
	}
}
NFT
}

# miniupnpd 2.3.1 refuses a private external address (the hub's 10.231/16),
# and ext_allow_private_ipv4 came later: the router declares a public-looking
# stand-in (11.0.0.IDX), which only the UPnP answers carry.  Its DNAT rules
# match on the WAN interface, so the server's dial-back to the router's hub
# address is forwarded all the same.
NATNS_MINIUPNPD=${NATNS_MINIUPNPD:-/usr/sbin/miniupnpd}

natns_upnp() {
	_r=$1 _i=$2 _lan=$3 _p=$4
	natns_router "$_r" "$_i" "$_lan" eim || return 1
	netns_exec "$_r" nft insert rule inet cotfilter cot_forward ct status dnat accept || return 1
	# The table and chains miniupnpd's nftables backend fills (its defaults).
	netns_exec "$_r" nft -f - <<NFT || return 1
table inet filter {
	chain forward { type filter hook forward priority 10; policy accept; jump miniupnpd; }
	chain miniupnpd { }
	chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }
	chain postrouting { type nat hook postrouting priority 90; policy accept; jump postrouting_miniupnpd; }
	chain prerouting_miniupnpd { }
	chain postrouting_miniupnpd { }
}
NFT
	_upnp=yes
	[ "$_p" = natpmp ] && _upnp=no
	cat >"$NAT_DATA/$_r-miniupnpd.conf" <<CONF || return 1
ext_ifname=eth0
ext_ip=11.0.0.$_i
listening_ip=lan0
enable_upnp=$_upnp
enable_natpmp=yes
secure_mode=yes
system_uptime=yes
min_lifetime=30
uuid=67053115-2b9c-4e27-bc58-0738131d96$(printf %02d $((_i % 100)))
lease_file=$NAT_DATA/$_r-miniupnpd.leases
CONF
	netns_bg "$_r" "$NATNS_MINIUPNPD" -d -f "$NAT_DATA/$_r-miniupnpd.conf" \
		-P "$NAT_DATA/$_r-miniupnpd.pid" >"$NAT_DATA/$_r-miniupnpd.log" 2>&1
	_n=50
	while [ $_n -gt 0 ] && ! grep -q 'HTTP listening\|Listening for NAT-PMP' "$NAT_DATA/$_r-miniupnpd.log"; do
		sleep 0.1; _n=$((_n - 1))
	done
	[ $_n -gt 0 ] || { cat "$NAT_DATA/$_r-miniupnpd.log" >&2; return 1; }
}

natns_flush() {
	for _r in $NATNS_ROUTERS; do netns_exec "$_r" conntrack -F >/dev/null 2>&1; done
	return 0
}
