#!/bin/sh
# cotrain tests: the cpu_time_percent preference (BOINC's "use at most N% of
# CPU time"), measured from the daemon's CPU time in /proc: one client with
# one compute thread on a model big enough to keep it busy, at 100% and then
# at 25% (set with cotrainctl while it computes), against the real server
# and PostgreSQL (tests/with-pgtmp).
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
[ -r /proc/self/stat ] || skip_all "no /proc to read CPU time from"
T=$(mktemp -d /tmp/cotrain-throttle-XXXXXX)
SPID= CPID=
cleanup() {
	[ -n "$CPID" ] && kill_ours -9 "$CPID"
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
ctl() { "$B/client/cotrainctl" --socket "$T/cl/control.sock" "$@"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
computing() { ctl status | grep -q '^activity: computing'; }
# Over SECONDS: the daemon's CPU seconds per wall second (utime + stime of
# /proc/PID/stat), and its demand for CPU per wall second: time on a CPU plus
# time runnable but waiting for one (/proc/PID/task/*/schedstat), which a
# loaded machine does not change (the compute threads run in SCHED_IDLE, so
# their CPU time depends on what else runs).  Prints "CPU DEMAND".
ticks() { awk '{print $14 + $15}' "/proc/$CPID/stat"; }
runnable_ns() { cat /proc/"$CPID"/task/*/schedstat 2>/dev/null | awk '{ s += $1 + $2 } END { printf "%.0f", s }'; }
cpu_share() {
	_a=$(ticks) _ra=$(runnable_ns) _t0=$(date +%s.%N)
	sleep "$1"
	_b=$(ticks) _rb=$(runnable_ns) _t1=$(date +%s.%N)
	awk -v a="$_a" -v b="$_b" -v ra="$_ra" -v rb="$_rb" -v t0="$_t0" -v t1="$_t1" -v hz="$(getconf CLK_TCK)" \
		'BEGIN { printf "%.2f %.2f", (b - a) / hz / (t1 - t0), (rb - ra) / 1e9 / (t1 - t0) }'
}

mkdir -p "$T/text"
head -c 200000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<'JSON'
{"name": "busy", "title": "busy", "dataset": "busy",
 "model": {"n_layer": 2, "n_head": 4, "d_model": 128, "d_ff": 512, "seq_len": 64, "vocab": 256},
 "target_batch": 1000000, "microbatch_size": 4, "seed": 7, "work_unit_seconds": 60}
JSON
admin db migrate >/dev/null && admin dataset import busy "$T/text" >/dev/null &&
	admin project create "$T/project.json" >/dev/null || bail_out "could not set up the project"
KEY=$(echo secretpassword | admin user create --password-stdin a@example.org alice | sed -n 's/^account key: //p')
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --kdf-iterations 1000 \
	--log-level warn 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -q 'listening on' "$T/server.log" || bail_out "server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
"$B/client/cotrain-client" --state-dir "$T/cl" --socket "$T/cl/control.sock" \
	--set heartbeat_interval=30 --set benchmark_seconds=1 --set only_on_ac=false \
	--set idle_detection=none --set max_threads=1 --set socket_group=nonexistent 2>"$T/client.log" &
CPID=$!
wait_for 30 test -S "$T/cl/control.sock" || bail_out "client did not start"
ctl attach "http://127.0.0.1:$PORT/projects/busy" --key "$KEY" >/dev/null || bail_out "attach failed"
wait_for 60 computing || bail_out "the client never computed: $(ctl status | head -1)"

[ -r "/proc/$CPID/schedstat" ] || skip_all "no /proc/PID/schedstat (a kernel without schedstats)"
set -- $(cpu_share 5); full_cpu=$1 full=$2
ctl prefs set cpu_time_percent=25 >/dev/null; ok $? "prefs set cpu_time_percent=25 while computing"
sleep 1   # the compute loop takes the new preference at its next start
set -- $(cpu_share 8); thr_cpu=$1 thr=$2
ratio=$(awk -v t="$thr" -v f="$full" 'BEGIN { printf "%.2f", (f > 0 ? t / f : 1) }')
ok $(awk -v r="$ratio" -v f="$full" 'BEGIN { exit !(f >= 0.6 && r <= 0.40) }'; echo $?) \
	"at 25% the daemon wants $thr CPU s per s against $full at 100%: $ratio of it (at most 0.40); CPU time $thr_cpu against $full_cpu s per s"
ok $(awk -v t="$thr_cpu" -v f="$full_cpu" 'BEGIN { exit !(t <= f) }'; echo $?) \
	"  and uses no more CPU time than at 100% ($thr_cpu <= $full_cpu)"
computing; ok $? "  status still says computing"
ctl prefs set cpu_time_percent=0 >/dev/null 2>&1; is $? 1 "cpu_time_percent=0 is refused"
ctl prefs set cpu_time_percent=101 >/dev/null 2>&1; is $? 1 "cpu_time_percent=101 is refused"
ctl prefs unset cpu_time_percent >/dev/null; ok $? "prefs unset cpu_time_percent"
sleep 1
set -- $(cpu_share 4); back=$2
ok $(awk -v b="$back" -v t="$thr" 'BEGIN { exit !(b > 1.5 * t) }'; echo $?) \
	"back at 100% it wants $back CPU s per s again"
done_testing
