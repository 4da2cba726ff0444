#!/bin/sh
# cotrain tests: the chaos run (issue 20).  A real PostgreSQL, cotrain-server
# and six cotrain-client daemons train a tiny model for at least
# CHAOS_VERSIONS (20) versions and CHAOS_FAULTS (20) faults, within
# CHAOS_SECONDS (420), while a seeded schedule (the seed is printed:
# CHAOS_SEED=N replays it) does, repeatedly and overlapping:
#   - kill -9 of a random client, restarted later from its state folder;
#   - kill -9 of the server in each phase of the current round in turn
#     (open; closing, reports still due; planning, every report in and no
#     plan stored; averaging, no server step yet; commit, the server's
#     version v+1 stored and the peers' outcomes awaited, or, averaging
#     between the peers (the default for three peers or more), every
#     included peer's outcome in and its v+1 awaited; waited for by
#     polling the database every 5 ms, and counted by the phase the
#     database holds once the server is dead), restarted on the same port;
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
#     peer port (its averaging listener, which its group's members dial);
#   - with libfaketime (Debian's libfaketime): client 5's realtime clock
#     stepped to 3 hours ahead, then to 3 hours behind, and so on, held
#     until the next step (its monotonic clock is left alone, as an NTP
#     step leaves it); the client must see the steps (its log says so)
#     and keep working.
# Faults are drawn from a cycle of 10 (the server kill 3 times in it), so
# the 20 faults do every other kind twice and kill the server in each
# phase.
# At the end, from the database and the logs (never from counters the code
# keeps about itself): the run reached its target version; the stream is
# tiled exactly (no microbatch trained twice or lost, tests/invariants.sh);
# every included peer's parameters equal the server's for every version;
# credit granted is exactly the FLOPs of the accepted peers' reported
# samples / 4.32e11; no process and no temporary folder is left behind
# (the daemons' TMPDIR is the run's own, empty at the end); the server
# that survived the last restart holds, once every client has stopped, no
# file of its data folder open and no client connection; PostgreSQL, after
# all its crashes, runs one postmaster for the run's cluster, and none of
# its processes is left once it is stopped.
# The test runs its own PostgreSQL (initdb and pg_ctl, as the unprivileged
# COTRAIN_PG_USER or postgres when root, as with-pgtmp does), with
# fsync=off (the machine never crashes here, the postmaster does) but
# synchronous_commit on: a commit the server was told of is in the WAL that
# the restart replays.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
SEED=${CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
VERSIONS=${CHAOS_VERSIONS:-20}
FAULTS=${CHAOS_FAULTS:-20}
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
# Client 5 runs under libfaketime (FAKETIME_LIB, found by configure): its
# realtime clock is offset by what $T/clock5 says (re-read every second),
# its monotonic clock is not.
FAKETIME_LIB=${FAKETIME_LIB:-}
[ -z "$FAKETIME_LIB" ] || [ -f "$FAKETIME_LIB" ] || FAKETIME_LIB=
clock_set() { echo "$1" >"$T/clock5.new" && mv "$T/clock5.new" "$T/clock5"; }
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
		[ -n "$p" ] && { kill_ours -CONT "$p"; kill_ours -9 "$p"; wait "$p" 2>/dev/null; }
	done
	[ -n "$SPID" ] && kill_ours -9 "$SPID" && wait "$SPID" 2>/dev/null
	# A process of the killed client can hold the tmpfs for a moment: try
	# again, then detach it lazily rather than leave it mounted.
	if [ -n "$TMPFS" ]; then
		for _t in 1 2 3 4 5 6 7 8 9 10; do umount "$TMPFS" 2>/dev/null && break; sleep 0.2; done
		mountpoint -q "$TMPFS" && umount -l "$TMPFS" 2>/dev/null
	fi
	[ -f "$PGD/data/postmaster.pid" ] && pg_crash 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T and $PGD"; else rm -rf "$T" "$PGD"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'chaos'"; }
