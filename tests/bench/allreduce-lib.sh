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
#                              whose verify said ok), AR_SAMPLES (distinct totals),
#                              AR_START_MS (when the members started, Unix ms),
#                              AR_CPU_S (the members' CPU time, s, all together);
#                              with AR_LINKS_MS set (e.g. 100), the hub's byte
#                              counters every AR_LINKS_MS ms go to FILE.links
#   ar_links FILE MBIT...      from FILE.links and FILE.shares of the last ar_run:
#                              per peer, MB up and down on its link from the
#                              start to the slowest member's end, against the
#                              model (lb_shares: V(1 + (n-2)w) each way); busy:
#                              those bytes over the shaped rate times that time;
#                              and the seconds either way ran below half its
#                              rate.  The hub's counters see veth's GSO packets,
#                              which count their headers once: the MB are about
#                              the payload, not the wire's bytes.  With
#                              AR_TIMELINE=1 also a timeline in bins of
#                              AR_BIN_MS (500) ms, Mbit/s up/down per link
#   ar_trace                   from the members' debug logs of the last ar_run
#                              (run with COTRAIN_LOG=debug): per member, in ms
#                              from the start, when its slice connections were
#                              ready (first..last), its first result part
#                              arrived, its slices were all sent, its last
#                              result part arrived, and it was done

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
	AR_START_MS=$((_now + ${AR_LEAD_MS:-1500}))
	sed -i "s/^start_ms .*/start_ms $AR_START_MS/" "$_f"
	_sampler=
	if [ -n "${AR_LINKS_MS:-}" ]; then
		# the hub's side of each link: pI rx is peer I's upload, tx its download
		_iv=$(awk -v m="$AR_LINKS_MS" 'BEGIN {printf "%.3f", m / 1000}')
		netns_bg hub sh -c "while :; do echo T \$(date +%s%3N); cat /proc/net/dev; sleep $_iv; done" \
			>"$_f.links"
		_sampler=$NETNS_LAST_PID
	fi
	_pids=
	_i=1
	while [ "$_i" -le "$AR_N" ]; do
		rm -f "$AR_DIR/out.$_i"
		netns_bg "m$_i" "$AR_BIN" --plan "$_f" --self $((_i - 1)) --certs "$AR_DIR/certs" \
			>"$AR_DIR/out.$_i" 2>"$AR_DIR/err.$_i"
		_pids="$_pids $NETNS_LAST_PID"
		_i=$((_i + 1))
	done
	for _p in $_pids; do wait "$_p"; netns_forget "$_p"; done
	if [ -n "$_sampler" ]; then
		sleep 0.3   # a sample after the end
		kill "$_sampler" 2>/dev/null
		wait "$_sampler" 2>/dev/null
		netns_forget "$_sampler"
	fi
	cat "$AR_DIR"/out.* >"$_f.out"
	AR_CPU_S=$(awk '$1 == "cpu" {s += $6 + $8} END {printf "%.2f", s / 1000}' "$_f.out")
	AR_WALL_S=$(awk '$1 == "member" {if ($6 > m) m = $6} END {printf "%.3f", m / 1000}' "$_f.out")
	AR_OK=$(grep -c ' checksum ' "$_f.out")
	AR_SUMS=$(awk '$7 == "checksum" {print $8}' "$_f.out" | sort -u | wc -l)
	AR_SAMPLES=$(awk '$7 == "checksum" {print $10}' "$_f.out" | sort -u | tr '\n' ' ')
	AR_VERIFIED=$(grep -c ' verify ok\( \|$\)' "$_f.out")
}

