#!/bin/sh
# cotrain tests: the NAT service on loopback (no root needed), against the
# real server and a real PostgreSQL: registration and the dial-back, the
# brokered ladder (direct), a TLS session through the relay and its
# accounting, the relay's bandwidth cap, and bad input: a forged token, a
# host claiming another's id, a pair not in one group, a host not in the
# round, an unknown round, a replayed meeting, malformed and overlong lines.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/nat-lib.sh"
T=$(mktemp -d /tmp/cotrain-nat-XXXXXX)
NAT_DATA=$T
NAT_SPID=
cleanup() {
	nat_server_stop
	[ -n "$NAT_KEEP" ] && cp "$T/server.log" "$NAT_KEEP"; rm -rf "$T"
}
trap cleanup EXIT INT TERM

plan 26
"$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" db migrate >/dev/null ||
	bail_out "could not migrate"
# 1001, 1002 and 1005 in group 0, 1003 in group 1, 1004 registered but not in the round.
nat_seed "1001:0 1002:0 1003:1 1004:- 1005:0"
# A port found free may still be taken before the server binds it: try a
# few.
started=0
for _try in 1 2 3 4 5; do
	P=$(nat_free_port) || bail_out "no free port"
	if nat_server "$T/server.log" 127.0.0.1 "$P" --relay-bandwidth 1000000; then
		started=1
		break
	fi
done
[ $started = 1 ] || { cat "$T/server.log" >&2; bail_out "the server did not start"; }
NP=$((P + 1))
nat_drv mkca "$T" nattest || bail_out "could not make the CA"
common() { echo "--server 127.0.0.1 --nat-port $NP --host $1 --token $(nat_token "$1") --ca-dir $T --seconds 20"; }

# Registration: on loopback the server dials our listener back: public.
out=$(nat_drv observe $(common 1001))
case $out in "SEEN public independent 127.0.0.1 "*) ok 0 "a host on loopback is public ($out)" ;;
	*) ok 1 "a host on loopback is public ($out)" ;; esac
set -- $out
[ "$5" = "$6" ] && [ "$5" != 0 ]
ok $? "the public port is the same on both service ports"
code=$(curl -s -o "$T/nat.json" -w '%{http_code}' -H "Authorization: Bearer $nat_account_key" \
	"http://127.0.0.1:$P/v1/hosts/1001/nat")
[ "$code" = 200 ] && grep -q '"reachability": *"public"' "$T/nat.json"
ok $? "GET /v1/hosts/1001/nat shows the class ($code $(cat "$T/nat.json"))"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/v1/hosts/1001/nat")
is "$code" 401 "the host view needs the owner's account key"

# The brokered ladder between two public hosts: direct.
nat_drv accept $(common 1001) --peer 1002 >"$T/acc.out" 2>"$T/acc.err" &
APID=$!
out=$(nat_drv dial $(common 1002) --peer 1001 --target 127.0.0.1:1 --bytes 1048576 2>"$T/dial.err" | grep "^RUNG")
wait $APID; arc=$?
case $out in "RUNG direct "*) ok 0 "the ladder connects two public hosts directly ($out)" ;;
	*) ok 1 "the ladder connects two public hosts directly ($out; $(cat "$T/dial.err"))" ;; esac
[ $arc = 0 ] && grep -q "ACCEPTED plan=direct bytes=1048576" "$T/acc.out"
ok $? "the acceptor got the bytes over TLS ($(cat "$T/acc.out" "$T/acc.err" | tail -2))"

# The relay: 4 MiB through it, TLS end to end, under a 1 MB/s cap.
nat_drv accept $(common 1001) --peer 1002 --rung relay --bytes 4194304 >"$T/acc.out" 2>"$T/acc.err" &
APID=$!
t0=$(date +%s%N)
out=$(nat_drv dial $(common 1002) --peer 1001 --rung relay --bytes 4194304 2>"$T/dial.err" | grep "^RUNG")
t1=$(date +%s%N)
wait $APID; arc=$?
case $out in "RUNG relay "*) ok 0 "a TLS session goes through the relay ($out)" ;;
	*) ok 1 "a TLS session goes through the relay ($out; $(cat "$T/dial.err"))" ;; esac
[ $arc = 0 ] && grep -q "ACCEPTED plan=relay bytes=4194304" "$T/acc.out"
ok $? "the accepting side received everything through its listener ($(tail -1 "$T/acc.err"))"
ms=$(( (t1 - t0) / 1000000 ))
[ $ms -ge 2500 ]
ok $? "the relay holds a host to its 1 MB/s cap (4 MiB took $ms ms, at least 2500 expected)"
curl -s -H "Authorization: Bearer $nat_account_key" "http://127.0.0.1:$P/v1/hosts/1002/nat" >"$T/nat.json"
in=$(sed -n 's/.*"relay_bytes_in": *\([0-9]*\).*/\1/p' "$T/nat.json")
[ -n "$in" ] && [ "$in" -ge 4194304 ]
ok $? "the relay accounted the host's bytes ($in)"

