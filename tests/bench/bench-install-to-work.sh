#!/bin/sh
# cotrain benchmark: a new volunteer's time from `apt install
# ./cotrain-client_*.deb` plus one attach command to the first work unit
# computed (issue 22's goal: under 60 s), against a cotrain-server installed
# from its package, beside the same daemon from the build tree attaching with
# no install (the reference, in the same run), as a ratio.
#
#   sudo tests/bench/bench-install-to-work.sh
#
# As root, with the packaging tools (packaging/install-deps.sh): builds the
# packages with packaging/build-debs.sh (not timed; skipped when current),
# installs cotrain-server (not timed) and runs it on a throwaway PostgreSQL
# (tests/with-pgtmp) with a small project; then, timed: apt-get install of
# the client package, the daemon started as its unit starts it (there is no
# systemd here: the unit's ExecStart as the user cotrain (setpriv), with the packaged
# /etc/cotrain/client.conf, so the benchmark of the first start counts),
# cotrainctl attach, until the server has the first finished work unit of the
# new host.  Prints each step's seconds.  Nothing is asserted; the machine is
# left as it was (the packages purged, the users they made removed), as in
# tests/test_debs.sh.  Not run by make check.
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "bench-install-to-work: $*"; }
[ "$(id -u)" -eq 0 ] || { say "needs root (apt install)" >&2; exit 1; }
for p in cotrain-client cotrain-server; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
		say "$p is installed on this machine; this benchmark would remove it" >&2
		exit 1
	fi
done
[ -z "${COTRAIN_DB:-}" ] && exec "$b/tests/with-pgtmp" "$0" "$@"