ar_links() {
	_f=$1; shift
	_end=$(awk -v s="$AR_START_MS" -v w="$AR_WALL_S" 'BEGIN {printf "%.0f", s + w * 1000}')
	sed 's/:/: /' "$_f.links" | awk -v start="$AR_START_MS" -v end="$_end" -v rates="$*" \
		-v bin="${AR_BIN_MS:-500}" -v timeline="${AR_TIMELINE:-0}" \
		-v sharesf="$_f.shares" -v len="$(awk '$1 == "len" {print $2}' "$_f")" '
	BEGIN {
		nr = split(rates, R, " ")
		while ((getline l < sharesf) > 0) {
			split(l, f, " ")
			if (f[1] == "peer") W[f[2] + 1] = f[6]
		}
	}
	$1 == "T" { t = $2; next }
	$1 ~ /^p[0-9]+:$/ {
		i = substr($1, 2) + 0
		k = ++ns[i]; ts[i, k] = t; up[i, k] = $2; dn[i, k] = $10
		if (i > n) n = i
	}
	END {
		if (!n) { print "  (no link samples)"; exit }
		secs = (end - start) / 1000
		printf "  link  Mbit/s   up: MB (model)  busy  <half s   down: MB (model)  busy  <half s\n"
		for (i = 1; i <= n; i++) {
			a = 1; b = ns[i]
			for (k = 1; k <= ns[i]; k++) {
				if (ts[i, k] <= start) a = k
				if (ts[i, k] >= end) { b = k; break }
			}
			bu = up[i, b] - up[i, a]; bd = dn[i, b] - dn[i, a]
			lu = ld = 0
			for (k = a + 1; k <= b; k++) {
				dt = (ts[i, k] - ts[i, k - 1]) / 1000
				if (dt <= 0) continue
				half = R[i] * 1e6 / 8 * dt / 2
				if (up[i, k] - up[i, k - 1] < half) lu += dt
				if (dn[i, k] - dn[i, k - 1] < half) ld += dt
			}
			model = len * 4 * (1 + (nr - 2) * W[i]) / 1e6
			cap = R[i] * 1e6 / 8 * secs
			printf "  p%-3d %6s  %7.1f (%5.1f)  %5.3f  %6.2f    %7.1f (%5.1f)  %5.3f  %6.2f\n", i, R[i],
				bu / 1e6, model, bu / cap, lu, bd / 1e6, model, bd / cap, ld
		}
		if (!timeline) exit
		printf "  timeline (s, Mbit/s up/down per link)\n"
		for (i = 1; i <= n; i++)
			for (k = 2; k <= ns[i]; k++) {
				if (ts[i, k] <= start) continue
				bi = int((ts[i, k] - start) / bin)
				U[i, bi] += up[i, k] - up[i, k - 1]; D[i, bi] += dn[i, k] - dn[i, k - 1]
				if (bi > mb) mb = bi
			}
		for (bi = 0; bi <= mb; bi++) {
			printf "  %5.1f", bi * bin / 1000
			for (i = 1; i <= n; i++)
				printf "  %4.0f/%-4.0f", U[i, bi] * 8 / (bin / 1000) / 1e6, D[i, bi] * 8 / (bin / 1000) / 1e6
			printf "\n"
		}
	}'
}

ar_trace() {
	_i=1
	printf "  member  connected (ms)  first result  slices sent  last result   done\n"
	while [ "$_i" -le "$AR_N" ]; do
		sed -n 's/.* allreduce host \([0-9]*\) +\([0-9]*\) ms: \(.*\)/\1 \2 \3/p' "$AR_DIR/err.$_i" |
		awk '{
			h = $1; t = $2
			if ($3 == "slice" && $4 == "connection") { if (c0 == "" || t < c0) c0 = t; if (t > c1) c1 = t }
			else if ($3 == "result" && $4 == "part") {
				if ($5 == 1 && (r0 == "" || t < r0)) r0 = t
				if ($5 == $7 && t > r1) r1 = t
			}
			else if ($3 == "slice" && $4 == "to" && $7 == "sent" && t > s1) s1 = t
			else if ($3 == "done:") d = t
		} END {
			printf "  %6s  %6s..%-6s  %12s  %11s  %11s  %6s\n", h, c0, c1, r0, s1, r1, d
		}'
		_i=$((_i + 1))
	done
}