# The current round's phase, finer than its state: a closing round whose
# every work unit is reported (or dropped) is being planned; an averaging
# round holding the server's version v+1 awaits the outcomes to commit;
# between the peers, one holding every group's mean and every included
# peer's ok awaits a peer's v+1.
PHASE_SQL="select case
    when r.state = 'closing' and not exists (select 1 from work_unit w
        where w.project_id = r.project_id and w.version = r.version
          and (w.state = 'live' or (w.state = 'done' and not exists (
                select 1 from round_report rr where rr.work_unit_id = w.id)))) then 'planning'
    when r.state = 'averaging' and r.params_sha256 is not null then 'commit'
    when r.state = 'averaging' and r.cross_peers and r.gradient_sha256 is not null
         and not exists (select 1 from round_member m
                          where m.project_id = r.project_id and m.version = r.version
                            and m.included and m.outcome is distinct from 'ok') then 'commit'
    else r.state end
  from round r join project p on p.id = r.project_id
  where p.name = 'chaos' and r.version = p.current_version"
round_phase() { sql "$PHASE_SQL"; }
phase_wait() { # PHASE SECONDS: until the current round is in PHASE, polled in the database every 5 ms
	"$PG_BINDIR/psql" "$COTRAIN_DB" -Atq -v ON_ERROR_STOP=1 -c "set statement_timeout = '${2}s'" \
		-c "do \$\$ begin loop exit when ($PHASE_SQL) = '$1'; perform pg_sleep(0.005); end loop; end \$\$" \
		>/dev/null 2>&1
}
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

plan 11

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
	# The log is kept across restarts: wait for a listening line after the ones already there.
	: >>"$T/server.log"
	_seen=$(grep -c "listening on http://127.0.0.1:$PORT" "$T/server.log")
	TMPDIR=$T/tmp "$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port "$PORT" --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --round-report-timeout 6 --round-average-timeout 15 \
		--log-level info 2>>"$T/server.log" &
	SPID=$!
	wait_for 30 listening_more "$_seen"
}
listening_more() { [ "$(grep -c "listening on http://127.0.0.1:$PORT" "$T/server.log")" -gt "$1" ]; }
start_client() { # N: (re)start client N from its state folder
	mkdir -p "$T/cl$1"
	_clock=
	[ "$1" = 5 ] && [ -n "$FAKETIME_LIB" ] &&
		_clock="LD_PRELOAD=$FAKETIME_LIB FAKETIME_TIMESTAMP_FILE=$T/clock5 FAKETIME_CACHE_DURATION=1 FAKETIME_DONT_FAKE_MONOTONIC=1"
	env TMPDIR="$T/tmp" $_clock "$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=2 \
		--set peer_port="$(eval echo \$PEERPORT$1)" 2>>"$T/client$1.log" &
	eval "CPID$1=$!"
}
mkdir -p "$T/tmp"
clock_set +0
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
phases="open closing planning averaging commit"
cycle="0 1 2 3 1 4 5 1 6 7" # the fault kinds below, the server kill 3 times in 10
n_kill=0 n_srv=0 n_db=0 n_stop=0 n_full=0 n_pg=0 n_cut=0 n_clock=0
for ph in $phases; do eval "n_at_$ph=0"; done
start=$(date +%s)
down= stopped= full= cut= clock_from=
n_faults=0
rand 10
first=$R
# A phase no server kill has landed in yet (a kill waits at most 60 s for its
# phase, and lands in another one when the run is slow to get there).
phase_missed() {
	for _p in $phases; do eval "[ \${n_at_$_p:-0} -ge 1 ]" || return 0; done
	return 1
}
while { [ "$(version)" -lt "$VERSIONS" ] || [ $n_faults -lt "$FAULTS" ] || phase_missed; } &&
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
	# The cycle's kinds in turn (from a random place), so each happens
	# FAULTS / 10 times (the server kill 3 times as often); the moments and
	# the victims are random.
	kind=$(echo $cycle | cut -d' ' -f$(( (n_faults - 1 + first) % 10 + 1 )))
	# Past the cycle's faults, only the server kills that missed a phase.
	[ $n_faults -gt "$FAULTS" ] && phase_missed && kind=1
	rand 6
	i=$(( 1 + R ))
	case $kind in
	0)
		eval "kill_ours -9 \$CPID$i; wait \$CPID$i 2>/dev/null; CPID$i="
		down=$i n_kill=$((n_kill + 1))
		diag "$(date +%T) client $i killed (-9)" ;;
	1)
		# The first phase no kill has landed in yet (a kill that missed
		# its phase under load is tried again at the next server kill),
		# then each in turn.
		ph=
		for _p in $phases; do
			eval "_n=\${n_at_$_p:-0}"
			[ "$_n" = 0 ] && { ph=$_p; break; }
		done
		[ -n "$ph" ] || ph=$(echo $phases | cut -d' ' -f$(( n_srv % 5 + 1 )))
		# Planning and the commit take milliseconds; to kill the server
		# inside one, a session holds round_member in share mode.  For
		# planning it is taken once the round is closing, so that the plan
		# cannot be stored: the coordinator waits in round_plan_store,
		# after round_plan_begin committed.  (Not from the open round on:
		# the previous round's late writes to round_member, its second
		# seed's sketches and outcomes, then queue behind the lock with
		# the server's workers that carry them; in one CI run the round
		# twice stayed open for the 60 s the kill waits, and no kill was
		# left for the commit phase.)  For the commit it is taken once
		# the round is in the phase: round_try_commit marks the accepted
		# members before the round, so the round stays in it.
		# Once the server is dead its orphaned sessions and the holder
		# are terminated, so the blocked statement never commits.
		LPID= hold=
		case $ph in
		planning) hold="(select r.state from round r join project p on p.id = r.project_id
		                where p.name = 'chaos' and r.version = p.current_version) = 'closing'" ;;
		commit) hold="($PHASE_SQL) = 'commit'" ;;
		esac
		if [ -n "$hold" ]; then
			"$PG_BINDIR/psql" "$COTRAIN_DB" -Atq -c "do \$\$ begin
			  loop
			    lock table round_member in share mode;
			    exit when $hold;
			    rollback;
			    perform pg_sleep(0.005);
			  end loop;
			  perform pg_sleep(60);
			end \$\$" >/dev/null 2>&1 &
			LPID=$!
		fi
		phase_wait "$ph" 60
		kill_ours -9 "$SPID"; wait "$SPID" 2>/dev/null; SPID=
		if [ -n "$LPID" ]; then
			sql "select count(pg_terminate_backend(pid)) from pg_stat_activity
			  where datname = current_database() and pid <> pg_backend_pid()" >/dev/null
			wait "$LPID"
		fi
		# With the server dead the round stays as it was killed in.
		got=$(round_phase)
		n_srv=$((n_srv + 1))
		case " $phases " in *" $got "*) eval "n_at_$got=\$((n_at_$got + 1))" ;; esac
		diag "$(date +%T) server killed (-9) in the round's $got phase (wanted: $ph)"
		rand 3
		sleep "$R"
		start_server || bail_out "the server did not restart" ;;
	2)
		sql "select count(pg_terminate_backend(pid)) from pg_stat_activity
		  where datname = current_database() and pid <> pg_backend_pid()" >/dev/null
		n_db=$((n_db + 1))
		diag "$(date +%T) every database connection terminated" ;;
	3)
		eval "kill_ours -STOP \$CPID$i"
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
	7)
		if [ -n "$FAKETIME_LIB" ]; then
			step=$([ $((n_clock % 2)) = 0 ] && echo +3h || echo -3h)
			clock_set "$step"
			n_clock=$((n_clock + 1))
			[ -n "$clock_from" ] || clock_from=$(sql "select now()")
			diag "$(date +%T) client 5's realtime clock stepped to the true time $step"
		fi ;;
	esac
