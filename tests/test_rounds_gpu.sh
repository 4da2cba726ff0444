#!/bin/sh
# cotrain tests: a GPU volunteer in rounds with CPU peers (issue 23; on a
# GPU machine, tests/gpu-device-check.sh runs it).  A real PostgreSQL,
# cotrain-server and three cotrain-client daemons train a small GPT whose
# attention takes the GPU's fused path (head size 64, T 128) in the
# project's default precision, bf16: client 1 computes on the GPU, clients 2
# and 3 on the CPU.  Then:
#   - the GPU client found the GPU, reported it and its benchmark with its
#     host (faster than its CPU: the server sizes its units to it), and
#     cotrainctl status says it computes there;
#   - rounds commit with the GPU host and CPU hosts included, and in every
#     committed round each included peer's parameters hash to the round's
#     (the GPU peer applied the same bytes as the CPU peers);
#   - spot checks between the GPU host and CPU hosts agree (the tolerance
#     has the bf16 floor, db/functions/spot_precision.sql): no honest host
#     is flagged;
#   - a device fault on the GPU right after a microbatch (fault point
#     gpu-step:fail) falls back to the CPU for the rest of its session (the
#     next session tries the GPU again): the microbatches whose gradient the
#     GPU held are computed again there, so the bytes the host averages
#     match the sketches it committed (no host flagged), and no microbatch
#     is lost or trained twice (the stream's tiling, tests/invariants.sh).
# With GPU_ROUNDS_MODEL=albert (tests/test_rounds_gpu_encoder.sh) the
# project trains a small ALBERT instead (masked language modelling and
# sentence order, head size 64, T 128: the fused attention over every key),
# with the same checks.  With GPU_ROUNDS_MODE=local
# (tests/test_rounds_gpu_local.sh) the GPT trains in local mode (inner
# AdamW steps every 2 microbatches, which the GPU client takes on the GPU,
# kernels/local.h): the GPU client's inner steps stay there (no fallback
# to the CPU's), and the device fault makes it compute the round's
# microbatches again on the CPU from theta_v.
# Without a CUDA build or a usable GPU it skips, with the reason.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
B=$top_builddir
CUDA_LIB=${COTRAIN_TEST_CUDA_LIB:-}
[ -n "$CUDA_LIB" ] || skip_all "this build has no CUDA backend (configure --with-cuda)"
why=$(COTRAIN_CUDA_LIB=$CUDA_LIB "$B/tests/test_gpu_kernels" --probe 2>&1) || skip_all "no usable GPU: $why"
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-gpu-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill -9 "$p" 2>/dev/null; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
version() { sql "select current_version from project where name = 'gpu'"; }
host_of() { grep -o '"host_id": *[0-9]*' "$T/cl$1/state.json" | grep -o '[0-9]*$' | head -1; }
ctl() { "$B/client/cotrainctl" --socket "$T/cl$1/control.sock" "$2"; }
start_client() { # N USE_GPU THREADS
	mkdir -p "$T/cl$1"
	env ${FAULT:+COTRAIN_FAULT=$FAULT} COTRAIN_CUDA_LIB="$CUDA_LIB" "$B/client/cotrain-client" \
		--state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads="$3" --set use_gpu="$2" \
		--set socket_group=nonexistent --set log_level=info --set spot_interval=2 2>>"$T/client$1.log" &
	CPIDS="$CPIDS $!"
	# Each volunteer its own account: spot checks pair hosts of different
	# accounts.
	_key=$(echo secretpassword | admin user create --password-stdin "c$1@example.org" "client $1" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$1/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$1/control.sock" attach "http://127.0.0.1:$PORT/projects/gpu" \
			--key "$_key" >/dev/null
}

plan 7
mkdir -p "$T/text"
head -c 200000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
MODEL='{"n_layer": 2, "n_shared": 2, "n_head": 2, "d_model": 128, "d_ff": 512, "seq_len": 128, "vocab": 256}'
[ "${GPU_ROUNDS_MODEL:-gpt}" = albert ] &&
	MODEL='{"arch": "albert", "n_layer": 2, "n_shared": 1, "n_head": 2, "d_model": 128, "d_embed": 64, "d_ff": 512, "seq_len": 128}'
MODE=
[ "${GPU_ROUNDS_MODE:-sync}" = local ] &&
	MODE=', "mode": "local", "inner_batch": 2, "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}'
cat >"$T/project.json" <<JSON
{"name": "gpu", "title": "a GPU among CPUs", "dataset": "gpu",
 "model": $MODEL,
 "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 128, "microbatch_size": 2, "seed": 23, "work_unit_seconds": 10$MODE}
JSON
admin db migrate >/dev/null || bail_out "could not migrate the database"
admin dataset import --shard-tokens 65536 gpu "$T/text" >/dev/null 2>&1 || bail_out "could not import the text"
admin project create "$T/project.json" >"$T/project.out" 2>&1 || bail_out "could not set up the project: $(cat "$T/project.out")"
# Units of at most 4 microbatches: the CPU peers get their part of each
# round beside a GPU many times faster.
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 4 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 15 --round-average-timeout 20 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

start_client 1 true 1 && start_client 2 false 2 && start_client 3 false 2 || bail_out "a client did not start"
H1=$(host_of 1) H2=$(host_of 2) H3=$(host_of 3)
[ -n "$H1" ] && [ -n "$H2" ] && [ -n "$H3" ] || bail_out "a client has no host id"

computes_on_gpu() { ctl 1 status | grep -q '^computes on: GPU 0 ('; }
ok "$(wait_for 120 computes_on_gpu && ! grep -q 'inner steps run on the CPU' "$T/client1.log"; echo $?)" \
	"the GPU client computes on the GPU, local mode's inner steps too ($(ctl 1 status | grep '^computes on'); $(grep -m1 'computing on GPU' "$T/client1.log" | sed 's/.*computing on/computing on/'))"
hw=$(sql "select h.gpu || ' | ' || h.flops || ' ' || (select max(flops) from host where id in ($H2, $H3)) from host h where h.id = $H1")
fl=${hw#* | }
ok "$(case ${hw%% | *} in '' | none) false ;; esac && awk -v a="${fl% *}" -v b="${fl#* }" 'BEGIN { exit !(a > b) }'; echo $?)" \
	"the GPU host reports its GPU and a benchmark above the CPU hosts' (GPU, FLOP/s, the CPU hosts' best: $hw; $(grep -m1 'GPU 0 benchmark' "$T/client1.log" | sed 's/.*GPU 0 benchmark/GPU 0 benchmark/'))"

# Rounds where the GPU host and a CPU host both trained and were included.
mixed() { sql "select count(*) from (select r.version from round r join round_member m using (project_id, version)
  join round_report rr on rr.project_id = m.project_id and rr.version = m.version and rr.host_id = m.host_id
  where r.state = 'committed' and m.included and rr.mb_done > 0
  group by r.version having bool_or(m.host_id = $H1) and bool_or(m.host_id <> $H1)) x"; }
mixed_at_least() { [ "$(mixed)" -ge "$1" ] 2>/dev/null; }
wait_for 240 mixed_at_least 3
ok $? "rounds commit with the GPU peer and CPU peers computing ($(mixed) such rounds, version $(version))"

# Each included peer holds the round's parameters: the same sha256.
hs=$(sql "select count(*) filter (where m.params_sha256 = r.params_sha256 and m.host_id = $H1) || ' ' ||
  count(*) filter (where m.params_sha256 = r.params_sha256) || ' ' ||
  count(*) filter (where m.params_sha256 is distinct from r.params_sha256)
  from round r join round_member m using (project_id, version) where r.state = 'committed' and m.included")
ok "$(set -- $hs; [ "$1" -ge 3 ] && [ "$3" = 0 ]; echo $?)" \
	"every included peer's parameters hash to the committed round's, the GPU peer's too (GPU peer, all peers agreeing, disagreeing: $hs)"

# Spot checks between the two kinds of host agree.
checked() { [ "$(sql "select count(*) from spot_check where state = 'agreed' and
  ((host_id = $H1 and checker_id <> $H1) or (checker_id = $H1 and host_id <> $H1))")" -ge 1 ]; }
wait_for 180 checked
sc=$(sql "select coalesce(string_agg(host_id || '>' || checker_id || ' ' || state || ' ' || to_char(distance, '9.9EEEE') || '/' || tolerance, ', ' order by id), 'none')
  from spot_check where checker_id is not null")
nbad=$(sql "select count(*) from spot_check where state = 'disagreed'")
ok "$(checked && [ "$nbad" = 0 ]; echo $?)" \
	"spot checks between the GPU host and the CPU hosts agree, none disagreed (host>checker state distance/tolerance: $sc)"

# A device fault: a fourth client, on the GPU, whose first GPU microbatch
# fails.  It goes on on the CPU; its unit is reported whole.
V0=$(version)
FAULT=gpu-step:fail start_client 4 true 1 || bail_out "client 4 did not start"
fell_back() { grep -q 'computing on the CPU from now on' "$T/client4.log"; }
H4=$(host_of 4)
in_round() { [ "$(sql "select count(*) from round r join round_member m using (project_id, version)
  where r.state = 'committed' and m.included and m.host_id = ${H4:-0} and r.version > $V0")" -ge 1 ]; }
wait_for 180 fell_back && wait_for 180 in_round
fb=$?
# The microbatches the GPU held were computed again on the CPU: the bytes
# each peer averaged match the sketches it committed (doc/credit.md, "Tied
# to the bytes"), or the host would be flagged.
nflag=$(sql "select count(*) from round_sketch_flag")
ok "$([ "$fb" = 0 ] && [ "$nflag" = 0 ]; echo $?)" \
	"a device fault on the GPU falls back to the CPU, the microbatches whose gradient it held are computed again, and the host's work commits unflagged ($(grep -m1 'GPU 0 failed' "$T/client4.log" | sed 's/.*GPU 0 failed/GPU 0 failed/'); $(grep -m1 'GPU 0 held' "$T/client4.log" | sed 's/.*GPU 0 held/GPU 0 held/'); hosts flagged: $nflag; its next session: $(ctl 4 status | grep '^computes on'))"

for p in $CPIDS; do kill "$p"; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=
coverage_exact gpu "no microbatch lost or trained twice across the GPU and CPU peers and the fault"
