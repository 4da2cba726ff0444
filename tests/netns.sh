# cotrain tests: network namespaces for tests and benchmarks.  Source it:
#   . "$top_srcdir/tests/netns.sh"
#
# Everything lives inside namespaces this run creates (named "$NETNS_PREFIX-NAME",
# the prefix unique per run: cot-PID-RANDOM); nothing is added to the root
# namespace, so runs side by side never collide, and addresses (10.231.0.0/16
# by default) exist only inside them.  A trap deletes it all on every exit path.
#
#   netns_check               0 when namespaces can be made here; else 1 with the
#                             reason in NETNS_WHY (not root, no `ip netns`, no tc)
#   netns_require             netns_check, or SKIP: calls skip_all REASON when
#                             tap.sh is sourced, else prints "SKIP: REASON", exit 0
#   netns_init                pick the prefix, install the cleanup trap (EXIT, and
#                             INT/TERM/HUP exit through it); call once, first
#   netns_new NAME            a namespace with its loopback up
#   netns_name NAME           the real namespace name of NAME (for `ip netns exec`)
#   netns_exec NAME CMD...    run CMD inside NAME
#   netns_bg NAME CMD...      run CMD inside NAME in the background; its pid in
#                             NETNS_LAST_PID, and it is killed at cleanup
#   netns_forget PID...       pids of netns_bg the caller killed and waited for:
#                             cleanup leaves them alone (a reaped pid is free for
#                             the kernel to give another run's process)
#   netns_link A IFA B IFB    a veth pair: IFA inside A, IFB inside B, both up
#   netns_addr NAME IF CIDR   add an address (e.g. 10.231.0.5/16) to IF in NAME
#   netns_shape NAME IF MBIT [DELAY_MS]
#                             shape IF's egress in NAME: htb at MBIT Mbit/s (rate =
#                             ceil), optional netem delay below it.  Shape both
#                             ends of a link for both directions.
#   netns_hub_new             the hub: namespace "hub" holding bridge br0
#   netns_hub_attach NAME IDX MBIT [DELAY_MS]
#                             namespace NAME (made if absent) joined to the hub by
#                             a veth (eth0 inside NAME, pIDX in the hub), address
#                             $NETNS_NET.0.IDX/16 (IDX 1..250), its link shaped
#                             to MBIT both ways (0: unshaped); the address in
#                             NETNS_LAST_IP (call it directly, not in $(...): a
#                             subshell would lose what it records)
#   netns_ip IDX              the address netns_hub_attach gives IDX
#   netns_cleanup             kill what netns_bg started and every process left in
#                             our namespaces, delete them; idempotent.  Runs from
#                             the trap; NETNS_EXIT_HOOK (a command), when set, is
#                             evaluated first, for the caller's own cleanup
#   netns_cleanup_stale       delete namespaces of earlier runs whose shell is gone
#
# Shaping notes: htb handles the GSO super-packets of veth without drops (tbf
# would need a burst larger than 64 KiB).  Pure TCP ACKs go first (their own
# htb class under the same cap, as home routers' shapers do): otherwise a busy
# download on a slow link queues the ACKs of the upload on the same link
# behind seconds of data, and the upload collapses (measured: 50 Mbit/s up
# fell to 30 while the link also carried 42 down).  The bulk leaf is a pfifo
# of 1000 packets, or a bfifo of NETNS_QUEUE_MS milliseconds of the rate
# when set, or netem (1000 packets) with a delay.  This kernel may lack
# fq_codel and sfq.  Rates are per direction: a link shaped to 100 Mbit/s
# carries 100 Mbit/s up and 100 Mbit/s down at once.

NETNS_NET=${NETNS_NET:-10.231}
NETNS_PREFIX=
NETNS_WHY=
_netns_list=
_netns_pids=

netns_check() {
	if [ "$(id -u)" -ne 0 ]; then NETNS_WHY="needs root for network namespaces"; return 1; fi
	if ! command -v ip >/dev/null 2>&1; then NETNS_WHY="ip (iproute2) is not installed"; return 1; fi
	if ! command -v tc >/dev/null 2>&1; then NETNS_WHY="tc (iproute2) is not installed"; return 1; fi
	_probe="cot-probe-$$-${RANDOM:-0}"
	if ! ip netns add "$_probe" 2>/dev/null; then
		NETNS_WHY="ip netns add is not permitted here (no CAP_SYS_ADMIN, or no netns support)"
		return 1
	fi
	ip netns del "$_probe" 2>/dev/null
	return 0
}

netns_require() {
	netns_check && return 0
	if command -v skip_all >/dev/null 2>&1; then skip_all "$NETNS_WHY"; fi
	echo "SKIP: $NETNS_WHY"
	exit 0
}

netns__exit() {
	_st=$?
	trap - EXIT INT TERM HUP
	if [ -n "${NETNS_EXIT_HOOK:-}" ]; then eval "$NETNS_EXIT_HOOK" || :; fi
	netns_cleanup
	exit "$_st"
}

netns_init() {
	NETNS_PREFIX="cot-$$-${RANDOM:-0}"
	trap netns__exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	trap 'exit 129' HUP
}

netns_name() { echo "$NETNS_PREFIX-$1"; }

netns_new() {
	[ -n "$NETNS_PREFIX" ] || { echo "netns_new: call netns_init first" >&2; return 1; }
	ip netns add "$NETNS_PREFIX-$1" || return 1
	_netns_list="$_netns_list $1"
	ip -n "$NETNS_PREFIX-$1" link set lo up
}

netns_exec() {
	_n=$1; shift
	ip netns exec "$NETNS_PREFIX-$_n" "$@"
}

