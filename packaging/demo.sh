#!/bin/sh
# The main job: a small real collaborative training run on the embedded
# default.  Installs what is missing, builds, then:
#   1. creates a server data directory whose PostgreSQL cluster is private
#      (no database configured: the embedded default),
#   2. imports the demo corpus and publishes the demo project
#      (packaging/demo/project.json),
#   3. starts cotrain-server and several volunteer clients on this machine,
#      attached with an account key,
#   4. shows them fetching work, computing gradients with the real kernels
#      and reporting progress, and the server filling the first round's
#      global batch, for COTRAIN_DEMO_SECONDS seconds,
#   5. stops everything and prints the server's summary.
# Settings (environment): COTRAIN_DEMO_DIR (default /var/tmp/cotrain-demo,
# recreated on each run), COTRAIN_DEMO_PORT (8480), COTRAIN_DEMO_CLIENTS (2),
# COTRAIN_DEMO_SECONDS (60).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/packaging/build.sh"
B="$top/_build"
DIR=${COTRAIN_DEMO_DIR:-/var/tmp/cotrain-demo}
PORT=${COTRAIN_DEMO_PORT:-8480}
CLIENTS=${COTRAIN_DEMO_CLIENTS:-2}
RUN_SECONDS=${COTRAIN_DEMO_SECONDS:-60}
URL="http://127.0.0.1:$PORT"

say() { printf '\n== %s\n' "$*"; }
admin() { "$B/server/cotrain-admin" --data-dir "$DIR/server" "$@"; }

SPID=
CPIDS=
cleanup() {
	for p in $CPIDS; do kill "$p" 2>/dev/null || true; done
	for p in $CPIDS; do wait "$p" 2>/dev/null || true; done
	if [ -n "$SPID" ]; then kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh run directory; when root, the private cluster runs as an
# unprivileged user, which must be able to reach it.
case "$DIR" in /|"") echo "demo: refusing COTRAIN_DEMO_DIR=\"$DIR\"" >&2; exit 1 ;; esac
if [ -e "$DIR" ] && [ ! -f "$DIR/.cotrain-demo" ]; then
	echo "demo: $DIR exists and is not a cotrain demo directory; choose another COTRAIN_DEMO_DIR" >&2
	exit 1
fi
rm -rf "$DIR"
mkdir -p "$DIR"
touch "$DIR/.cotrain-demo"
chmod 755 "$DIR"

say "publishing the demo project (embedded PostgreSQL under $DIR/server/pg)"
admin db migrate
admin dataset import demo "$top/packaging/demo/corpus.txt"
admin project create "$top/packaging/demo/project.json"
KEY=$(echo demo-password | admin user create --password-stdin volunteer@example.org "Demo volunteer" |
	sed -n 's/^account key: //p')
[ -n "$KEY" ] || { echo "demo: could not create the volunteer account" >&2; exit 1; }

say "starting cotrain-server on $URL"
"$B/server/cotrain-server" --data-dir "$DIR/server" --port "$PORT" --log-level warn \
	>"$DIR/server.log" 2>&1 &
SPID=$!
n=0
until grep -q 'listening on' "$DIR/server.log"; do
	n=$((n + 1))
	if [ $n -gt 600 ] || ! kill -0 "$SPID" 2>/dev/null; then
		cat "$DIR/server.log" >&2
		echo "demo: the server did not start" >&2
		exit 1
	fi
	sleep 0.1
done
grep 'listening on' "$DIR/server.log" | head -1

say "starting $CLIENTS volunteer clients, attached with the account key"
i=1
while [ "$i" -le "$CLIENTS" ]; do
	st="$DIR/client$i"
	mkdir -p "$st"
	"$B/client/cotrain-client" --state-dir "$st" --socket "$st/control.sock" \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set heartbeat_interval=5 --log-level warn 2>"$st/client.log" &
	CPIDS="$CPIDS $!"
	n=0
	until [ -S "$st/control.sock" ]; do
		n=$((n + 1))
		[ $n -gt 300 ] && { cat "$st/client.log" >&2; echo "demo: client $i did not start" >&2; exit 1; }
		sleep 0.1
	done
	"$B/client/cotrainctl" --socket "$st/control.sock" attach "$URL/projects/demo" --key "$KEY"
	i=$((i + 1))
done

say "training for $RUN_SECONDS seconds (Ctrl-C stops early)"
end=$(( $(date +%s) + RUN_SECONDS ))
while [ "$(date +%s)" -lt "$end" ]; do
	sleep 10
	info=$(curl -fsS "$URL/v1/projects/demo" 2>/dev/null | tr -d ' \n') || info=
	field() { echo "$info" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
	echo "-- server: model version $(field current_version), global batch $(field accumulated_samples) of $(field target_batch) samples"
	i=1
	while [ "$i" -le "$CLIENTS" ]; do
		echo "-- client $i"
		"$B/client/cotrainctl" --socket "$DIR/client$i/control.sock" status || true
		i=$((i + 1))
	done
done

say "server summary"
admin status --work-units 5 || true
echo
echo "demo: done; logs and data are in $DIR"
