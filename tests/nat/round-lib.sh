# cotrain tests: a collaborative training run across the namespace sites of
# tests/nat/netns-nat.sh (tests/test_nat_round_netns.sh).  Source it after
# tap.sh, netns.sh and netns-nat.sh; needs $top_builddir, $PG_BINDIR,
# $COTRAIN_DB (tests/with-pgtmp) and $T (the run's temp dir).
#
#   nr_project T            project "tiny" (a tiny model, short work units, a
#                           global batch every site joins), its dataset;
#                           NR_MODEL (JSON), NR_TARGET and NR_WU_MAX change them
#   nr_server T ADDR PORT RELAY
#                           cotrain-server in namespace "srv": HTTP on
#                           ADDR:PORT, the NAT service on RELAY and RELAY+1,
#                           one round a second, groups of up to 16, a report
#                           timeout of NR_REPORT_TIMEOUT s (8); its pid in
#                           NR_SPID, its log T/server.log
#   nr_client NAME IDX URL NATSVC
#                           a cotrain-client daemon in namespace hIDX (log
#                           T/clNAME.log, listener port 40000), attached to
#                           URL with an account of its own
#   nr_daemon NAME IDX NATSVC
#                           (re)start the daemon of site NAME (attached or not),
#                           logging at NR_LOG_LEVEL (info; debug traces the
#                           all-reduce); its pid in NR_PID_NAME
#   nr_restart NAME IDX NATSVC
#                           stop the daemon of site NAME and start it again
#   nr_host NAME            the daemon's host id
#   nr_site HOST            the site name of a host id
#   nr_class NAME           "CLASS MAPPING" as the NAT service last told NAME
#   nr_all_registered       every daemon was classified
#   nr_committed [V]        "VERSION:INCLUDED ..." of the committed rounds (from V)
#   nr_full_round_after V   a committed round after version V (any when V is
#                           empty) that included every site: in NR_FOUND
#   nr_rungs "V..."         one line per pair each dialer logged in rounds V
#                           (the last attempt of a round that ran again):
#                           "V DIALER AGGREGATOR DSITE ASITE RUNG MS"
#   nr_matrix RUNGS SITES   the rung matrix (dialers by aggregators), lines
#   nr_accept_mismatch RUNGS, nr_link_mismatch RUNGS
#                           the pairs where the aggregator's log, or the
#                           server's round_link, names another rung (empty:
#                           none)
#   nr_allreduce_s "V..."   per round V, "V S": the slowest member's all-reduce
#                           time (s) as the daemons logged it
#   nr_renat ROUTER MODE    switch ROUTER's NAT to MODE (eim, symmetric)
#   nr_stop_clients         stop the daemons (they remove their mappings)
#   nr_teardown             NETNS_EXIT_HOOK: keep logs in $NAT_KEEP, rm T
NR_SITES=
NR_PIDS=
NR_TINY='{"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256}'
NR_SPID=

nr_sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
nr_admin() { "$top_builddir/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
nr_wait() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }

nr_project() {
	mkdir -p "$1/text"
	head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$1/text/a.txt"
	# A global batch that takes the sites some seconds (about 4096 microbatches
	# at 1-2 ms each, in units of 128): every site asks for work while the
	# round is open, and each reports a handful of units.
	cat >"$1/project.json" <<JSON
{"name": "tiny", "title": "tiny rounds across NATs", "dataset": "tiny",
 "model": ${NR_MODEL:-$NR_TINY},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": ${NR_TARGET:-8192}, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 10}
JSON
	nr_admin db migrate >/dev/null && nr_admin dataset import --shard-tokens 16384 tiny "$1/text" >/dev/null &&
		nr_admin project create "$1/project.json" >"$1/project.out"
}

nr_server() {
	netns_bg srv "$top_builddir/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$1/srv" --listen "$2" \
		--port "$3" --relay-port "$4" --wu-max "${NR_WU_MAX:-128}" --reap-interval 1 --kdf-iterations 1000 \
		--round-interval 1 --round-report-timeout "${NR_REPORT_TIMEOUT:-8}" --round-average-timeout 40 \
		--round-max-group 16 --log-level info >/dev/null 2>"$1/server.log"
	NR_SPID=$NETNS_LAST_PID
	nr_wait 20 grep -qs 'listening on' "$1/server.log"
}

# nr_daemon NAME IDX NATSVC: the daemon of site NAME in namespace hIDX.
nr_daemon() {
	mkdir -p "$T/cl$1"
	netns_bg "h$2" "$top_builddir/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set log_level="${NR_LOG_LEVEL:-info}" --set spot_interval=2 \
		--set peer_port=40000 --set nat_service="$3" 2>>"$T/cl$1.log"
	NR_PIDS="$NR_PIDS $NETNS_LAST_PID"
	eval "NR_PID_$1=\$NETNS_LAST_PID"
	nr_wait 30 test -S "$T/cl$1/control.sock"
}

nr_restart() {
	eval "_p=\$NR_PID_$1"
	kill "$_p" 2>/dev/null
	wait "$_p" 2>/dev/null
	NR_PIDS=$(echo " $NR_PIDS " | sed "s/ $_p / /")
	netns_forget "$_p"
	nr_daemon "$@"
}

nr_client() {
	_nm=$1 _ix=$2 _url=$3 _nat=$4
	NR_SITES="$NR_SITES $_nm"
	nr_daemon "$_nm" "$_ix" "$_nat" || return 1
	_key=$(echo secretpassword | nr_admin user create --password-stdin "$_nm@example.org" "site $_nm" |
		sed -n 's/^account key: //p')
	"$top_builddir/client/cotrainctl" --socket "$T/cl$_nm/control.sock" attach "$_url" --key "$_key" >/dev/null
}

nr_host() { grep -o '"host_id": *[0-9]*' "$T/cl$1/state.json" 2>/dev/null | grep -o '[0-9]*$' | head -1; }

nr_site() {
	for _s in $NR_SITES; do [ "$(nr_host "$_s")" = "$1" ] && { echo "$_s"; return; }; done
	echo "?$1"
}

nr_class() {
	sed -n 's/.*the NAT service sees this host at [^ ]*: \([a-z]*\), mapping \([a-z]*\).*/\1 \2/p' \
		"$T/cl$1.log" | tail -1
}

nr_status_net() {
	"$top_builddir/client/cotrainctl" --socket "$T/cl$1/control.sock" status 2>/dev/null |
		sed -n 's/^ *network: //p' | head -1
}

nr_all_registered() {
	for _s in $NR_SITES; do [ -n "$(nr_class "$_s")" ] || return 1; done
}

nr_committed() {
	nr_sql "select coalesce(string_agg(r.version || ':' || (select count(*) from round_member m
	    where m.project_id = r.project_id and m.version = r.version and m.included), ' ' order by r.version), 'none')
	  from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.state = 'committed'
	    and r.version >= ${1:-0}"
}