# Bad input, each answered with a status and no effect on the others.
line() { nat_drv line --server 127.0.0.1 --nat-port $NP --host 1 --token x --seconds 5 "$@"; }
out=$(line OBSERVE 1001 nat-token-forged-0123456789abcd 127.0.0.1 5 0)
case $out in *"ERR 401 "*) ok 0 "a forged token is refused ($out)" ;; *) ok 1 "a forged token is refused ($out)" ;; esac
out=$(line OBSERVE 1001 "$(nat_token 1002)" 127.0.0.1 5 0)
case $out in *"ERR 403 "*) ok 0 "a host claiming another's id is refused ($out)" ;; *) ok 1 "a host claiming another's id is refused ($out)" ;; esac
out=$(line OBSERVE 1004 "$(nat_token 1004)" 10.9.9.9 5 0)
case $out in "SEEN 127.0.0.1 "*) case $out in *10.9.9.9*) st=1 ;; *) st=0 ;; esac ;; *) st=1 ;; esac
ok $st "a host naming another address is recorded (and dialed back) at the address the server sees ($out)"
out=$(line MEET nattest 0 1001 1003 "$(nat_token 1001)" DIAL)
case $out in *"ERR 403 "*) ok 0 "a meeting with a host of another group is refused ($out)" ;; *) ok 1 "a meeting with a host of another group is refused ($out)" ;; esac
out=$(line RELAY nattest 0 1001 1003 "$(nat_token 1001)" DIAL)
case $out in *"ERR 403 "*) ok 0 "a relay for a pair not in one group is refused ($out)" ;; *) ok 1 "a relay for a pair not in one group is refused ($out)" ;; esac
out=$(line RELAY nattest 0 1004 1001 "$(nat_token 1004)" DIAL)
case $out in *"ERR 403 "*) ok 0 "a host not in the round cannot use the relay ($out)" ;; *) ok 1 "a host not in the round cannot use the relay ($out)" ;; esac
out=$(line MEET nattest 7 1001 1002 "$(nat_token 1001)" DIAL)
case $out in *"ERR 404 "*) ok 0 "a meeting in a round that does not exist is refused ($out)" ;; *) ok 1 "a meeting in a round that does not exist is refused ($out)" ;; esac
line MEET nattest 0 1001 1005 "$(nat_token 1001)" DIAL >"$T/first.out" &
FPID=$!
sleep 0.5
# One meeting per connection: a few more halves of the same role queue
# behind the first (an all-reduce opens two connections per pair); one more
# than the broker's bound is a replay.
QPIDS=
for _q in 2 3 4; do
	line MEET nattest 0 1001 1005 "$(nat_token 1001)" DIAL >"$T/queued$_q.out" &
	QPIDS="$QPIDS $!"
done
sleep 0.5
out=$(line MEET nattest 0 1001 1005 "$(nat_token 1001)" DIAL)
case $out in *"ERR 409 "*) ok 0 "a replayed meeting is refused ($out)" ;; *) ok 1 "a replayed meeting is refused ($out)" ;; esac
kill $QPIDS 2>/dev/null; wait $QPIDS 2>/dev/null
out=$(line RELAY nattest 0 1005 1001 "$(nat_token 1005)")
case $out in *"ERR 400 "*) ok 0 "a relay request without its direction is refused ($out)" ;; *) ok 1 "a relay request without its direction is refused ($out)" ;; esac
out=$(line MEET nattest 0 1005 1001 "$(nat_token 1005)" ACCEPT)
wait $FPID
case "$out $(cat "$T/first.out")" in "GO "*"GO "*) ok 0 "the real partner completes the meeting ($out / $(cat "$T/first.out"))" ;;
	*) ok 1 "the real partner completes the meeting ($out / $(cat "$T/first.out"))" ;; esac
out=$(line HELLO there)
case $out in *"ERR 400 "*) ok 0 "an unknown request is refused ($out)" ;; *) ok 1 "an unknown request is refused ($out)" ;; esac
long=$(head -c 480 /dev/zero | tr '\0' a)
out=$(line "$long")
case $out in *"ERR 400 "*) ok 0 "an overlong line is refused (${out%%:*})" ;; *) ok 1 "an overlong line is refused ($out)" ;; esac
out=$(line MEET nattest 0 x 1002 "$(nat_token 1001)" DIAL)
case $out in *"ERR 400 "*) ok 0 "a malformed meeting is refused ($out)" ;; *) ok 1 "a malformed meeting is refused ($out)" ;; esac
# Idle connections hold no worker: 30 connections that say nothing, and
# one that sends its line a byte every 0.4 s, while a real request comes.
/usr/bin/python3 - "$NP" >"$T/idle.out" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
slow = socket.create_connection(("127.0.0.1", port))
t0 = time.time()
import select
try:
    for c in b"OBSERVE 1001 x 127.0.0.1 5 0\n":
        if select.select([slow], [], [], 0.4)[0]:
            break  # the server answered (and closes)
        slow.send(bytes([c]))
except OSError:
    pass
slow.settimeout(10)
try:
    answer = slow.recv(200).decode(errors="replace").strip()
except OSError as e:
    answer = "error %s" % e
print("slow %.1f %s" % (time.time() - t0, answer))
PY
IPID=$!
sleep 0.5
t0=$(date +%s%N)
out=$(line OBSERVE 1001 nat-token-forged-0123456789abcd 127.0.0.1 5 0)
ms=$((($(date +%s%N) - t0) / 1000000))
case $out in *"ERR 401 "*) [ "$ms" -lt 1500 ] ;; *) false ;; esac
ok $? "30 idle connections delay no one: a request is answered in $ms ms ($out)"
wait $IPID
out=$(cat "$T/idle.out")
case $out in "slow "[3-4].*"ERR 408 "*) ok 0 "a line sent a byte at a time is cut at 3 s from the accept ($out)" ;;
	*) ok 1 "a line sent a byte at a time is cut at 3 s from the accept ($out)" ;; esac
kill -0 "$NAT_SPID"
ok $? "the server is still running"
done_testing