netns_bg() {
	_n=$1; shift
	ip netns exec "$NETNS_PREFIX-$_n" "$@" &
	NETNS_LAST_PID=$!
	_netns_pids="$_netns_pids $NETNS_LAST_PID"
}

netns_forget() {
	_nf=
	for _nfp in $_netns_pids; do case " $* " in *" $_nfp "*) ;; *) _nf="$_nf $_nfp" ;; esac; done
	_netns_pids=$_nf
}

# netns__child PID: PID is a child of this shell not yet reaped (one that
# exited on its own and was reaped is not signalled)
netns__child() { [ "$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)" = "$$" ]; }

netns_link() {
	ip link add "$2" netns "$NETNS_PREFIX-$1" type veth peer name "$4" netns "$NETNS_PREFIX-$3" ||
		return 1
	ip -n "$NETNS_PREFIX-$1" link set "$2" up && ip -n "$NETNS_PREFIX-$3" link set "$4" up
}

netns_addr() {
	ip -n "$NETNS_PREFIX-$1" addr add "$3" dev "$2"
}

netns_shape() {
	_ns="$NETNS_PREFIX-$1"; _if=$2; _rate=$3; _delay=${4:-0}
	# 1:1 caps the link; under it 1:10 (pure ACKs, first) and 1:20 (the rest)
	tc -n "$_ns" qdisc replace dev "$_if" root handle 1: htb default 20 || return 1
	tc -n "$_ns" class add dev "$_if" parent 1: classid 1:1 htb \
		rate "${_rate}mbit" ceil "${_rate}mbit" quantum 60000 || return 1
	_ack=$(awk -v r="$_rate" 'BEGIN {print r / 20}')
	_bulk=$(awk -v r="$_rate" 'BEGIN {print r - r / 20}')
	tc -n "$_ns" class add dev "$_if" parent 1:1 classid 1:10 htb prio 0 \
		rate "${_ack}mbit" ceil "${_rate}mbit" quantum 60000 || return 1
	tc -n "$_ns" class add dev "$_if" parent 1:1 classid 1:20 htb prio 1 \
		rate "${_bulk}mbit" ceil "${_rate}mbit" quantum 60000 || return 1
	# IPv4 TCP, no IP options, total length < 128, flags exactly ACK
	tc -n "$_ns" filter add dev "$_if" parent 1: protocol ip prio 10 u32 \
		match ip protocol 6 0xff match u8 0x05 0x0f at 0 \
		match u16 0x0000 0xff80 at 2 match u8 0x10 0xff at 33 flowid 1:10 || return 1
	tc -n "$_ns" qdisc add dev "$_if" parent 1:10 handle 10: pfifo limit 1000 || return 1
	if [ "$_delay" != 0 ]; then
		tc -n "$_ns" qdisc add dev "$_if" parent 1:20 handle 20: netem delay "${_delay}ms" limit 1000
	elif [ "${NETNS_QUEUE_MS:-0}" = 0 ]; then
		tc -n "$_ns" qdisc add dev "$_if" parent 1:20 handle 20: pfifo limit 1000
	else
		_bytes=$(awk -v r="$_rate" -v ms="$NETNS_QUEUE_MS" \
			'BEGIN {b = int(r * 1e6 / 8 * ms / 1000); print (b < 131072 ? 131072 : b)}')
		tc -n "$_ns" qdisc add dev "$_if" parent 1:20 handle 20: bfifo limit "$_bytes"
	fi
}

netns_hub_new() {
	netns_new hub || return 1
	ip -n "$NETNS_PREFIX-hub" link add br0 type bridge || return 1
	ip -n "$NETNS_PREFIX-hub" link set br0 up
}

netns_ip() { echo "$NETNS_NET.0.$1"; }

netns_hub_attach() {
	_name=$1; _idx=$2; _mbit=$3; _d=${4:-0}
	case " $_netns_list " in *" $_name "*) ;; *) netns_new "$_name" || return 1 ;; esac
	netns_link "$_name" eth0 hub "p$_idx" || return 1
	ip -n "$NETNS_PREFIX-hub" link set "p$_idx" master br0 || return 1
	netns_addr "$_name" eth0 "$(netns_ip "$_idx")/16" || return 1
	if [ "$_mbit" != 0 ]; then
		netns_shape "$_name" eth0 "$_mbit" "$_d" || return 1
		netns_shape hub "p$_idx" "$_mbit" "$_d" || return 1
	fi
	NETNS_LAST_IP=$(netns_ip "$_idx")
}

# Ours: every namespace named with our prefix (also those made in a subshell).
netns__ours() {
	[ -n "$NETNS_PREFIX" ] || return 0
	ip netns list 2>/dev/null | awk -v p="$NETNS_PREFIX-" 'index($1, p) == 1 {print $1}'
}

netns_cleanup() {
	for _p in $_netns_pids; do netns__child "$_p" && kill "$_p" 2>/dev/null; done
	for _ns in $(netns__ours); do
		for _p in $(ip netns pids "$_ns" 2>/dev/null); do kill "$_p" 2>/dev/null; done
	done
	for _p in $_netns_pids; do wait "$_p" 2>/dev/null; done
	for _ns in $(netns__ours); do
		for _p in $(ip netns pids "$_ns" 2>/dev/null); do kill -9 "$_p" 2>/dev/null; done
		ip netns del "$_ns" 2>/dev/null
	done
	_netns_list=
	_netns_pids=
}

netns_cleanup_stale() {
	for _ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cot-[0-9]*-'); do
		_pid=$(echo "$_ns" | cut -d- -f2)
		[ "$_pid" = "$$" ] && continue
		kill -0 "$_pid" 2>/dev/null && continue
		ip netns del "$_ns" 2>/dev/null
	done
}