done
for i in $down; do start_client "$i"; done
for i in $stopped; do eval "kill -CONT \$CPID$i"; done
[ -n "$full" ] && rm -f "$TMPFS/fill"
[ -n "$cut" ] && link_restore
clock_set +0
V=$(version)
at=
for ph in $phases; do eval "at=\"\${at:+\$at, }\$n_at_$ph $ph\""; done
diag "faults (seed $SEED): $n_kill client kills, $n_srv server kills (by phase: $at), $n_db database disconnections, $n_pg PostgreSQL crashes, $n_stop suspensions, $n_full full disks, $n_cut link cuts, $n_clock clock steps"
ok $([ "$V" -ge "$VERSIONS" ]; echo $?) \
	"the run reached version $VERSIONS (version $V in $(( $(date +%s) - start )) s) through $n_kill client kills, $n_srv server kills, $n_db database disconnections, $n_pg PostgreSQL crashes, $n_stop suspensions, $n_full full disks, $n_cut link cuts$([ -n "$NFT" ] || echo " (not root with nft: none)"), $n_clock clock steps$([ -n "$FAKETIME_LIB" ] || echo " (no libfaketime: none)")"
every_phase=0
for ph in $phases; do eval "[ \$n_at_$ph -ge 1 ]" || every_phase=1; done
ok $([ "$n_kill" -ge 2 ] && [ "$n_srv" -ge 5 ] && [ "$every_phase" = 0 ] && [ "$n_db" -ge 2 ] && [ "$n_pg" -ge 2 ] &&
	[ "$n_stop" -ge 2 ] && { [ -z "$NFT" ] || [ "$n_cut" -ge 2 ]; } && { [ -z "$FAKETIME_LIB" ] || [ "$n_clock" -ge 2 ]; }; echo $?) \
	"the schedule did every kind of fault at least twice, the server kill in each phase ($at; seed $SEED)"
