#!/bin/sh
# cotrain tests: the client against a server that misbehaves
# (tests/fake_server.py): garbage, wrong JSON types, impossible work units
# (hi <= lo, negative, longer than an epoch), an answer over the size cap, a
# file over max_file_bytes, a file missing, a file longer than announced, a
# corrupt download fetched again.  Each is a clear error in the log or
# `cotrainctl status` and the daemon keeps running.  Then, as root in a
# private mount namespace, the state folder on a tiny tmpfs: full, then
# read-only, while the daemon runs.
. "$top_srcdir/tests/tap.sh"
# skip N REASON: N tests reported as skipped (tap.sh has no such helper)
B=$top_builddir
command -v python3 >/dev/null 2>&1 || skip_all "python3 is needed for the fake server"
# Root: rerun in a private mount namespace, where the test mounts a tmpfs.
if [ "$(id -u)" = 0 ] && [ -z "$COTRAIN_IN_MNTNS" ] && command -v unshare >/dev/null &&
	unshare -m --propagation private true 2>/dev/null; then
	COTRAIN_IN_MNTNS=1 exec unshare -m --propagation private "$SHELL" "$0" "$@"
fi
T=$(mktemp -d /tmp/cotrain-faults-XXXXXX)
FPID= CPID=
cleanup() {
	[ -n "$CPID" ] && kill_ours -9 "$CPID" && wait "$CPID" 2>/dev/null
	[ -n "$FPID" ] && kill_ours "$FPID" && wait "$FPID" 2>/dev/null
	# the read-only bind and the tmpfs under it; one still busy is
	# detached lazily, so that the folder goes too
	if [ -n "$COTRAIN_IN_MNTNS" ]; then
		for _m in bind tmpfs; do umount "$T/cl" 2>/dev/null || umount -l "$T/cl" 2>/dev/null; done
	fi
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
ctl() { "$B/client/cotrainctl" --socket "$T/ctl.sock" "$@"; }
# wait_for SECONDS CMD...: poll CMD until it succeeds, for at most SECONDS
# of wall time (generous: the sanitizer build runs several times slower).
wait_for() {
	_end=$(($(date +%s) + $1)); shift
	while :; do
		"$@" && return 0
		[ "$(date +%s)" -lt "$_end" ] || return 1
		sleep 0.1
	done
}
log_has() { grep -q "$1" "$T/client.log"; }
fake_log() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
	"http://127.0.0.1:$PORT/_log"; }
alive() { kill -0 "$CPID" 2>/dev/null; }

plan 24

python3 "$top_srcdir/tests/fake_server.py" "$T/info.json" 2>"$T/fake.log" &
FPID=$!
wait_for 20 test -s "$T/info.json" || bail_out "the fake server did not start: $(cat "$T/fake.log")"
PORT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$T/info.json")
SMALL=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["small"]["sha256"])' "$T/info.json")

mkdir -p "$T/cl"
TMPFS= NO_TMPFS=
if [ "$(id -u)" != 0 ]; then
	NO_TMPFS="needs root to put the state folder on a tiny tmpfs"
elif ! command -v unshare >/dev/null; then
	NO_TMPFS="needs unshare (Debian package util-linux) to put the state folder on a tiny tmpfs"
elif [ -z "$COTRAIN_IN_MNTNS" ]; then
	bail_out "running as root, but unshare -m could not make a private mount namespace"
elif mount -t tmpfs -o size=512k tmpfs "$T/cl" 2>"$T/mount.err"; then
	TMPFS=1
else
	bail_out "running as root in a private mount namespace, but could not mount a tmpfs: $(cat "$T/mount.err")"
fi
"$B/client/cotrain-client" --state-dir "$T/cl" --socket "$T/ctl.sock" \
	--set heartbeat_interval=1 --set retry_base=1 --set retry_max=1 --set benchmark_seconds=1 \
	--set only_on_ac=false --set idle_detection=none --set max_threads=1 --set socket_group=nonexistent \
	--set max_file_bytes=1M 2>"$T/client.log" &
CPID=$!
wait_for 30 test -S "$T/ctl.sock" || bail_out "client did not start: $(cat "$T/client.log")"
ctl attach "http://127.0.0.1:$PORT/projects/fake" --key fakeaccountkey >/dev/null
ok $? "attach to the fake project"

