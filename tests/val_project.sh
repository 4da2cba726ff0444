# cotrain tests: the set-up the validation tests share (tests/test_spot_sketch.sh,
# tests/test_sketch_bytes.sh, tests/test_sketch_seed2.sh,
# tests/test_sketch_seed2_alone.sh): a folder, a project "val" (a 2-layer
# GPT on the demo corpus's first 60,000 bytes), a cotrain-server and
# clients, each its own user, all torn down on every exit.  Source it after
# tests/tap.sh, once the test runs under tests/with-pgtmp.
#
#   val_init NAME              $T (/tmp/cotrain-NAME-XXXXXX) and the cleanup trap
#   val_project TARGET_BATCH   the project; $pid its id
#   val_server AVERAGE_TIMEOUT [ARGS...]
#                              the server ($SPID), listening on $PORT
#   start_client N THREADS [ENV...]
#                              client N ($P<N>, its host $H<N>), spot checks
#                              every $SPOT_INTERVAL seconds (3600)
#   stop_client N, stop_clients
# and admin, sql, wait_for SECONDS CMD..., version, version_at_least V.

val_init() {
	T=$(mktemp -d "/tmp/cotrain-$1-XXXXXX")
	SPID= CPIDS=
	trap val_cleanup EXIT INT TERM
}

val_cleanup() {
	for p in $CPIDS; do kill_ours -CONT "$p"; kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}

admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'val'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }

val_project() { # TARGET_BATCH
	mkdir -p "$T/text"
	head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
	cat >"$T/val.json" <<JSON
{"name": "val", "title": "val", "dataset": "tiny",
 "model": {"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": $1, "microbatch_size": 4, "seed": 11, "work_unit_seconds": 20}
JSON
	admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 tiny "$T/text" >/dev/null &&
		admin project create "$T/val.json" >/dev/null || bail_out "could not set up the project"
	pid=$(sql "select id from project where name = 'val'")
}

val_server() { # AVERAGE_TIMEOUT [ARGS...]
	_avg=$1
	shift
	"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --round-report-timeout 4 --round-average-timeout "$_avg" \
		--log-level info "$@" 2>"$T/server.log" &
	SPID=$!
	wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
	PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
}

start_client() { # N THREADS [ENV...]
	c_n=$1 c_t=$2
	shift 2
	mkdir -p "$T/cl$c_n"
	env "$@" "$B/client/cotrain-client" --state-dir "$T/cl$c_n" --socket "$T/cl$c_n/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$c_t" \
		--set socket_group=nonexistent --set log_level=info \
		--set spot_interval="${SPOT_INTERVAL:-3600}" 2>>"$T/client$c_n.log" &
	CPIDS="$CPIDS $!"
	eval "P$c_n=$!"
	_key=$(echo secretpassword | admin user create --password-stdin "c$c_n@example.org" "client $c_n" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$c_n/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$c_n/control.sock" attach "http://127.0.0.1:$PORT/projects/val" \
			--key "$_key" >/dev/null &&
		wait_for 30 grep -qs '"host_id": *[0-9]' "$T/cl$c_n/state.json" &&
		eval "H$c_n=$(grep -o '"host_id": *[0-9]*' "$T/cl$c_n/state.json" | grep -o '[0-9]*$' | head -1)"
}

stop_client() { # N
	eval "_p=\$P$1"
	kill "$_p" 2>/dev/null
	wait "$_p" 2>/dev/null
	CPIDS=$(pids_without "$CPIDS" "$_p")
	eval "P$1="
}

stop_clients() {
	for p in $CPIDS; do kill "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	CPIDS=
}
