# cotrain: running an all-reduce group of allreduce_peer processes, one per
# network namespace, behind one hub (tests/netns.sh).  Sourced by
# tests/bench/bench-allreduce.sh and tests/test_allreduce_netns.sh, after
# tests/netns.sh, netns_require and netns_init.
#
#   ar_setup BIN DIR MBIT...   the hub and one namespace "m<I>" per peer (I from
#                              1), its link shaped to MBIT both ways; a CA and
#                              host certificates in DIR/certs
#   ar_plan FILE LEN COMP VERIFY MBIT...
#                              a plan (see allreduce_peer.c) for the peers of
#                              ar_setup with the shares DeDLOC gives these
#                              bandwidths (pass equal numbers for equal shares);
#                              AR_BOUND_S: lb_shares' bound for those bandwidths
#   ar_run FILE                run every member at once; each one's line in
#                              DIR/out.<I>; sets AR_WALL_S (the slowest member's
#                              wall time, s), AR_OK (members that succeeded),
#                              AR_SUMS (distinct checksums), AR_VERIFIED (members
#                              whose verify said ok), AR_SAMPLES (distinct totals)

AR_PORT=7100

ar_setup() {
	AR_BIN=$1; AR_DIR=$2; shift 2
	AR_N=$#
	netns_hub_new || return 1
	_i=1
	for _b in "$@"; do
		netns_hub_attach "m$_i" "$_i" "$_b" || return 1
		_i=$((_i + 1))
	done
	"$AR_BIN" --make-certs "$AR_DIR/certs" "$AR_N" >/dev/null
}

ar_plan() {
	_f=$1; _len=$2; _comp=$3; _verify=$4; shift 4
	"$AR_BIN" --shares "$_len" "$@" >"$_f.shares" || return 1
	AR_BOUND_S=$(awk '$1 == "bound_s" {print $2}' "$_f.shares")
	{
		echo "len $_len"
		echo "seed 7"
		echo "comp $_comp"
		echo "verify $_verify"
		echo "timeout_s ${AR_TIMEOUT_S:-120}"
		echo "start_ms @START@"
		awk -v net="$NETNS_NET" -v port="$AR_PORT" '$1 == "peer" {
			i = $2 + 1
			printf "member %d %s.0.%d %d %s %s %d\n", i, net, i, port, $8, $10, 100 + i
		}' "$_f.shares"
	} >"$_f"
}

ar_run() {
	_f=$1
	_now=$(date +%s%3N)
	sed -i "s/^start_ms .*/start_ms $((_now + ${AR_LEAD_MS:-1500}))/" "$_f"
	_pids=
	_i=1
	while [ "$_i" -le "$AR_N" ]; do
		rm -f "$AR_DIR/out.$_i"
		netns_bg "m$_i" "$AR_BIN" --plan "$_f" --self $((_i - 1)) --certs "$AR_DIR/certs" \
			>"$AR_DIR/out.$_i" 2>"$AR_DIR/err.$_i"
		_pids="$_pids $NETNS_LAST_PID"
		_i=$((_i + 1))
	done
	for _p in $_pids; do wait "$_p"; done
	cat "$AR_DIR"/out.* >"$_f.out"
	AR_WALL_S=$(awk '$1 == "member" {if ($6 > m) m = $6} END {printf "%.3f", m / 1000}' "$_f.out")
	AR_OK=$(grep -c ' checksum ' "$_f.out")
	AR_SUMS=$(awk '$7 == "checksum" {print $8}' "$_f.out" | sort -u | wc -l)
	AR_SAMPLES=$(awk '$7 == "checksum" {print $10}' "$_f.out" | sort -u | tr '\n' ' ')
	AR_VERIFIED=$(grep -c ' verify ok$' "$_f.out")
}