# Client 5 saw its clock stepped (it logs each jump over 30 s; a step
# just before client 5 is killed can go unseen) and kept working: it was
# an accepted member of rounds committed after the first step.
if [ -n "$FAKETIME_LIB" ] && [ -n "$clock_from" ]; then
	jumps=$(grep -c "the system clock jumped" "$T/client5.log")
	after=$(sql "select count(*) from round_member m join round r using (project_id, version)
	  join host h on h.id = m.host_id join account a on a.id = h.account_id
	  where a.email = 'c5@example.org' and m.accepted and r.state = 'committed'
	    and r.committed_at > '$clock_from'")
	ok $([ "$jumps" -ge 1 ] && [ "$after" -ge 1 ]; echo $?) \
		"client 5 saw its clock stepped ($jumps jumps logged for $n_clock steps) and took part in $after committed rounds after the first step"
else
	skip 1 "no clock was stepped (libfaketime: ${FAKETIME_LIB:-absent: install the Debian package libfaketime})"
fi
# Every client stops on SIGTERM, whatever state the faults left it in (a
# full disk held one spinning once, never to stop).
stuck=
gone() { ! ours "$1" || grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; } # exited (a zombie until waited)
for i in 1 2 3 4 5 6; do eval "p=\$CPID$i"; kill_ours "$p"; done
for i in 1 2 3 4 5 6; do
	eval "p=\$CPID$i"
	wait_for 30 gone "$p" || { stuck="$stuck $i"; kill_ours -9 "$p"; }
	wait "$p" 2>/dev/null
	eval "CPID$i="
done
is "${stuck:-none}" none "every client stops within 30 s of SIGTERM"
# The server that survived the faults, with every client gone: no file of
# its data folder left open, no client connection left (closed within 10 s).
srv_files() { ls -l "/proc/$SPID/fd" 2>/dev/null | grep -c -- "-> $T/srv/"; }
srv_conns() { ss -Htn state established "( sport = :$PORT )" 2>/dev/null | wc -l; }
no_conns() { [ "$(srv_conns)" = 0 ]; }
wait_for 10 no_conns
nfd=$(ls "/proc/$SPID/fd" 2>/dev/null | wc -l)
ok $([ "$nfd" -ge 1 ] && [ "$(srv_files)" = 0 ] && [ "$(srv_conns)" = 0 ]; echo $?) \
	"the last server holds $nfd file descriptors, $(srv_files) of them files of its data folder, $(srv_conns) client connections"
kill_ours "$SPID"; wait "$SPID" 2>/dev/null
SPID=
is "$(ls -A "$T/tmp" | wc -l)" 0 "no temporary file or folder is left in the daemons' TMPDIR"
# Uploads cut by a kill -9 leave their partial file in the file store's
# tmp/, which the file collector removes once a day old: counted, not
# judged.
diag "upload temporaries left in the server's file store: $(ls "$T/srv/files/tmp" 2>/dev/null | wc -l)"
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
# PostgreSQL after its crashes: one postmaster for the cluster, every
# process in the data folder its child; none left once it is stopped.
in_cluster() { for _p in $(pgrep -x postgres); do [ "$(readlink "/proc/$_p/cwd")" = "$PGD/data" ] && echo "$_p"; done; }
pm=$(head -n 1 "$PGD/data/postmaster.pid")
strays=0 seen=0
for p in $(in_cluster); do
	[ "$p" = "$pm" ] && seen=1 && continue
	[ "$(ps -o ppid= -p "$p" | tr -d ' ')" = "$pm" ] || strays=$((strays + 1))
done
as_pg "$PG_BINDIR/pg_ctl" -D "$PGD/data" -m fast -w stop >/dev/null
left_pg=$(in_cluster | wc -l)
ok $([ "$seen" = 1 ] && [ "$strays" = 0 ] && [ "$left_pg" = 0 ]; echo $?) \
	"PostgreSQL's cluster had its postmaster running and no stray process ($strays), none left after its stop ($left_pg)"

