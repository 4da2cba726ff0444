#!/bin/sh
# cotrain tests: the chaos run (issue 20).  A real PostgreSQL, cotrain-server
# and six cotrain-client daemons train a tiny model for at least
# CHAOS_VERSIONS (20) versions and CHAOS_FAULTS (21) faults, within
# CHAOS_SECONDS (420), while a seeded schedule (the seed is printed:
# CHAOS_SEED=N replays it) does, repeatedly and overlapping:
#   - kill -9 of a random client, restarted later from its state folder;
#   - kill -9 of the server while the current round is open, closing or
#     averaging (each phase in turn), restarted on the same port;
#   - every database connection of the server terminated at once;
#   - PostgreSQL itself stopped at once (pg_ctl -m immediate: a crash, no
#     checkpoint, WAL replayed at the next start) and started again a few
#     seconds later;
#   - a client suspended (SIGSTOP) for longer than the round's report and
#     averaging timeouts, then resumed;
#   - as root: a client's state folder full (a small tmpfs filled), freed
#     later;
#   - as root with nft: links cut for a few seconds and restored, in turn
#     every client's link to the server (the server's port) and one client's
#     peer port (its averaging listener, which its group's members dial).
# At the end, from the database and the logs (never from counters the code
# keeps about itself): the run reached its target version; the stream is
# tiled exactly (no microbatch trained twice or lost, tests/invariants.sh);
# every included peer's parameters equal the server's for every version;
# credit granted is exactly the FLOPs of the accepted peers' reported
# samples / 4.32e11; no process and no temporary folder is left behind.
# The test runs its own PostgreSQL (initdb and pg_ctl, as the unprivileged
# COTRAIN_PG_USER or postgres when root, as with-pgtmp does), with
# fsync=off (the machine never crashes here, the postmaster does) but
# synchronous_commit on: a commit the server was told of is in the WAL that
# the restart replays.  A client's clock stepped by hours is not part of
# this run (it needs a per-process clock).
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
SEED=${CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
VERSIONS=${CHAOS_VERSIONS:-20}
FAULTS=${CHAOS_FAULTS:-21}
BUDGET_S=${CHAOS_SECONDS:-420}
T=$(mktemp -d /tmp/cotrain-chaos-XXXXXX)
SPID= TMPFS= PGD=
# The run's own PostgreSQL, in a folder of the run user's (the socket path
# must stay short).
PGD=$(mktemp -d /tmp/cotrain-chaospg-XXXXXX)
PGPORT_CHAOS=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u "${COTRAIN_PG_USER:-postgres}" -- "$@"; else "$@"; fi; }
pg_start() {
	as_pg "$PG_BINDIR/pg_ctl" -D "$PGD/data" -l "$PGD/postgres.log" -w -t 60 \
		-o "-k $PGD -p $PGPORT_CHAOS -c listen_addresses= -c max_connections=300 -c fsync=off -c full_page_writes=off" \
		start >/dev/null
}
pg_crash() { as_pg "$PG_BINDIR/pg_ctl" -D "$PGD/data" -m immediate -w stop >/dev/null; }
NFT_TABLE=cotrain_chaos_$$
NFT=
[ "$(id -u)" = 0 ] && command -v nft >/dev/null 2>&1 && nft list tables >/dev/null 2>&1 && NFT=nft
link_cut() { # PORT: drop every TCP segment to or from PORT on this machine
	nft -f - <<NFT
table inet $NFT_TABLE {
	chain out { type filter hook output priority 0; tcp dport $1 drop; tcp sport $1 drop; }
}
NFT
}
link_restore() { nft delete table inet "$NFT_TABLE" 2>/dev/null; }
cleanup() {
	[ -n "$NFT" ] && link_restore
	for i in 1 2 3 4 5 6; do
		eval "p=\${CPID$i:-}"
		[ -n "$p" ] && { kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; }
	done
	[ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	[ -n "$TMPFS" ] && umount "$TMPFS" 2>/dev/null
	[ -f "$PGD/data/postmaster.pid" ] && pg_crash 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T and $PGD"; else rm -rf "$T" "$PGD"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'chaos'"; }
round_state() { sql "select r.state from round r join project p on p.id = r.project_id
  where p.name = 'chaos' and r.version = p.current_version"; }
state_is() { [ "$(round_state)" = "$1" ]; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
# The schedule: a linear congruential generator from the seed.
RNG=$SEED
rand() { # N: R gets a number in [0, N) (a variable: $(rand) would lose RNG)
	RNG=$(( (RNG * 1103515245 + 12345) % 2147483648 ))
	R=$(( RNG / 65536 % $1 ))
}
diag "seed $SEED (CHAOS_SEED=$SEED replays this schedule)"
[ "$(id -u)" != 0 ] || id "${COTRAIN_PG_USER:-postgres}" >/dev/null 2>&1 ||
	skip_all "root, and no user ${COTRAIN_PG_USER:-postgres} to run PostgreSQL as"
[ "$(id -u)" = 0 ] && chown "${COTRAIN_PG_USER:-postgres}" "$PGD"
as_pg "$PG_BINDIR/initdb" -D "$PGD/data" -U cotrain -A trust -E UTF8 --locale=C --no-sync >"$T/initdb.log" 2>&1 &&
	pg_start && "$PG_BINDIR/createdb" -h "$PGD" -p "$PGPORT_CHAOS" -U cotrain cotrain ||
	bail_out "could not start the run's PostgreSQL: $(tail -3 "$T/initdb.log" "$PGD/postgres.log" 2>/dev/null)"
COTRAIN_DB="host=$PGD port=$PGPORT_CHAOS dbname=cotrain user=cotrain connect_timeout=10"
PGHOST=$PGD PGPORT=$PGPORT_CHAOS PGDATABASE=cotrain PGUSER=cotrain
export COTRAIN_DB PGHOST PGPORT PGDATABASE PGUSER

plan 7

mkdir -p "$T/text"
head -c 80000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<JSON
{"name": "chaos", "title": "chaos", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 1024, "microbatch_size": 2, "seed": 5, "work_unit_seconds": 5}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/project.json" >/dev/null || bail_out "could not set up the project"
# The server's port and each client's peer port, free ones.
set -- $(/usr/bin/python3 -c '
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
PORT=$1
shift
for i in 1 2 3 4 5 6; do eval "PEERPORT$i=\$$i"; done

start_server() {
	"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port "$PORT" --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --round-report-timeout 6 --round-average-timeout 15 \
		--log-level info 2>>"$T/server.log" &
	SPID=$!
	wait_for 30 grep -qs "listening on http://127.0.0.1:$PORT" "$T/server.log"
}
start_client() { # N: (re)start client N from its state folder
	mkdir -p "$T/cl$1"
	"$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=2 \
		--set peer_port="$(eval echo \$PEERPORT$1)" 2>>"$T/client$1.log" &
	eval "CPID$1=$!"
}
start_server || bail_out "the server did not start"
for i in 1 2 3 4 5 6; do
	if [ $i = 6 ] && [ "$(id -u)" = 0 ] && mkdir -p "$T/cl6" && mount -t tmpfs -o size=16m tmpfs "$T/cl6"; then
		TMPFS="$T/cl6"
	fi
	start_client $i
	key=$(echo secretpassword | admin user create --password-stdin "c$i@example.org" "client $i" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$i/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$i/control.sock" \
			attach "http://127.0.0.1:$PORT/projects/chaos" --key "$key" >/dev/null ||
		bail_out "client $i did not start"
done
wait_for 120 version_at_least 1 || bail_out "no round committed before the faults"

# The schedule.
phases="open closing averaging"
n_kill=0 n_srv=0 n_db=0 n_stop=0 n_full=0 n_pg=0 n_cut=0
start=$(date +%s)
down= stopped= full= cut=
n_faults=0
rand 7
first=$R
while { [ "$(version)" -lt "$VERSIONS" ] || [ $n_faults -lt "$FAULTS" ]; } &&
	[ $(( $(date +%s) - start )) -lt "$BUDGET_S" ]; do
	n_faults=$((n_faults + 1))
	rand 4
	sleep "$(( 2 + R ))"
	# What was done before ends: a killed client restarts, a stopped one
	# resumes, a full disk is freed.
	for i in $down; do start_client "$i"; done
	down=
	for i in $stopped; do eval "kill -CONT \$CPID$i"; done
	stopped=
	[ -n "$full" ] && rm -f "$TMPFS/fill" && full=
	[ -n "$cut" ] && link_restore && cut=
	# Every kind in turn (from a random one), so each happens FAULTS / 7
	# times; the moments and the victims are random.
	kind=$(( (n_faults - 1 + first) % 7 ))
	rand 6
	i=$(( 1 + R ))
	case $kind in
	0)
		eval "kill -9 \$CPID$i; wait \$CPID$i 2>/dev/null"
		down=$i n_kill=$((n_kill + 1))
		diag "$(date +%T) client $i killed (-9)" ;;
	1)
		ph=$(echo $phases | cut -d' ' -f$(( n_srv % 3 + 1 )))
		wait_for 20 state_is "$ph"
		kill -9 "$SPID"; wait "$SPID" 2>/dev/null
		n_srv=$((n_srv + 1))
		diag "$(date +%T) server killed (-9) with the round $(round_state)"
		rand 3
		sleep "$R"
		start_server || bail_out "the server did not restart" ;;
	2)
		sql "select count(pg_terminate_backend(pid)) from pg_stat_activity
		  where datname = current_database() and pid <> pg_backend_pid()" >/dev/null
		n_db=$((n_db + 1))
		diag "$(date +%T) every database connection terminated" ;;
	3)
		eval "kill -STOP \$CPID$i"
		n_stop=$((n_stop + 1))
		diag "$(date +%T) client $i suspended for longer than the round's timeouts"
		sleep 22
		stopped=$i ;;
	4)
		if [ -n "$TMPFS" ]; then
			dd if=/dev/zero of="$TMPFS/fill" bs=64k 2>/dev/null # until no space is left
			full=1 n_full=$((n_full + 1))
			diag "$(date +%T) client 6's state folder full"
		fi ;;
	5)
		pg_crash || bail_out "could not stop PostgreSQL"
		n_pg=$((n_pg + 1))
		rand 4
		diag "$(date +%T) PostgreSQL stopped at once (immediate), down for $((2 + R)) s"
		sleep "$((2 + R))"
		pg_start || bail_out "PostgreSQL did not start again: $(tail -3 "$PGD/postgres.log")" ;;
	6)
		if [ -n "$NFT" ]; then
			if [ $((n_cut % 2)) = 0 ]; then
				link_cut "$PORT" && cut=1 && diag "$(date +%T) every client's link to the server cut"
			else
				eval "link_cut \$PEERPORT$i" && cut=1 && diag "$(date +%T) client $i's peer port cut"
			fi
			[ -n "$cut" ] && n_cut=$((n_cut + 1))
		fi ;;
	esac
