#!/bin/sh
# cotrain tests: held-out evaluation end to end (issue 19).  A real
# PostgreSQL (tests/with-pgtmp), cotrain-server and two cotrain-client
# daemons train a tiny model on a dataset imported with a held-out part;
# then:
#   - no work unit ever covered a held-out token (every microbatch of every
#     unit, mapped to its tokens, against the dataset's boundary), and no
#     held-out shard was ever downloaded by a client;
#   - the server evaluated every committed version, and each value equals
#     tests/heldout_bpb's (the same sequences read from the text file,
#     through the kernels one sequence at a time) within 1e-6 relative;
#   - held-out bits per byte fall from version 0 to the last;
#   - the API (rounds and project), /metrics and cotrain-admin status show
#     them.
# It prints the evaluation's CPU seconds per version against the clients'.
# With HELDOUT_MODE=encoder (tests/test_heldout_encoder.sh) the model is a
# tiny ALBERT on bytes, and the figures are the held-out masked-LM loss and
# accuracy (model_version.heldout_mlm_*), checked the same ways.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
T=$(mktemp -d /tmp/cotrain-heldout-XXXXXX)
SPID= CPIDS=
cleanup() {
	for p in $CPIDS; do kill_ours -9 "$p"; done
	for p in $CPIDS; do wait "$p" 2>/dev/null; done
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	if [ -n "$KEEP_LOGS" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }
ENC=$([ "${HELDOUT_MODE:-gpt}" = encoder ] && echo 1 || echo 0)
# The figure each version gets: bits per byte, or an encoder's MLM loss.
FIG=$([ "$ENC" = 1 ] && echo heldout_mlm_loss || echo heldout_bpb)
version() { sql "select current_version from project where name = 'tiny'"; }
version_at_least() { [ "$(version)" -ge "$1" ] 2>/dev/null; }
evaluated_through() { [ "$(sql "select count(*) from model_version m join project p on p.id = m.project_id
  where p.name = 'tiny' and m.version <= $1 and m.$FIG is not null")" -ge $(($1 + 1)) ]; }

start_client() { # N
	mkdir -p "$T/cl$1"
	"$B/client/cotrain-client" --state-dir "$T/cl$1" --socket "$T/cl$1/control.sock" \
		--set heartbeat_interval=1 --set retry_base=1 --set retry_max=2 --set benchmark_seconds=1 \
		--set only_on_ac=false --set idle_detection=none --set max_threads=1 \
		--set socket_group=nonexistent --set log_level=info 2>>"$T/client$1.log" &
	CPIDS="$CPIDS $!"
	_key=$(echo secretpassword | admin user create --password-stdin "c$1@example.org" "client $1" |
		sed -n 's/^account key: //p')
	wait_for 30 test -S "$T/cl$1/control.sock" &&
		"$B/client/cotrainctl" --socket "$T/cl$1/control.sock" attach "http://127.0.0.1:$PORT/projects/tiny" \
			--key "$_key" >/dev/null
}

plan $((11 + ENC))

mkdir -p "$T/text"
head -c 60000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
MODEL='{"n_layer": 2, "n_shared": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "seq_len": 16, "vocab": 256}'
[ "$ENC" = 1 ] &&
	MODEL='{"arch": "albert", "n_layer": 2, "n_shared": 1, "n_head": 4, "d_model": 64, "d_embed": 32, "d_ff": 256, "seq_len": 16}'
cat >"$T/project.json" <<JSON
{"name": "tiny", "title": "tiny held-out", "dataset": "tiny",
 "model": $MODEL,
 "optimizer": {"type": "adamw", "lr": 0.01, "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"warmup_steps": 0, "total_steps": 1000, "decay": "constant"}},
 "target_batch": 192, "microbatch_size": 2, "seed": 11, "work_unit_seconds": 20}
JSON
# 10% held out: the last 6000 bytes of the one document.
admin db migrate >/dev/null && admin dataset import --shard-tokens 16384 --heldout-fraction 0.1 tiny "$T/text" >/dev/null ||
	bail_out "could not import the text"
if [ "$ENC" = 1 ]; then
	sed 's/"d_embed": 32,/"d_embed": 32, "unk_id": 65,/' "$T/project.json" >"$T/bad-unk.json"
	out=$(admin project create "$T/bad-unk.json" 2>&1)
	ok $(echo "$out" | grep -q 'field "model.unk_id" must be -1 for dataset "tiny"' &&
		[ "$(sql "select count(*) from project")" = 0 ]; echo $?) "a byte encoder with an unknown token is refused: $out"
fi
admin project create "$T/project.json" >"$T/project.out" || bail_out "could not set up the project"
HELD=$(sql "select heldout_tokens from dataset where name = 'tiny'")
NTOK=$(sql "select n_tokens from dataset where name = 'tiny'")
is "$HELD $NTOK" "6000 60000" "the dataset holds out its last 6000 tokens"

"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --wu-max 3 --reap-interval 1 \
	--kdf-iterations 1000 --round-interval 1 --round-report-timeout 8 --round-average-timeout 20 \
	--log-level info 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs 'listening on' "$T/server.log" || bail_out "the server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
start_client 1 && start_client 2 || bail_out "a client did not start"
wait_for 240 version_at_least 5
ok $? "two clients commit five rounds (version $(version))"
wait_for 60 evaluated_through 5
ok $? "the server evaluated versions 0 to 5 on the held-out sample"
# The API and the other views, while the run goes on.
curl -sf "http://127.0.0.1:$PORT/v1/projects/tiny/rounds" >"$T/rounds.json"
curl -sf "http://127.0.0.1:$PORT/v1/projects/tiny" >"$T/project.json.out"
curl -sf "http://127.0.0.1:$PORT/metrics" >"$T/metrics.txt"
admin status >"$T/status.txt"
for p in $CPIDS; do kill "$p" 2>/dev/null; done
for p in $CPIDS; do wait "$p" 2>/dev/null; done
CPIDS=
V=$(version)
wait_for 60 evaluated_through "$V"

# No work unit covered a held-out token: microbatch g of a unit reads tokens
# [m*B*T, (m+1)*B*T + 1) with m = g % mb_per_epoch; the held-out part starts
# at n_tokens - heldout_tokens.
bad=$(sql "select count(*) from work_unit w join project p on p.id = w.project_id
  join dataset d on d.id = p.dataset_id
  cross join lateral generate_series(w.lo, w.hi - 1) g
  where ((g % p.mb_per_epoch) + 1) * p.microbatch_size * p.seq_len + 1 > d.n_tokens - d.heldout_tokens")
units=$(sql "select count(*) || ' units, ' || coalesce(sum(hi - lo), 0) || ' microbatches' from work_unit")
is "$bad" 0 "no microbatch of any work unit ($units) reads a held-out token"
# Nor did any client fetch a held-out shard.
fetched=0
for s in $(sql "select s.sha256 from shard s join dataset d on d.id = s.dataset_id
  where s.first_token >= d.n_tokens - d.heldout_tokens"); do
	grep -qs "$s" "$T"/client*.log && fetched=$((fetched + 1))
	[ -n "$(find "$T"/cl* -name "$s*" 2>/dev/null)" ] && fetched=$((fetched + 1))
done
is "$fetched" 0 "no client downloaded a held-out shard"

# Every version against the independent computation.
NSEQ=$(sql "select least(32, (heldout_tokens - 1) / 16) from dataset where name = 'tiny'")
sql "select m.version, m.checkpoint_sha256, m.$FIG, m.heldout_mlm_accuracy from model_version m join project p on p.id = m.project_id
  where p.name = 'tiny' order by m.version" | tr '|' ' ' >"$T/server.bpb"
ckpts=$(awk -v d="$T/srv/files" '{ print d "/" substr($2, 1, 2) "/" $2 }' "$T/server.bpb")
"$B/tests/heldout_bpb" "$T/text/a.txt" "$HELD" "$NSEQ" $ckpts >"$T/check.bpb" 2>"$T/check.err"
# The second figure (an encoder's accuracy) must agree too.
cmp_bpb=$(awk 'NR == FNR { want[NR] = $2; acc[NR] = $3; n = NR; next }
  { got = $3; if (got == "") { print "version " $1 " not evaluated"; exit }
    w = want[FNR]; d = got - w; if (d < 0) d = -d
    if (d > 1e-6 * w) { printf "version %s: server %s, independent %s\n", $1, got, w; exit }
    d = $4 - acc[FNR]; if (d < 0) d = -d
    if (d > 1e-9) { printf "version %s: accuracy %s, independent %s\n", $1, $4, acc[FNR]; exit } }
  END { if (n < 6) print "only " n " versions checked" }' "$T/check.bpb" "$T/server.bpb")
WHAT=$([ "$ENC" = 1 ] && echo "masked-LM loss and accuracy" || echo "bits per byte")
FALLS=$([ "$ENC" = 1 ] && echo "masked-LM loss falls" || echo "bits per byte fall")
is "${cmp_bpb:-same}" same "each version's held-out $WHAT equals the independent computation within 1e-6 ($(wc -l <"$T/server.bpb") versions)"
first=$(head -1 "$T/server.bpb" | cut -d' ' -f3)
last=$(tail -1 "$T/server.bpb" | cut -d' ' -f3)
ok $(awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }'; echo $?) \
	"held-out $FALLS ($(awk '{ printf "%s%.3f", (NR > 1 ? " " : ""), $3 }' "$T/server.bpb"))"
[ "$ENC" = 1 ] && diag "held-out masked-LM accuracy by version: $(awk '{ printf "%s%.3f", (NR > 1 ? " " : ""), $4 }' "$T/server.bpb")"

# Shown: the rounds list (version v's figure on round v), the project, /metrics, status.
r1=$(sql "select $FIG from model_version m join project p on p.id = m.project_id where p.name = 'tiny' and version = 1")
ok $(python3 -c "
import json, sys
rounds = json.load(open('$T/rounds.json'))['rounds']
r = [x for x in rounds if x['version'] == 1][0]
p = json.load(open('$T/project.json.out'))
if $ENC:
    ok = abs(r['heldout_mlm_loss'] - $r1) <= 1e-12 * $r1 and 0 <= r['heldout_mlm_accuracy'] <= 1 \
         and r['heldout_bpb'] is None and p['heldout_mlm_loss'] > 0 and 0 < p['heldout_mlm_accuracy'] <= 1 \
         and p['heldout_mlm_version'] >= 4 and p['heldout_bpb'] is None
else:
    ok = abs(r['heldout_bpb'] - $r1) <= 1e-12 * $r1 and p['heldout_bpb'] > 0 and p['heldout_version'] >= 4 \
         and p['heldout_mlm_loss'] is None
ok = ok and p['dataset']['heldout_tokens'] == $HELD and p['eval_every'] == 1
sys.exit(0 if ok else 1)"; echo $?) "GET rounds and GET the project carry $FIG"
if [ "$ENC" = 1 ]; then
	grep -q '^cotrain_heldout_mlm_loss{project="tiny"} [0-9]' "$T/metrics.txt" &&
		grep -q '^cotrain_heldout_mlm_accuracy{project="tiny"} 0\.[0-9]' "$T/metrics.txt" &&
		grep -q '^cotrain_heldout_eval_cpu_seconds_total{project="tiny"} [0-9]' "$T/metrics.txt" &&
		! grep -q '^cotrain_heldout_bits_per_byte{project="tiny"}' "$T/metrics.txt"
	ok $? "/metrics exposes the held-out masked-LM loss and accuracy and the evaluation's CPU seconds"
	grep -A2 '^training' "$T/status.txt" | grep -q "MLM_ACCURACY" &&
		grep -A2 '^training' "$T/status.txt" | grep -Eq "^  tiny +[0-9]+ +[0-9.]+ +- +[0-9]+ +[0-9.]+ +[0-9]\.[0-9]{4} +0\.[0-9]{4}"
	ok $? "cotrain-admin status shows rounds, the latest loss and the held-out masked-LM loss and accuracy"
else
grep -q '^cotrain_heldout_bits_per_byte{project="tiny"} [0-9]' "$T/metrics.txt" &&
	grep -q '^cotrain_heldout_eval_cpu_seconds_total{project="tiny"} [0-9]' "$T/metrics.txt"
ok $? "/metrics exposes the held-out bits per byte and the evaluation's CPU seconds"
grep -A2 '^training' "$T/status.txt" | grep -q "HELDOUT_BPB" &&
	grep -A2 '^training' "$T/status.txt" | grep -Eq "^  tiny +[0-9]+ +[0-9.]+ +[0-9]\.[0-9]{4} +[0-9]+"
ok $? "cotrain-admin status shows rounds, the latest loss and held-out bits per byte"
fi

# The cost: the evaluation's CPU seconds per version against the clients'
# (user + system of both processes, from /proc while they ran: their log).
eval_s=$(sql "select round(avg(heldout_cpu_seconds)::numeric, 4) from model_version where $FIG is not null")
diag "held-out evaluation: $eval_s CPU s per version on $NSEQ sequences of 16 tokens"
grep -q "held-out evaluation: project \"tiny\" version 0: " "$T/server.log"
ok $? "the server logs each evaluation with its CPU seconds"
