#!/usr/bin/python3
"""cotrain tests: a plain TCP balancer in front of several cotrain-server
processes (tests/test_multi_server.sh, tests/bench/bench-multi-server.sh).

    tcp_balancer.py PORTFILE BACKEND_PORT...

Listens on 127.0.0.1 (a free port, written to PORTFILE once it accepts) and
hands each connection to the next backend on 127.0.0.1 in turn, skipping one
that refuses (a dead server), as any TCP balancer with a health check would.
It knows nothing of HTTP: a keep-alive connection stays on its backend until
either side closes it.  Runs until killed."""
import itertools
import os
import socket
import sys
import threading


def pump(src, dst):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client, backends, turn):
    for _ in range(len(backends)):
        port = backends[turn() % len(backends)]
        try:
            up = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            continue
        up.settimeout(None)
        threading.Thread(target=pump, args=(up, client), daemon=True).start()
        pump(client, up)
        return
    client.close()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: tcp_balancer.py PORTFILE BACKEND_PORT...")
    backends = [int(p) for p in sys.argv[2:]]
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    os.rename(tmp, sys.argv[1])
    count = itertools.count()
    lock = threading.Lock()

    def turn():
        with lock:
            return next(count)

    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c, backends, turn), daemon=True).start()


main()