done
for i in $down; do start_client "$i"; done
for i in $stopped; do eval "kill -CONT \$CPID$i"; done
[ -n "$full" ] && rm -f "$TMPFS/fill"
[ -n "$cut" ] && link_restore
V=$(version)
ok $([ "$V" -ge "$VERSIONS" ]; echo $?) \
	"the run reached version $VERSIONS (version $V in $(( $(date +%s) - start )) s) through $n_kill client kills, $n_srv server kills, $n_db database disconnections, $n_pg PostgreSQL crashes, $n_stop suspensions, $n_full full disks, $n_cut link cuts$([ -n "$NFT" ] || echo " (not root with nft: none)")"
ok $([ "$n_kill" -ge 2 ] && [ "$n_srv" -ge 3 ] && [ "$n_db" -ge 2 ] && [ "$n_pg" -ge 2 ] && [ "$n_stop" -ge 2 ] &&
	{ [ -z "$NFT" ] || [ "$n_cut" -ge 2 ]; }; echo $?) \
	"the schedule did every kind of fault at least twice, the server kill in each phase (seed $SEED)"
# Every client stops on SIGTERM, whatever state the faults left it in (a
# full disk held one spinning once, never to stop).
stuck=
gone() { _s=$(ps -o stat= -p "$1" 2>/dev/null); [ -z "$_s" ] || [ "${_s#Z}" != "$_s" ]; } # exited (a zombie until waited)
for i in 1 2 3 4 5 6; do eval "p=\$CPID$i"; kill "$p" 2>/dev/null; done
for i in 1 2 3 4 5 6; do
	eval "p=\$CPID$i"
	wait_for 30 gone "$p" || { stuck="$stuck $i"; kill -9 "$p" 2>/dev/null; }
	wait "$p" 2>/dev/null