version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$b/config.h")
had_user=0; getent passwd cotrain >/dev/null && had_user=1
had_group=0; getent group cotrain >/dev/null && had_group=1
had_suser=0; getent passwd cotrain-server >/dev/null && had_suser=1
had_sgroup=0; getent group cotrain-server >/dev/null && had_sgroup=1
had_sdata=0; [ -e /var/lib/cotrain ] && had_sdata=1
T=$(mktemp -d /tmp/cot-bench-install-XXXXXX)
chmod 755 "$T"
spid= dpid= rpid=
cleanup() {
	set +e # every step runs, whatever the one before gave
	for p in $dpid $rpid $spid; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
	dpkg --purge cotrain-client cotrain-server >/dev/null 2>&1
	[ "$had_sdata" = 1 ] || rm -rf /var/lib/cotrain
	[ "$had_user" = 1 ] || userdel cotrain 2>/dev/null
	[ "$had_group" = 1 ] || groupdel cotrain 2>/dev/null
	[ "$had_suser" = 1 ] || userdel cotrain-server 2>/dev/null
	[ "$had_sgroup" = 1 ] || groupdel cotrain-server 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
sql() { psql "$COTRAIN_DB" -Atqc "$1"; }
# wait_done SECONDS HOST: until host HOST has a finished work unit
wait_done() {
	_n=$(($1 * 10))
	while [ $_n -gt 0 ]; do
		[ "$(sql "select count(*) from work_unit where host_id = $2 and state = 'done'")" -ge 1 ] && return 0
		sleep 0.1
		_n=$((_n - 1))
	done
	return 1
}
# wait_sock SECONDS SOCKET
wait_sock() { _n=$(($1 * 10)); while [ $_n -gt 0 ] && [ ! -S "$2" ]; do sleep 0.1; _n=$((_n - 1)); done; [ -S "$2" ]; }
host_of() {  # SOCKET: the host id cotrainctl status shows
	"$1" --socket "$2" --json status | sed -n 's/.*"host_id": \([0-9]*\),*$/\1/p' | head -1
}

say "building the packages (not timed)"
out=$b/debs
timeout 1800 "$src/packaging/build-debs.sh" "$out" >"$T/build" 2>&1 || { tail -20 "$T/build"; exit 1; }
client_deb=$(ls "$out"/cotrain-client_"$version"_*.deb)
server_deb=$(ls "$out"/cotrain-server_"$version"_*.deb)
say "installing cotrain-server and a project (not timed)"
apt-get install -y -qq "$server_deb" >"$T/apt-server" 2>&1 || { cat "$T/apt-server"; exit 1; }
mkdir -p "$T/text"
head -c 60000 "$src/packaging/demo/corpus.txt" >"$T/text/a.txt"
cat >"$T/project.json" <<'JSON'
{"name": "bench", "title": "install to work", "dataset": "bench",
 "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256, "seq_len": 32, "vocab": 256},
 "target_batch": 100000, "microbatch_size": 4, "seed": 7, "work_unit_seconds": 5}
JSON
A() { /usr/bin/cotrain-admin --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
A db migrate >/dev/null && A dataset import bench "$T/text" >/dev/null && A project create "$T/project.json" >/dev/null
KEY=$(echo secretpassword | A user create --password-stdin v@example.org vol | sed -n 's/^account key: //p')
/usr/bin/cotrain-server --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --log-level warn 2>"$T/server.log" &
spid=$!
_n=200; while [ $_n -gt 0 ] && ! grep -q 'listening on' "$T/server.log"; do sleep 0.1; _n=$((_n - 1)); done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
[ -n "$PORT" ] || { cat "$T/server.log"; exit 1; }
URL=http://127.0.0.1:$PORT/projects/bench

# The reference: the build tree's daemon, already on the machine, from its
# start (with a fresh state, so it benchmarks too) and attach to its first
# finished work unit.
say "reference: the build tree's client, start and attach, no install"
t0=$(now)
"$b/client/cotrain-client" --config "$src/packaging/client.conf" --state-dir "$T/ref" \
	--socket "$T/ref/control.sock" --set socket_group=nonexistent 2>"$T/ref.log" &
rpid=$!
wait_sock 60 "$T/ref/control.sock"
"$b/client/cotrainctl" --socket "$T/ref/control.sock" attach "$URL" --key "$KEY" >/dev/null
h=$(host_of "$b/client/cotrainctl" "$T/ref/control.sock")
wait_done 300 "$h" || { say "the reference client never finished a unit"; tail "$T/ref.log"; exit 1; }
t1=$(now)
ref_host=$h
ref=$(secs "$t0" "$t1")
kill "$rpid"; wait "$rpid" 2>/dev/null || true; rpid=

say "timed: apt install, the daemon as its unit starts it, one attach, the first unit"
sock=/var/lib/cotrain-client/control.sock
t0=$(now)
apt-get install -y -qq "$client_deb" >"$T/apt-client" 2>&1 || { cat "$T/apt-client"; exit 1; }
t_apt=$(now)
# setpriv execs the daemon, so $! is the daemon itself
setpriv --reuid=cotrain --regid=cotrain --init-groups /usr/bin/cotrain-client --config /etc/cotrain/client.conf \
	--socket "$sock" >"$T/daemon.log" 2>&1 &
dpid=$!
wait_sock 60 "$sock" || { cat "$T/daemon.log"; exit 1; }
t_up=$(now)
/usr/bin/cotrainctl --socket "$sock" attach "$URL" --key "$KEY" >/dev/null
t_att=$(now)
h=$(host_of /usr/bin/cotrainctl "$sock")
wait_done 300 "$h" || { say "the installed client never finished a unit"; tail "$T/daemon.log"; exit 1; }
t_done=$(now)
total=$(secs "$t0" "$t_done")
unit=$(sql "select id || ': ' || (hi - lo) || ' microbatches' from work_unit where host_id = $h and state = 'done' order by id limit 1")
echo "hosts: reference $ref_host, installed client $h (unit $unit)"
echo "apt install:                 $(secs "$t0" "$t_apt") s"
echo "daemon start (benchmark):    $(secs "$t_apt" "$t_up") s"
echo "attach:                      $(secs "$t_up" "$t_att") s"
echo "first work unit computed:    $(secs "$t_att" "$t_done") s (work_unit_seconds 5)"
echo "install to first unit:       $total s (goal under 60 s)"
echo "reference (no install):      $ref s"
echo "ratio:                       $(awk -v a="$total" -v r="$ref" 'BEGIN { printf "%.2f", a / r }')"
echo "packages: $(du -k "$client_deb" "$server_deb" | awk '{printf "%s %s KiB; ", $2, $1}' | sed "s|$out/||g")"
