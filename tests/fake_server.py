#!/usr/bin/env python3
"""cotrain tests: a project server that misbehaves on purpose.

Serves just enough of the v1 API (doc/api.md) for cotrain-client to attach
to project "fake", then answers each POST /v1/projects/fake/work with the
next of a list of crafted answers (SCENARIOS below, all broken in one way),
and serves files in several broken ways.  Standard library only.

    fake_server.py INFO_FILE

Listens on 127.0.0.1 on a free port and writes INFO_FILE (JSON: port, and
the sha256 and size of the blobs "small" and "big") once it is ready.
Reports (heartbeat, finish, handback) are recorded; GET /_log returns them
as JSON lines.  Runs until killed.

Files: /files/<mode>/<blob> with mode
    good          the blob; honours Range
    corrupt-once  the first request gets the blob with one byte flipped
    oversize      the blob followed by 100 extra bytes
    missing       404
"""
import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOBS = {
    "small": bytes((i * 7 + 3) % 251 for i in range(3000)),
    "big": bytes((i * 13 + 5) % 251 for i in range(2 << 20)),
}
SHA = {k: hashlib.sha256(v).hexdigest() for k, v in BLOBS.items()}
STATE = {"work": 0, "corrupt_served": set(), "log": []}
LOCK = threading.Lock()

PROJECT = {"name": "fake", "title": "fake", "seq_len": 16, "microbatch_size": 2,
           "mb_per_epoch": 100, "flops_per_sample": 1000.0, "seed": 7, "target_batch": 64,
           "config": {"model": {"n_layer": 1, "n_shared": 1, "n_head": 2, "d_model": 32,
                                "d_ff": 64, "seq_len": 16, "vocab": 256}}}


def unit(wu, lo=0, hi=10, files=None):
    u = {"work_unit_id": wu, "version": 0, "lo": lo, "hi": hi,
         "deadline": "2099-01-01T00:00:00+00:00", "seq_len": 16, "microbatch_size": 2,
         "mb_per_epoch": 100, "files": files if files is not None else []}
    return u


def small(mode, size=None):
    return {"url": "/files/%s/small" % mode, "sha256": SHA["small"],
            "size": len(BLOBS["small"]) if size is None else size, "kind": "checkpoint"}


# (name, status, body): body is bytes (sent as is) or an object (as JSON).
SCENARIOS = [
    ("garbage", 200, b"<html>this is not json</html>"),
    ("wrong-types", 200, dict(unit(1), lo="zero", hi="ten")),
    ("hi-le-lo", 200, unit(2, lo=10, hi=10)),
    ("negative-lo", 200, unit(3, lo=-5, hi=5)),
    ("beyond-epoch", 200, unit(4, lo=0, hi=1 << 30)),
    ("huge-answer", 200, b'{"pad": "' + b"x" * (2 << 20) + b'"}'),
    ("files-not-array", 200, dict(unit(5), files="none")),
    ("size-over-cap", 200, unit(6, files=[small("good", size=2 << 20)])),
    ("file-missing", 200, unit(7, files=[small("missing")])),
    ("file-oversize", 200, unit(8, files=[small("oversize")])),
    ("file-corrupt-once", 200, unit(9, files=[small("corrupt-once")])),
]
NO_WORK = (503, {"error": {"code": "unavailable", "message": "no work for now"}})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body, extra=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    def do_GET(self):
        p = self.path
        if p == "/v1/account":
            return self.send(200, {"account_id": 1, "name": "tester"})
        if p == "/v1/projects/fake":
            return self.send(200, PROJECT)
        if p == "/_log":
            with LOCK:
                return self.send(200, "".join(json.dumps(e) + "\n" for e in STATE["log"]).encode())
        if p.startswith("/files/"):
            return self.file(p.split("/")[2:])
        return self.send(404, {"error": {"code": "not_found", "message": "no route " + p}})

    def file(self, parts):
        if len(parts) != 2 or parts[1] not in BLOBS:
            return self.send(404, {"error": {"code": "not_found", "message": "no such file"}})
        mode, name = parts
        data = BLOBS[name]
        if mode == "missing":
            return self.send(404, {"error": {"code": "not_found", "message": "file is gone"}})
        if mode == "oversize":
            data = data + b"\0" * 100
        if mode == "corrupt-once":
            with LOCK:
                first = name not in STATE["corrupt_served"]
                STATE["corrupt_served"].add(name)
            if first:
                data = bytes([data[0] ^ 1]) + data[1:]
        rng = self.headers.get("Range")
        if mode == "good" and rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
            data = data[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for i in range(0, len(data), 16384):
                self.wfile.write(data[i:i + 16384])
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self):
        p = self.path
        b = self.body()
        if p == "/v1/hosts":
            return self.send(201, {"host_id": 1, "host_token": "faketoken123"})
        if p.split("?")[0] == "/v1/projects/fake/work":
            with LOCK:
                i = STATE["work"]
                STATE["work"] += 1
                STATE["log"].append({"op": "work", "scenario": SCENARIOS[i][0] if i < len(SCENARIOS) else "none"})
            if i >= len(SCENARIOS):
                return self.send(*NO_WORK)
            return self.send(SCENARIOS[i][1], SCENARIOS[i][2])
        if p.startswith("/v1/workunits/"):
            parts = p.split("/")
            with LOCK:
                STATE["log"].append({"op": parts[4], "wu": int(parts[3]),
                                     "mb_done": (b or {}).get("mb_done")})
            return self.send(200, {"work_unit_id": int(parts[3]), "state": "ok"})
        return self.send(404, {"error": {"code": "not_found", "message": "no route " + p}})


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    info = {"port": srv.server_address[1]}
    for k in BLOBS:
        info[k] = {"sha256": SHA[k], "size": len(BLOBS[k])}
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.rename(tmp, sys.argv[1])
    srv.serve_forever()


if __name__ == "__main__":
    main()