done
kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
SPID=
is "${stuck:-none}" none "every client stops within 30 s of SIGTERM"

coverage_exact chaos "after the chaos run: every microbatch trained at most once per committed version, none lost"
forks=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where r.state = 'committed' and m.included and m.params_sha256 is distinct from r.params_sha256")
accepted=$(sql "select count(*) from round_member m join round r using (project_id, version)
  where r.state = 'committed' and m.accepted")
ok $([ "$forks" = 0 ] && [ "$accepted" -ge 1 ]; echo $?) \
	"every included peer held the server's parameters for every committed version ($accepted accepted, $forks differ)"
FPS=$(awk 'BEGIN { L = 2; T = 16; C = 64; F = 256; V = 256
  printf "%.17g", 3 * (L * (2 * T * (4 * C * C + 2 * C * F) + 2 * C * T * (T + 1)) + 2 * T * C * V) }')
bad_credit=$(credit_wrong "$FPS" 2)
ngranted=$(sql "select count(*) from credit_grant where kind = 'round' and status = 'granted'")
ok $([ "$ngranted" -ge 1 ] && [ -z "$bad_credit" ]; echo $?) \
	"credit granted ($ngranted grants) is exactly the accepted samples' FLOPs / 4.32e11${bad_credit:+ ($bad_credit)}"
left=$(pgrep -f "$T/" | wc -l)
is "$left" 0 "no cotrain process of the run is left"