nr_full_round_after() {
	_n=$(echo $NR_SITES | wc -w)
	NR_FOUND=$(nr_sql "select min(r.version) from round r join project p on p.id = r.project_id
	  where p.name = 'tiny' and r.state = 'committed' and r.version > ${1:--1}
	    and (select count(*) from round_member m where m.project_id = r.project_id
	           and m.version = r.version and m.included) = $_n")
	[ -n "$NR_FOUND" ]
}

nr_rungs() {
	for _s in $NR_SITES; do
		for _v in $1; do
			# a round that failed and ran again logs its pairs again: the
			# last line per aggregator is the attempt that committed
			sed -n "s/.*project tiny: round $_v: reached host \([0-9]*\) by \([a-z]*\) in \([0-9.]*\) ms.*/\1 \2 \3/p" \
				"$T/cl$_s.log" |
				awk '!($1 in l) { o[++n] = $1 } { l[$1] = $0 } END { for (i = 1; i <= n; i++) print l[o[i]] }' |
				while read -r _a _r _ms; do
					echo "$_v $(nr_host "$_s") $_a $_s $(nr_site "$_a") $_r $_ms"
				done
		done
	done
}

nr_matrix() {
	awk -v sites="$2" '
	BEGIN { n = split(sites, s, " "); for (i = 1; i <= n; i++) { split(s[i], x, ":"); name[i] = x[1] } }
	{ k = $4 SUBSEP $5; if (!(k in r)) r[k] = $6; else if (index("/" r[k] "/", "/" $6 "/") == 0) r[k] = r[k] "/" $6
	  ms[$6] += $7; cnt[$6]++ }
	END {
		line = sprintf("%-14s", "dialer \\ agg"); for (j = 1; j <= n; j++) line = line sprintf(" %-7s", name[j]); print line
		for (i = 1; i <= n; i++) {
			line = sprintf("%-14s", name[i])
			for (j = 1; j <= n; j++) { k = name[i] SUBSEP name[j]; line = line sprintf(" %-7s", i == j ? "." : (k in r ? r[k] : "-")) }
			print line
		}
		for (g in cnt) printf "%s: %d connections, mean connect %.0f ms\n", g, cnt[g], ms[g] / cnt[g]
	}' "$1"
}

nr_accept_mismatch() {
	while read -r _v _d _a _ds _as _r _ms; do
		_p=$(sed -n "s/.*project tiny: round $_v: host $_d reached us by \([a-z]*\).*/\1/p" "$T/cl$_as.log" | tail -1)
		[ "$_p" = "$_r" ] || printf ' %s->%s:%s/%s' "$_ds" "$_as" "$_r" "${_p:-none}"
	done <"$1"
}

nr_link_mismatch() {
	while read -r _v _d _a _ds _as _r _ms; do
		_p=$(nr_sql "select rung from round_link l join project p on p.id = l.project_id
		  where p.name = 'tiny' and l.version = $_v and l.host_id = $_d and l.peer_id = $_a")
		[ "$_p" = "$_r" ] || printf ' %s->%s:%s/%s' "$_ds" "$_as" "$_r" "${_p:-none}"
	done <"$1"
}

nr_allreduce_s() {
	for _v in $1; do
		cat "$T"/cl*.log | sed -n "s/.*project tiny: round $_v: averaged .* in \([0-9.]*\) s;.*/\1/p" |
			sort -g | tail -1 | sed "s/^/$_v /"
	done
}

nr_renat() {
	_mode=
	[ "$2" = symmetric ] && _mode=" random,fully-random"
	netns_exec "$1" nft -f - <<NFT
flush table ip cotnat
table ip cotnat {
	chain cot_post {
		oifname "eth0" masquerade$_mode
	}
}
NFT
}

nr_stop_clients() {
	for _p in $NR_PIDS; do kill "$_p" 2>/dev/null; done
	for _p in $NR_PIDS; do wait "$_p" 2>/dev/null; done
	for _p in $NR_PIDS; do netns_forget "$_p"; done
	NR_PIDS=
}

nr_teardown() {
	if [ -n "${NAT_KEEP:-}" ]; then
		mkdir -p "$NAT_KEEP" && cp "$T"/*.log "$NAT_KEEP"/ 2>/dev/null
	fi
	rm -rf "$T"
}
