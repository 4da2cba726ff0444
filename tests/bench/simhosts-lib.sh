# tests/bench/simhosts-lib.sh: sourced by tests/test_simhosts.sh and
# tests/bench/bench-scale.sh.  Needs $B (top_builddir), $top_srcdir,
# $COTRAIN_DB, $PG_BINDIR and $T (a scratch folder the caller removes).
# sim_setup migrates the database, imports a small dataset and makes an
# account (its key in $KEY); sim_server [ARGS] starts cotrain-server on a
# free port ($SPID, $PORT, log in $T/server.log; sim_server_at LOG [ARGS]
# with another log); sim_project NAME TARGET
# makes a project of a tiny model (a few thousand parameters, so thousands
# of hosts' group sums stay small) with microbatch_size 1 and 8-second work
# units, spot checks off; sim_stop stops the server.
SPID=
sim_admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sim_sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
sim_setup() {
	mkdir -p "$T/text" &&
		head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt" &&
		sim_admin db migrate >/dev/null && sim_admin dataset import tiny "$T/text" >/dev/null || return 1
	KEY=$(echo secretpassword | sim_admin user create --password-stdin sim@example.org sim |
		sed -n 's/^account key: //p')
	[ -n "$KEY" ]
}
sim_server() { sim_server_at "$T/server.log" "$@"; }
# sim_server_at LOG [ARGS]: sim_server with its log in LOG (another
# process on the same database: the caller keeps the last one's $SPID)
sim_server_at() {
	_log=$1
	shift
	# Emptied here, not by the child's redirection, which may come after the
	# first look below: a restart would then see the last server's line.
	: >"$_log"
	"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --reap-interval 1 \
		--kdf-iterations 1000 --round-interval 1 --per-ip-connections 4096 --log-level warn "$@" \
		2>"$_log" &
	SPID=$!
	_n=600 # 60 s: a start under CI's load has taken over 30
	while [ $_n -gt 0 ] && ! grep -qs 'listening on' "$_log"; do
		kill -0 "$SPID" 2>/dev/null || { wait "$SPID"; echo "cotrain-server exited with status $? before listening" >>"$_log"; SPID=; return 1; }
		sleep 0.1
		_n=$((_n - 1))
	done
	PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$_log")
	[ -n "$PORT" ]
}
sim_project() { # NAME TARGET
	cat >"$T/$1.json" <<JSON
{"name": "$1", "title": "$1", "dataset": "tiny",
 "model": {"n_layer": 1, "n_shared": 1, "n_head": 2, "d_model": 16, "d_ff": 32, "seq_len": 8, "vocab": 256},
 "optimizer": {"type": "adamw", "lr": 0.001, "schedule": {"warmup_steps": 0, "total_steps": 100000, "decay": "constant"}},
 "target_batch": $2, "microbatch_size": 1, "seed": 3, "work_unit_seconds": 8}
JSON
	sim_admin project create "$T/$1.json" >"$T/$1.out" 2>&1 || return 1
	sim_sql "update spot_policy s set first_rate = 0, min_rate = 0 from project p
	  where p.id = s.project_id and p.name = '$1'" >/dev/null
}
sim_stop() {
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	SPID=
}
