#!/bin/sh
# cotrain benchmark: the HTTP API under 500 slow connections (issue 20,
# "Measure and report").  A real PostgreSQL (tests/with-pgtmp) and
# cotrain-server with its default limits; a well-behaved client on
# 127.0.0.1 sends ordinary requests (GET /v1/projects, a new connection
# each, one after another) for SECONDS per phase, in three phases:
#
#   none       no other connection (the reference, measured in the same run)
#   one-addr   500 connections from 127.0.0.2 that send a request's header
#              one byte a second and never finish it
#   many-addr  the same 500 spread over 500 loopback addresses 127.1.x.y
#
# It prints, per phase, the requests served per second and the median and
# 99th-percentile latency, their ratios to the reference, the slow
# connections still open at the phase's end and how many the server closed
# (each one closed is opened again at once).  Nothing is asserted; not run by
# make check.
#
#   tests/bench/bench-slow-connections.sh [SECONDS] [SLOW]
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
secs=${1:-15}
nslow=${2:-500}
b=$(cd "${top_builddir:-.}" && pwd)
for f in "$b/server/cotrain-admin" "$b/server/cotrain-server" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-slow-connections: $f is missing; run make first" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench-slow-connections: python3 is missing" >&2; exit 1; }
work=$(mktemp -d /tmp/cotrain-bench-slow-XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
chmod 755 "$work"
cat >"$work/load.py" <<'PY'
import http.client, selectors, socket, statistics, sys, time
port, secs, nslow = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
HEAD = b"GET /v1/projects HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000

def good(deadline):
    lat = []
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/v1/projects")
            r = c.getresponse(); r.read(); c.close()
            if r.status == 200:
                lat.append(time.monotonic() - t0)
        except OSError:
            pass
    return lat

def phase(name, addrs):
    sel = selectors.DefaultSelector()
    conns = {}  # socket -> (address, bytes sent)
    opened = closed = failed = 0
    def open_one(a):
        nonlocal opened, failed
        s = socket.socket()
        try:
            s.bind((a, 0)); s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            failed += 1; s.close(); return
        conns[s] = [a, 0]; opened += 1
        sel.register(s, selectors.EVENT_READ)
    for a in addrs:
        open_one(a)
    time.sleep(1)
    import threading
    result = {}
    deadline = time.monotonic() + secs
    t = threading.Thread(target=lambda: result.setdefault("lat", good(deadline)))
    t.start()
    next_tick = time.monotonic()
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed by the server: count it and open another
                a = conns.pop(s)[0]; sel.unregister(s); s.close(); closed += 1
                open_one(a)
        if time.monotonic() >= next_tick:
            next_tick += 1
            for s, st in list(conns.items()):
                if st[1] < len(HEAD):
                    try:
                        s.send(HEAD[st[1]:st[1] + 1]); st[1] += 1
                    except OSError:
                        pass
    t.join()
    for s in conns:
        s.close()
    lat = sorted(result.get("lat", []))
    n = len(lat)
    p50 = lat[n // 2] if n else float("nan")
    p99 = lat[min(n - 1, int(n * 0.99))] if n else float("nan")
    print("phase=%s served=%d rps=%.1f p50_ms=%.2f p99_ms=%.2f open=%d closed=%d failed=%d"
          % (name, n, n / secs, p50 * 1e3, p99 * 1e3, len(conns), closed, failed), flush=True)

phase("none", [])
phase("one-addr", ["127.0.0.2"] * nslow)
phase("many-addr", ["127.1.%d.%d" % (1 + i // 250, 1 + i % 250) for i in range(nslow)])
PY
cat >"$work/inner.sh" <<EOS
set -eu
ulimit -n 16384 2>/dev/null || true
"$b/server/cotrain-admin" --db "\$COTRAIN_DB" --data-dir "$work/srv" db migrate >/dev/null
"$b/server/cotrain-server" --db "\$COTRAIN_DB" --data-dir "$work/srv" --port 0 --log-level warn 2>"$work/server.log" &
spid=\$!
trap 'kill \$spid 2>/dev/null; wait \$spid 2>/dev/null' EXIT
n=0
while ! grep -qs 'listening on' "$work/server.log"; do
	n=\$((n + 1)); [ \$n -lt 200 ] || { echo "the server did not start" >&2; exit 1; }; sleep 0.1
done
port=\$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/server.log")
python3 "$work/load.py" "\$port" "$secs" "$nslow"
EOS
"$b/tests/with-pgtmp" sh "$work/inner.sh" >"$work/out"
grep "^phase=" "$work/out" | awk -v secs="$secs" -v nslow="$nslow" '
	{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
	  name[++n] = v["phase"]; rps[n] = v["rps"]; p50[n] = v["p50_ms"]; p99[n] = v["p99_ms"]
	  open[n] = v["open"]; closed[n] = v["closed"]; failed[n] = v["failed"] }
	END {
		printf "HTTP API under %d slow connections, %d s a phase, ordinary requests from 127.0.0.1\n", nslow, secs
		printf "  %-10s %9s %9s %9s %10s %10s %7s %7s\n", "phase", "req/s", "p50 ms", "p99 ms", "req/s / ref", "p50 / ref", "open", "closed"
		for (i = 1; i <= n; i++)
			printf "  %-10s %9.1f %9.2f %9.2f %10.2f %10.2f %7d %7d%s\n", name[i], rps[i], p50[i], p99[i],
			       rps[i] / rps[1], p50[i] / p50[1], open[i], closed[i], (failed[i] > 0 ? "  (" failed[i] " could not open)" : "")
	}'
