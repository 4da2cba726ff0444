#!/bin/sh
# cotrain tests: the client end to end against the real server and a real
# PostgreSQL (run under tests/with-pgtmp): attach, the work loop, cotrainctl
# and its exit codes, the socket's permissions, a resumed and a corrupt
# partial download, kill -9 with no re-download and no microbatch counted
# twice, backoff while the server is away, a corrupt state file, malformed
# control requests; two projects attached at once, both getting work.
. "$top_srcdir/tests/tap.sh"
# skip N REASON: N tests reported as skipped (tap.sh has no such helper)
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
command -v python3 >/dev/null 2>&1 && PY=python3 || PY=
T=$(mktemp -d /tmp/cotrain-client-XXXXXX)
SPID= CPID= FPID=
cleanup() {
	[ -n "$FPID" ] && kill_ours "$FPID" && wait "$FPID" 2>/dev/null
	[ -n "$CPID" ] && kill_ours -9 "$CPID"
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	[ -n "$KEEP_LOGS" ] && echo "# logs kept in $T" || rm -rf "$T"
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
ctl() { "$B/client/cotrainctl" --socket "$T/cl/control.sock" "$@"; }
# wait_for SECONDS CMD...: poll CMD until it succeeds, for at most SECONDS
# of wall time (however long each try takes: under the sanitizers the
# client and cotrainctl run several times slower).  The deadlines are
# generous, as they cost nothing when the state comes in time.
wait_for() {
	_end=$(($(date +%s) + $1)); shift
	while :; do
		"$@" && return 0
		[ "$(date +%s)" -lt "$_end" ] || return 1
		sleep 0.1
	done
}

start_server() {
	: >"$T/server.log" # emptied before the start, so that a restart does not see the last run's line
	"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port "${PORT:-0}" --wu-max 20 \
		--reap-interval 1 --kdf-iterations 1000 --round-close-fraction 1 --log-level warn 2>"$T/server.log" &
	SPID=$!
	wait_for 20 grep -q 'listening on' "$T/server.log" || return 1
	PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
}
start_client() {
	"$B/client/cotrain-client" --state-dir "$T/cl" --socket "$T/cl/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=1 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 --set socket_group=nonexistent \
		2>>"$T/client.log" &
	CPID=$!
	wait_for 30 test -S "$T/cl/control.sock"
}
done_units() { sql "select count(*) from work_unit where state='done'"; }
done_in() { sql "select count(*) from work_unit w join project p on p.id = w.project_id
  where p.name = '$1' and w.state = 'done'"; }
both_done() { [ "$(done_in tiny)" -ge 1 ] && [ "$(done_in tiny2)" -ge 1 ] && done_at_least 3; }
done_at_least() { [ "$(done_units)" -ge "$1" ] 2>/dev/null; }
log_has() { grep -q "$1" "$T/client.log"; }
mb_total() { ctl --json status | sed -n 's/.*"mb_total": \([0-9]*\),*$/\1/p' | head -1; }

plan 53

mkdir -p "$T/text"
head -c 30000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<'JSON'
{"name": "tiny", "title": "tiny test", "dataset": "tiny",
 "model": {"n_layer": 1, "n_shared": 1, "n_head": 2, "d_model": 32, "d_ff": 64, "seq_len": 16, "vocab": 256},
 "target_batch": 4096, "microbatch_size": 2, "seed": 7, "work_unit_seconds": 2}
JSON
admin db migrate >/dev/null && admin dataset import --shard-tokens 8192 tiny "$T/text" >/dev/null &&
	admin project create "$T/project.json" >"$T/project.out" || bail_out "could not set up the project"
sed 's/"name": "tiny"/"name": "tiny2"/' "$T/project.json" >"$T/project2.json"
admin project create "$T/project2.json" >/dev/null || bail_out "could not set up the second project"
KEY=$(echo secretpassword | admin user create --password-stdin a@example.org alice | sed -n 's/^account key: //p')
CKPT=$(sed -n 's/^version 0 checkpoint //p' "$T/project.out")
start_server || { cat "$T/server.log"; echo "Bail out! server did not start"; exit 1; }

# A partial download left by an earlier run is resumed; a corrupt one is
# fetched again.
mkdir -p "$T/cl/downloads"
head -c 1000 "$T/srv/files/$(echo "$CKPT" | cut -c1-2)/$CKPT" >"$T/cl/downloads/$CKPT.part"

# cotrainctl without a daemon
ctl status >/dev/null 2>&1; is $? 3 "cotrainctl exits 3 when the daemon is not running"
"$B/client/cotrainctl" bogus >/dev/null 2>&1; is $? 2 "cotrainctl exits 2 on an unknown command"
"$B/client/cotrainctl" status --help | grep -q 'usage: cotrainctl'; ok $? "cotrainctl status --help"

start_client || bail_out "client did not start"
mode=$(stat -c %a "$T/cl/control.sock")
is "$mode" 600 "the control socket is 0600 when the group does not exist"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	setpriv --reuid=65534 --regid=65534 --clear-groups "$B/client/cotrainctl" --socket "$T/cl/control.sock" status >/dev/null 2>&1
	is $? 4 "another user is refused by the socket's permissions (exit 4)"
else
	skip 1 "needs root and setpriv to try as another user"
fi

ctl attach "http://127.0.0.1:$PORT/projects/nosuch" --key "$KEY" >/dev/null 2>&1
is $? 1 "attaching to a missing project is refused (exit 1)"
ctl status | grep -q '^activity: no project attached$'; ok $? "status says no project is attached"
ctl attach "http://127.0.0.1:$PORT/projects/tiny" --key "wrongkey123" >/dev/null 2>"$T/badkey.err"
is $? 1 "attaching with a wrong key is refused"
ok $(grep -q 'web site' "$T/badkey.err" && ! grep -qi 'authorization\|bearer' "$T/badkey.err"; echo $?) \
	"  with a hint for a volunteer, not about HTTP headers: $(tr '\n' ' ' <"$T/badkey.err")"
ctl attach "http://127.0.0.1:$PORT/projects/tiny" --key "$KEY" >/dev/null
ok $? "attach with an account key"
ctl --json status >"$T/attached.json"
ok $(! grep -q '"activity": ""' "$T/attached.json"; echo $?) "right after attach no activity is blank"
ctl --json attach "http://127.0.0.1:$PORT/projects/tiny" --key "$KEY" >"$T/dup.json" 2>/dev/null
is $? 1 "attaching twice is refused"
grep -q '"code": "already_exists"' "$T/dup.json"; ok $? "--json prints the error object"

ctl attach "http://127.0.0.1:$PORT/projects/tiny2" --key "$KEY" --share 300 >/dev/null
ok $? "attach a second project, with three times the share"
ctl status | grep -q 'project tiny2 .*share 300'; ok $? "status lists both projects with their shares"
wait_for 90 both_done
ok $? "work units of both projects are computed and finished on the server ($(done_in tiny) + $(done_in tiny2))"
grep -q "downloaded $CKPT .*resumed" "$T/client.log"; ok $? "the partial checkpoint download was resumed"
ctl status | grep -q 'microbatches reported in all'; ok $? "status shows the project and its progress"
wait_for 60 sh -c "\"$B/client/cotrainctl\" --socket '$T/cl/control.sock' status | grep -q '^activity: computing (project tiny2\\{0,1\\}, work unit [0-9]*)$'"
ok $? "status says computing, with the project and work unit"
# Credit as the server has it: granted and pending, looked at after each
# finished work unit.
H=$(sql "select host_id from work_unit w join project p on p.id = w.project_id where p.name = 'tiny' limit 1")
P=$(sql "select id from project where name = 'tiny'")
sql "insert into credit_grant (kind, project_id, version, host_id, account_id, samples, flops, credit, status, created_at)
     select 'round', $P, v, $H, account_id, 8, 1, c, s, now() from host,
            (values (900, 12.5, 'granted'), (901, 3.25, 'pending')) x(v, c, s) where id = $H;
     insert into host_credit (host_id, total) values ($H, 12.5)" >/dev/null
wait_for 60 sh -c "\"$B/client/cotrainctl\" --socket '$T/cl/control.sock' status | grep -q '^  credit: 12.5 granted, 3.25 pending$'"
ok $? "status shows the host's credit, granted and pending: $(ctl status | grep credit: | tr '\n' ' ')"

ctl suspend >/dev/null; ok $? "suspend"
ctl --json status | grep -q '"suspended": true'; ok $? "status --json says suspended"
ctl status | grep -q '^activity: suspended: by the user$'; ok $? "status says why nothing is computed"
n1=$(done_units); sleep 2
n2=$(done_units)
ok $([ "$n2" -le "$((n1 + 2))" ]; echo $?) "no work is finished while suspended ($n1 -> $n2)"
ctl resume >/dev/null; ok $? "resume"
ctl status >"$T/resumed.txt"
ok $(! grep -q 'suspended' "$T/resumed.txt"; echo $?) "right after resume nothing says suspended: $(head -1 "$T/resumed.txt")"
ctl prefs set max_threads=1 disk_max=64M >/dev/null; ok $? "prefs set"
ctl prefs set max_threads=lots >/dev/null 2>&1; is $? 1 "a bad preference value is refused (exit 1)"
ctl --json prefs | grep -q '"disk_max": 67108864'; ok $? "prefs get shows the new value"
# The idle-only default: what the daemon does (nothing here sets it), what
# doc/client.md says and what the project page tells volunteers agree.
ctl --json prefs | tr -d ' \n' | grep -q '"effective":{[^}]*"only_when_idle":false'
ok $? "only_when_idle is off by default"
grep -q '^| `only_when_idle` | .* | false |$' "$top_srcdir/doc/client.md"; ok $? "  as doc/client.md says"
ok $(grep -q 'computes also while you use the machine' "$top_srcdir/web/app.js" &&
	! grep -q 'computes only when the machine is idle' "$top_srcdir/web/app.js"; echo $?) "  and as the project page says"


# kill -9: on restart nothing is downloaded again and no microbatch is
# counted twice on the server.
kill -9 "$CPID"; wait "$CPID" 2>/dev/null; CPID=
# What the cache held at the kill; a download in flight then (a new work
# unit's shard) may rightly finish after the restart.
cached=$(find "$T/cl/cache" -type f -name '????????????????????????????????????????????????????????????????' -exec basename {} \; 2>/dev/null | sort)
: >"$T/client.log"
start_client || bail_out "client did not restart"
wait_for 60 log_has 'finished with'
finished=$?
again=0
for sha in $(sed -n 's/.*downloaded \([0-9a-f]\{64\}\).*/\1/p' "$T/client.log"); do
	echo "$cached" | grep -qx "$sha" && again=$((again + 1))
done
ok "$([ -n "$cached" ]; echo $?)" "the cache held the checkpoint and shards at the kill"
ok $([ "$finished" = 0 ] && [ "$again" = 0 ]; echo $?) \
	"after kill -9 the restarted client finished a unit and downloaded nothing already in the cache again ($again again)"
overlap=$(sql "select count(*) from work_unit a join work_unit b on a.id < b.id
  and a.project_id = b.project_id and a.lo < b.lo + b.mb_done and b.lo < a.lo + a.mb_done
  where a.state in ('done','returned') and b.state in ('done','returned')")
nrep=$(sql "select count(*) from work_unit where state in ('done','returned') and mb_done > 0")
ok $([ "$nrep" -ge 2 ] && [ "$overlap" = 0 ]; echo $?) "no microbatch was reported twice ($nrep units reported, $overlap overlapping pairs)"

# The server goes away: the client backs off and says so, then carries on.
kill "$SPID"; wait "$SPID" 2>/dev/null; SPID=
wait_for 60 log_has 'retrying in'
ok $? "with the server away the client retries with backoff"
# (The next attempt shows on the activity line, or on the project's own when
# a round's thread holds the activity line: "averaging".)
wait_for 60 sh -c "\"$B/client/cotrainctl\" --socket '$T/cl/control.sock' status | grep -q 'failed: .*; next attempt at [0-9][0-9]:[0-9][0-9]:[0-9][0-9]'"
ok $? "status says when the next attempt is: $(ctl status | grep 'next attempt' | head -1)"
start_server || bail_out "server did not restart"
n1=$(done_units)
wait_for 60 done_at_least $((n1 + 1))
ok $? "work resumes when the server is back"

# Killed after the server acknowledged a finish but before the client
# recorded it: the state still journals the finish of a work unit the server
# has as done.  The resent finish is answered 200 (idempotent), so the
# client's count is not short and nothing is dropped.  The unit is the
# newest one still done, of either project: a round takes back the units no
# gradient holds (round_drop_units; those of the kill -9 above), so one
# project may have none done left.
last_done() { sql "select w.id, w.lo, w.hi, w.version, p.name from work_unit w join project p on p.id = w.project_id
  where w.state = 'done' order by w.id desc limit 1" | tr '|' ' '; }
has_done() { [ -n "$(last_done)" ]; }
if [ -n "$PY" ]; then
	wait_for 60 has_done || bail_out "no work unit is done on the server to resend the finish of"
	kill -9 "$CPID"; wait "$CPID" 2>/dev/null; CPID=
	set -- $(last_done)
	[ $# = 5 ] || bail_out "no work unit is done on the server to resend the finish of"
	WU=$1 N=$(($3 - $2)) PN=$5
	$PY - "$T/cl/state.json" "$WU" "$2" "$3" "$4" "$PN" >"$T/mb_before" <<'PYEOF'
import hashlib, json, sys
path, wu, lo, hi, ver, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
text = open(path).read()
st = json.loads(text.split("\n", 1)[1])
p = [p for p in st["projects"] if p["name"] == name][0]
print(p["mb_total"])
p["work"] = {"id": wu, "version": ver, "lo": lo, "hi": hi, "deadline": 4102444800, "files": [],
             "mb_done": hi - lo, "mb_reported": 0, "keep_hi": hi, "samples_per_sec": 1.0,
             "pending_op": "finish", "pending_mb": hi - lo}
body = json.dumps(st) + "\n"
open(path, "w").write("cotrain-client-state 1 %s\n%s" % (hashlib.sha256(body.encode()).hexdigest(), body))
PYEOF
	: >"$T/client.log"
	start_client || bail_out "client did not restart"
	wait_for 60 log_has "project $PN: work unit $WU finished with $N microbatches"
	ok $? "a finish resent after a crash is acknowledged (project $PN, work unit $WU, $N microbatches)"
	log_has "work unit $WU: .*dropping it"; is $? 1 "and not dropped as a conflict"
	mb=$(ctl --json status | $PY -c 'import json,sys; print([p for p in json.load(sys.stdin)["projects"] if p["name"] == sys.argv[1]][0]["mb_total"])' "$PN")
	ok $([ "$mb" -ge $(($(cat "$T/mb_before") + N)) ] 2>/dev/null; echo $?) \
		"the client counts it: mb_total $(cat "$T/mb_before") -> $mb"
else
	skip 3 "python3 is needed to edit the state file"
fi

# A third project on a server that answers garbage, impossible work units and
# broken files (tests/test_client_faults.sh checks each message): the daemon
# goes through all of it while the real projects keep working, and loses
# nothing they did.
if [ -n "$PY" ]; then
	$PY "$top_srcdir/tests/fake_server.py" "$T/fake.json" 2>"$T/fake.log" &
	FPID=$!
	wait_for 20 test -s "$T/fake.json" || bail_out "the fake server did not start"
	FPORT=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$T/fake.json")
	mb1=$(mb_total) n1=$(done_units)
	ctl attach "http://127.0.0.1:$FPORT/projects/fake" --key fakeaccountkey --share 100 >/dev/null &&
		wait_for 90 log_has 'project fake: handing back work unit 9'
	ok $? "a misbehaving third project: the daemon goes through its broken answers"
	wait_for 60 done_at_least $((n1 + 1))
	ok $? "the real projects keep finishing work meanwhile"
	mb2=$(mb_total)
	ok $([ "$mb2" -ge "$mb1" ] 2>/dev/null; echo $?) "nothing already done was lost ($mb1 -> $mb2 microbatches)"
	ctl detach fake >/dev/null
else
	skip 3 "python3 is needed for the fake server"
fi

if [ -n "$PY" ]; then
	$PY - "$T/cl/control.sock" >"$T/raw.out" <<'PYEOF'
import socket, sys
def ask(data):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(data)
    s.shutdown(socket.SHUT_WR); r = s.makefile().read(); s.close(); return r
print(ask(b"this is not json\n").strip()); print(ask(b'{"cmd": 5}\n').strip())
print(ask(b'{"cmd": "launch"}\n').strip()); print(ask(b"{" * 70000).strip())
PYEOF
	c=$(grep -c '"ok":false' "$T/raw.out")
	is "$c" 4 "malformed control requests get error answers"
	# A request sent a byte at a time is cut CL_CTL_TIMEOUT_S (5 s) after
	# the connection, however the bytes come.
	$PY - "$T/cl/control.sock" >"$T/slow.out" <<'PYEOF'
import select, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); t0 = time.time()
try:
    for c in b'{"cmd": "status"}' + b" " * 40:
        if select.select([s], [], [], 0.5)[0]:
            break
        s.send(bytes([c]))
except OSError:
    pass
s.settimeout(10)
print("%.1f %s" % (time.time() - t0, s.makefile().read().strip()))
PYEOF
	out=$(cat "$T/slow.out")
	case $out in [5-6].*'"ok":false'*timeout*) ok 0 "a control request trickled in is cut at 5 s ($out)" ;;
		*) ok 1 "a control request trickled in is cut at 5 s ($out)" ;; esac
else
	skip 2 "python3 is needed to send raw control requests"
fi
# Detach and attach again: the same host comes back (one host per machine
# and account), with its credit and pending checks.
hid() { ctl --json status | sed -n 's/.*"host_id": \([0-9]*\),*$/\1/p' | head -1; }
h1=$(hid) nhosts=$(sql "select count(*) from host")
ctl detach tiny2 >/dev/null; ok $? "detach the second project"
ctl detach tiny >/dev/null; ok $? "detach"
ctl attach "http://127.0.0.1:$PORT/projects/tiny" --key "$KEY" >"$T/reattach.out" 2>&1
rc=$?
kill -0 "$CPID" 2>/dev/null || echo "(the client is not running)" >>"$T/reattach.out"
ok_said $rc "$T/reattach.out" "attach again after the detach"
h2=$(hid)
ok $([ -n "$h1" ] && [ "$h1" = "$h2" ]; echo $?) "the same host comes back ($h1 -> $h2)"
is "$(sql "select count(*) from host")" "$nhosts" "  and the server made no new host"
ctl detach tiny >/dev/null; ok $? "detach once more"
ctl status | grep -q 'project tiny'; is $? 1 "no project is left attached"
done_testing