# The scenarios come one per request for work, in this order.
wait_for 90 log_has "handing back work unit 9"
ok $? "the daemon went through every broken answer"
log_has "asking for work: server sent an invalid answer to POST .*/work"
ok $? "garbage: an invalid answer, said so"
log_has 'invalid work unit: field "lo"'
ok $? "wrong JSON types: the field is named"
log_has 'invalid work unit: field "hi"'
ok $? "hi <= lo: refused"
grep -c 'invalid work unit: field "lo"' "$T/client.log" | grep -q '^2$'
ok $? "a negative lo: refused"
log_has 'longer than an epoch'
ok $? "a range longer than an epoch: refused"
log_has 'larger than 1048576 bytes'
ok $? "an answer over the size cap: refused"
log_has 'field "files" must be an array'
ok $? "files that are not an array: refused"
log_has 'handing back work unit 6: .*more than the 1048576 bytes allowed'
ok $? "a file over max_file_bytes: handed back with the reason"
log_has 'handing back work unit 7: .*not on the server (404)'
ok $? "a missing file: handed back"
log_has 'handing back work unit 8: .*more than the 3000 bytes announced'
ok $? "a file longer than announced: handed back"
log_has "download: downloaded file has sha256 .*; retrying in"
ok $? "a corrupt download is reported"
log_has "downloaded $SMALL (3000 bytes)"
ok $? "and fetched again, verified"
test ! -e "$T/cl/downloads/$SMALL.part"
ok $? "no partial file is left behind"
# The client logs a hand-back before it sends it: wait for the server's side.
handbacks_seen() { fake_log >"$T/fake.jsonl" && [ "$(grep -c '"op": "handback"' "$T/fake.jsonl")" -ge "$1" ]; }
wait_for 30 handbacks_seen 4
n=$(grep -c '"op": "handback"' "$T/fake.jsonl")
is "$n" 4 "work units 6 to 9 were handed back to the server"
alive
ok $? "the daemon is still running"
ctl --json status >"$T/status.json"
is $? 0 "status answers"
# The next request for work fails a moment after the last hand-back.
no_work_shown() {
	ctl --json status >"$T/status.json" &&
		grep -q '"activity": "asking for work failed: server: no work for now' "$T/status.json"
}
wait_for 30 no_work_shown
ok $? "status shows the last error: $(grep -o '"activity": "[^"]*"' "$T/status.json")"

# The state folder fills up, then turns read-only, under the running daemon.
if [ -n "$TMPFS" ]; then
	dd if=/dev/zero of="$T/cl/filler" bs=4k 2>/dev/null
	ctl suspend >"$T/susp.out" 2>&1
	st=$?
	ok $([ $st = 1 ] && grep -q 'could not save the state' "$T/susp.out"; echo $?) \
		"disk full: suspend is refused with a clear message ($(cat "$T/susp.out"))"
	# The refused suspend found the disk full: status says so from then on.
	paused_full() { ctl --json status | grep -q '"paused": "the state cannot be saved"'; }
	wait_for 30 paused_full
	ok $? "disk full: computing pauses and status says why"
	rm -f "$T/cl/filler"
	wait_for 30 log_has "state saved again"
	ok $? "space freed: the state is saved again and computing resumes"
	# A read-only bind mount over the folder (the tmpfs itself cannot be
	# remounted read-only while the daemon holds its lock file open).
	if mount --bind "$T/cl" "$T/cl" && mount -o remount,ro,bind "$T/cl"; then
		ctl suspend >"$T/susp.out" 2>&1
		ok $([ $? = 1 ] && grep -q 'could not save the state' "$T/susp.out" && alive; echo $?) \
			"read-only state folder: refused with a clear message, daemon alive ($(cat "$T/susp.out"))"
		umount "$T/cl"
	else
		ok 1 "read-only state folder: the bind mount could not be made read-only as root"
	fi
	head -1 "$T/cl/state.json" | grep -q '^cotrain-client-state 1 '
	ok $? "state.json is intact"
else
	skip 5 "$NO_TMPFS"
fi
done_testing
