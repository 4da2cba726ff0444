#!/bin/sh
# cotrain tests: a training client's peer port under hostile connections,
# against the real server and PostgreSQL (tests/with-pgtmp): random bytes,
# a fake TLS record of 70 KB, TLS without a client certificate, and 300
# idle connections held open.  The daemon must stay up, go on committing
# rounds, give back every descriptor once the connections close, and log
# nothing but clean lines.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
command -v python3 >/dev/null 2>&1 || skip_all "python3 not found"
[ -d /proc/self/fd ] || skip_all "no /proc to count descriptors in"
T=$(mktemp -d /tmp/cotrain-peerhostile-XXXXXX)
SPID= CPID=
cleanup() {
	[ -n "$CPID" ] && kill_ours "$CPID" && wait "$CPID" 2>/dev/null
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
ctl() { "$B/client/cotrainctl" --socket "$T/cl/control.sock" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
committed() { sql "select count(*) from round where state = 'committed'"; }
fds() { ls "/proc/$CPID/fd" 2>/dev/null | wc -l; }

mkdir -p "$T/text"
head -c 200000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
printf '{"name": "busy", "title": "busy", "dataset": "busy",
 "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32},
 "target_batch": 64, "microbatch_size": 4, "seed": 7, "work_unit_seconds": 10, "eval_every": 0}\n' >"$T/p.json"
admin db migrate >/dev/null && admin dataset import busy "$T/text" >/dev/null &&
	admin project create "$T/p.json" >/dev/null || bail_out "could not set up the project"
KEY=$(echo secretpassword | admin user create --password-stdin a@example.org alice | sed -n 's/^account key: //p')
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --kdf-iterations 1000 \
	--log-level warn 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
PEER=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$B/client/cotrain-client" --state-dir "$T/cl" --socket "$T/cl/control.sock" \
	--set heartbeat_interval=5 --set benchmark_seconds=1 --set only_on_ac=false --set peer_port="$PEER" \
	--set idle_detection=none --set max_threads=1 --set socket_group=nonexistent 2>"$T/client.log" &
CPID=$!
wait_for 30 test -S "$T/cl/control.sock" || bail_out "client did not start"
ctl attach "http://127.0.0.1:$PORT/projects/busy" --key "$KEY" >/dev/null || bail_out "attach failed"
wait_for 60 sh -c "[ \$($PG_BINDIR/psql '$COTRAIN_DB' -Atqc \"select count(*) from round where state = 'committed'\") -ge 3 ]" ||
	bail_out "the client committed no rounds: $(tail -3 "$T/client.log")"
fd0=$(fds)
c0=$(committed)

python3 - "$PEER" >"$T/blast.out" 2>&1 <<'PY'
import random, socket, ssl, sys, time
port = int(sys.argv[1])
rng = random.Random(3)
def send(data, wait):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(data)
        s.settimeout(wait)
        try:
            s.recv(4096)
        except OSError:
            pass
        s.close()
    except OSError:
        pass
for _ in range(200):
    send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000))), 0.02)
send(b"\x16\x03\x01\xff\xff" + b"\x01" * 70000, 0.5)
send(b"GET / HTTP/1.1\r\n\r\n", 0.5)
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
for _ in range(20):
    try:
        t = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=3))
        t.sendall(b"\x00" * 1000)
        t.recv(100)
    except (OSError, ssl.SSLError):
        pass
held = []
for _ in range(300):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=3))
    except OSError:
        break
print("held", len(held))
time.sleep(3)
for s in held:
    s.close()
PY
ok $? "the hostile connections were made ($(tr '\n' ' ' <"$T/blast.out"))"
kill -0 "$CPID" 2>/dev/null
ok $? "the client is still running"
wait_for 30 sh -c "[ \$($PG_BINDIR/psql '$COTRAIN_DB' -Atqc \"select count(*) from round where state = 'committed'\") -ge $((c0 + 3)) ]"
ok $? "it went on training: $(committed) rounds committed, $c0 before the connections"
# every descriptor back once the connections are closed (a few of the
# daemon's own come and go: the round's connections, files)
wait_for 20 sh -c "[ \$(ls /proc/$CPID/fd | wc -l) -le $((fd0 + 4)) ]"
ok $? "its descriptors came back: $(fds) open, $fd0 before"
log_clean "$T/client.log"
ok $? "its log is UTF-8 text, one line per message"
n=$(grep -c "ERROR" "$T/client.log")
is "$n" 0 "it logged no error"
done_testing
