#!/bin/sh
# cotrain tests: a peer that fails at a named point of a round, and what
# the round does about it (doc/design.md, "Faults"; doc/averaging.md,
# "Faults: one included set, or no result").  One PostgreSQL
# (tests/with-pgtmp), one cotrain-server and three healthy cotrain-client
# daemons train a tiny model throughout; for each scenario a fourth client
# starts with a fault point (COTRAIN_FAULT, doc/client.md "Test hooks"),
# fails where it says, and the effect is asserted:
#   - a member gone before or while it sends its slices (before-slices stop,
#     mid-slice die): the round of that version commits without it in the
#     same attempt: it is not included, the survivors' all-reduce dropped
#     it, its samples are not in the round's gradient, its reported ranges
#     are back in the pool (or trained by a later version);
#   - a member gone after its slices were accepted (after-slices silent,
#     before-outcome stop): it is included, its outcome never comes, the
#     round fails at the averaging deadline and its next attempt commits
#     without it;
#   - an aggregator gone while it sums (aggregator-mid-sum die): the members
#     cannot complete, the attempt fails and the next one commits.
# After each: the stream is tiled exactly (tests/invariants.sh), no
# included peer holds other parameters than the server's, and the
# survivors commit the next version.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-faults-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill_ours -CONT "$p"; kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'tiny'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
# round V's column C
round_col() { sql "select $2 from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.version = $1"; }
# round_member (V, HOST)'s column C ("" when no row)
member_col() { sql "select $3 from round_member m join project p on p.id = m.project_id
  where p.name = 'tiny' and m.version = $1 and m.host_id = $2"; }
committed() { [ "$(round_col "$1" state)" = committed ]; }
host_of() { grep -o '"host_id": *[0-9]*' "$T/cl$1/state.json" 2>/dev/null | grep -o '[0-9]*$' | head -1; }
has_host() { [ -n "$(host_of "$1")" ]; }

# start_client N THREADS [--set K=V...]: a daemon of its own account, with
# COTRAIN_FAULT from $FAULT (unset when empty).
start_client() {
	_i=$1 _th=$2
	shift 2
	mkdir -p "$T/cl$_i"
	if [ -n "$FAULT" ]; then export COTRAIN_FAULT="$FAULT"; else unset COTRAIN_FAULT; fi
	"$B/client/cotrain-client" --state-dir "$T/cl$_i" --socket "$T/cl$_i/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$_th" \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=600 "$@" \
		2>>"$T/client$_i.log" &
	CPIDS="$CPIDS $!"
	eval "CPID$_i=$!"
	unset COTRAIN_FAULT
	_key=$(echo secretpassword | admin user create --password-stdin "c$_i@example.org" "client $_i" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$_i/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$_i/control.sock" attach "http://127.0.0.1:$PORT/projects/tiny" \
			--key "$_key" >/dev/null && wait_for 30 has_host "$_i"
}

plan 37

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<JSON
{"name": "tiny", "title": "tiny rounds", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 4096, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 20}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
	admin project create "$T/project.json" >"$T/project.out" || bail_out "could not set up the project"
# Outcomes are due 12 s after the plan; slices by half of that.
AVG_TIMEOUT=12
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 3 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 5 --round-average-timeout $AVG_TIMEOUT \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

# Three healthy volunteers throughout.
FAULT=
start_client 1 1 && start_client 2 1 && start_client 3 1 || bail_out "a healthy client did not start"
H1=$(host_of 1) H2=$(host_of 2) H3=$(host_of 3)
wait_for 120 version_at_least 1 || bail_out "the healthy clients committed no round"

# The version and attempt a fault fired in, from the faulty client's log:
# "fault point NAME: ACTION (round V)"; sets FV and FA.
fired() { grep -q "fault point $1: $2 (round" "$T/client$N.log"; }
fault_fired() { # NAME ACTION
	FV= FA=
	if ! wait_for 120 fired "$1" "$2"; then
		diag "fault point $1 did not fire in 120 s (version now $(version)); client $N's rounds:"
		diag "$(grep -E 'round [0-9]+: |WARN|ERROR' "$T/client$N.log" | tail -n 12 | cut -c 1-200)"
		return 1
	fi
	FV=$(sed -n "s/.*fault point $1: $2 (round \([0-9]*\)).*/\1/p" "$T/client$N.log" | head -1)
	# The plan it had when it fired (the round may have failed since): its
	# last "attempt A planned: ..., we aggregate [LO, HI)" line before the
	# fault's; FA is A, FAGG the number of elements it aggregates.
	_pl=$(awk -v v="$FV" -v f="fault point $1: $2 (round" '
	  index($0, f) { print a; exit }
	  index($0, "round " v ": attempt ") && / planned: / { a = $0 }' "$T/client$N.log")
	FA=$(echo "$_pl" | sed -n 's/.*: attempt \([0-9]*\) planned: .*/\1/p')
	FAGG=$(echo "$_pl" | sed -n 's/.*we aggregate \[\([0-9]*\), \([0-9]*\))$/\2 - \1/p')
	FAGG=$((${FAGG:-0 - 1}))
	FPEERS=$(echo "$_pl" | sed -n 's/.* \([0-9]*\) peers, we aggregate .*/\1/p')
	[ -n "$FV" ] && [ -n "$FA" ] && [ "$FV" -ge "$FW" ]
}
# The faulty client, number N, host HF, starts with FAULT (POINT:ACTION)
# and its sets, to fire in the first round from FW on that it reaches the
# point in: FW is two after the current one, by when it computes with the
# others.  (A client slow to start, as under CI's load, may first take part
# in a later round; an exact version would then never fire.)
N=3
start_faulty() { # POINT:ACTION [--set...]
	N=$((N + 1))
	FW=$(($(version) + 2))
	FAULT=$1:$FW+
	shift
	start_client $N 1 "$@" || bail_out "faulty client $N did not start"
	FAULT=
	HF=$(host_of $N)
	eval "FPID=\$CPID$N"
}
gone() { ! [ -e "/proc/$1" ] || grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }   # dead, perhaps not reaped
end_faulty() { # the fault may have ended it already (die)
	kill_ours -CONT "$FPID"; kill_ours -9 "$FPID"; wait "$FPID" 2>/dev/null
	CPIDS=$(pids_without "$CPIDS" "$FPID") FPID=
}

# What every scenario ends with: the model never forks, the stream is tiled
# exactly, and the survivors commit the next version.
forks() { sql "select count(*) from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.outcome = 'ok' and m.params_sha256 <> r.params_sha256"; }
after_scenario() { # NAME
	wait_for 90 version_at_least $((FV + 2))
	ok $? "$1: the survivors go on and commit round $((FV + 1)) (version now $(version))"
	is "$(forks)" 0 "$1: every included peer with outcome ok holds the server's parameters (no fork)"
	coverage_exact tiny "$1: the stream is tiled exactly, no microbatch lost or trained twice"
}

# Path 1: the member is dropped by the all-reduce and round FV commits
# without it in attempt FA.
survivors_dropped() { # how many healthy clients logged FV's all-reduce with 1 dropped
	_n=0
	for _i in 1 2 3; do
		grep -q "round $FV: averaged [0-9]* samples of [0-9]* peers (1 dropped)" "$T/client$_i.log" && _n=$((_n + 1))
	done
	echo $_n
}
commits_without() { # NAME
	wait_for 60 committed "$FV"
	_inc=$(member_col "$FV" "$HF" "coalesce(included::text, 'null')")
	_att=$(round_col "$FV" attempt)
	ok $([ "$_inc" = false ] && [ "$_att" = "$FA" ]; echo $?) \
		"$1: round $FV commits without host $HF in the same attempt (included $_inc; attempt $FA -> $_att)"
	_ninc=$(sql "select count(*) from round_member m join project p on p.id = m.project_id
	  where p.name = 'tiny' and m.version = $FV and m.included")
	all_dropped() { [ "$(survivors_dropped)" = "$_ninc" ]; }
	wait_for 15 all_dropped
	_nd=$(survivors_dropped)
	ok $([ "$_ninc" -ge 2 ] && [ "$_nd" = "$_ninc" ]; echo $?) \
		"$1: every included survivor's all-reduce dropped it ($_nd of $_ninc logged \"(1 dropped)\")"
	_s=$(sql "select coalesce(r.gradient_samples, -1) || ' ' ||
	    (select coalesce(sum(rr.samples), 0) from round_report rr join round_member m using (project_id, version, host_id)
	      where rr.project_id = r.project_id and rr.version = r.version and m.included) || ' ' ||
	    (select coalesce(sum(rr.samples), 0) from round_report rr
	      where rr.project_id = r.project_id and rr.version = r.version and rr.host_id = $HF)
	  from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.version = $FV")
	set -- "$1" $_s
	ok $([ "$2" = "$3" ] && [ "$4" -gt 0 ]; echo $?) \
		"$1: its samples are not in the round's gradient ($2 samples = the included peers' $3; its own $4 left out)"
	# Every microbatch it reported is in the pool or in a unit of a later
	# version, and its units of FV count nothing.
	_left=$(sql "select count(*) from round_report rr join work_unit w on w.id = rr.work_unit_id,
	    generate_series(w.lo, w.lo + rr.mb_done - 1) mb
	  where rr.host_id = $HF and rr.version = $FV
	    and not exists (select 1 from mb_pool b where b.project_id = w.project_id and mb >= b.lo and mb < b.hi)
	    and not exists (select 1 from work_unit l where l.project_id = w.project_id and l.version > $FV
	                      and mb >= l.lo and mb < l.hi)")
	_mb=$(sql "select coalesce(sum(mb_done), 0) from round_report where host_id = $HF and version = $FV")
	_cnt=$(sql "select count(*) from work_unit where host_id = $HF and version = $FV and (mb_done <> 0 or state = 'live')")
	ok $([ "$_mb" -gt 0 ] && [ "$_left" = 0 ] && [ "$_cnt" = 0 ]; echo $?) \
		"$1: its $_mb reported microbatches are back in the pool or trained later ($_left missing; $_cnt of its units still count)"
}

# Path 2: the member was included, its outcome never came; the attempt
# fails at the averaging deadline (or as REASON says) and the next commits
# without it.
included_silent() {
	[ "$(member_col "$FV" "$HF" "coalesce(included::text, 'null') || ' ' || coalesce(outcome, 'none')")" = "true none" ] &&
		[ "$(sql "select count(*) from round_member m join project p on p.id = m.project_id
		  where p.name = 'tiny' and m.version = $FV and m.host_id <> $HF and m.included
		    and m.outcome is distinct from 'ok'")" = 0 ] &&
		[ "$(round_col "$FV" "coalesce(gradient_sha256, '')")" != "" ]
}
failed_attempt() { [ "$(round_col "$FV" attempt)" -gt "$FA" ] 2>/dev/null; }
retry_commits_without() { # NAME REASON
	wait_for 90 committed "$FV"
	_att=$(round_col "$FV" attempt)
	_why=$(round_col "$FV" last_failure)
	_in=$(member_col "$FV" "$HF" "coalesce(included::text, 'null')")
	_n=$(sql "select count(*) from round_member m join project p on p.id = m.project_id
	  where p.name = 'tiny' and m.version = $FV and m.included")
	ok $(committed "$FV" && [ "$_att" = $((FA + 1)) ] && [ -z "$_in" ] && [ "$_n" -ge 1 ] &&
		case $_why in *"$2"*) true ;; *) false ;; esac; echo $?) \
		"$1: attempt $FA of round $FV failed (\"$_why\") and attempt $_att commits with $_n peers, without host $HF"
}

# 1. before-slices stop: a member (it aggregates nothing: its bandwidth is
# the lowest) freezes with its plan in hand; the aggregators drop it at the
# collect deadline.
start_faulty before-slices:stop --set peer_bandwidth=1000
fault_fired before-slices stop
ok $? "before-slices stop: the fault fired in round $FV (named: $FW on), attempt $FA"
is "$FAGG" 0 "before-slices stop: the frozen peer is a member that aggregates nothing"
commits_without "before-slices stop"
end_faulty
after_scenario "before-slices stop"

# 2. mid-slice die: a member dies with part of a slice on the wire.
start_faulty mid-slice:die --set peer_bandwidth=1000
fault_fired mid-slice die
ok $([ $? = 0 ] && wait_for 10 gone "$FPID"; echo $?) \
	"mid-slice die: the fault fired in round $FV (named: $FW on), attempt $FA, and the process is gone"
commits_without "mid-slice die"
end_faulty
after_scenario "mid-slice die"

# 3. after-slices silent: every aggregator accepted its slice, then it
# goes quiet (alive, sockets open): included, no outcome.
start_faulty after-slices:silent --set peer_bandwidth=1000
fault_fired after-slices silent
ok $? "after-slices silent: the fault fired in round $FV (named: $FW on), attempt $FA"
wait_for $((AVG_TIMEOUT + 10)) included_silent
ok $? "after-slices silent: host $HF is included, the others reported ok, the server's v+1 exists, its outcome is missing"
wait_for $((AVG_TIMEOUT + 10)) failed_attempt
retry_commits_without "after-slices silent" "the averaging deadline passed"
ok $(kill -0 "$FPID" 2>/dev/null; echo $?) "after-slices silent: the silent client is still alive"
end_faulty
after_scenario "after-slices silent"

# 4. before-outcome stop: it stepped as the others did and freezes before
# telling the server.
start_faulty before-outcome:stop --set peer_bandwidth=1000
fault_fired before-outcome stop
ok $? "before-outcome stop: the fault fired in round $FV (named: $FW on), attempt $FA"
wait_for $((AVG_TIMEOUT + 10)) included_silent
ok $? "before-outcome stop: host $HF is included, the others reported ok, the server's v+1 exists, its outcome is missing"
wait_for $((AVG_TIMEOUT + 10)) failed_attempt
retry_commits_without "before-outcome stop" "the averaging deadline passed"
end_faulty
after_scenario "before-outcome stop"

# 5. aggregator-mid-sum die: an aggregator (bandwidth as the others') dies
# with some slices in: its range cannot be reduced, the group fails.
start_faulty aggregator-mid-sum:die
fault_fired aggregator-mid-sum die
ok $? "aggregator-mid-sum die: the fault fired in round $FV (named: $FW on), attempt $FA"
ok $([ "$FAGG" -gt 0 ]; echo $?) "aggregator-mid-sum die: the dead peer aggregated a range ($FAGG elements)"
wait_for 60 failed_attempt
# The server fails the attempt on the first member's report; the others
# log theirs as their own all-reduce gives up, a moment later.
members_failed() {
	_nf=0
	for _i in 1 2 3; do
		grep -q "round $FV: could not average with .*host $HF: " "$T/client$_i.log" && _nf=$((_nf + 1))
	done
	[ "$_nf" = $((FPEERS - 1)) ]
}
wait_for 30 members_failed
ok $([ "$_nf" = $((FPEERS - 1)) ]; echo $?) \
	"aggregator-mid-sum die: the members could not complete ($_nf of the $((FPEERS - 1)) others in its plan failed their all-reduce naming host $HF)"
retry_commits_without "aggregator-mid-sum die" "failed to average"
end_faulty
after_scenario "aggregator-mid-sum die"

echo "# wall: $SECONDS s"
