#!/bin/sh
# cotrain tests: cotrain-admin end to end on a throwaway PostgreSQL
# (tests/with-pgtmp): migrations, dataset import (and refusals that change
# nothing), project create good and bad, users and teams, status, exit codes.
# The embedded default (no --db) is exercised at the end.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"

T=$(mktemp -d /tmp/cot-admin-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"   # as root, the embedded cluster runs as an unprivileged user
D="$T/data"
export COTRAIN_DATA_DIR="$D"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
# every table's row count, one line: what "nothing changed" compares
snapshot() {
	q "SELECT (SELECT count(*) FROM dataset) || ' ' || (SELECT count(*) FROM shard) || ' ' ||
	          (SELECT count(*) FROM file) || ' ' || (SELECT count(*) FROM project) || ' ' ||
	          (SELECT count(*) FROM model_version) || ' ' || (SELECT count(*) FROM account) || ' ' ||
	          (SELECT count(*) FROM account_key) || ' ' || (SELECT count(*) FROM team)"
}
# run A, keeping stdout, stderr and the exit status
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }
out_has() { grep -q -- "$1" "$T/out"; }



# ---- help and usage --------------------------------------------------------
run --help;                     is "$(rc)" 0 "--help exits 0"
out_has "db migrate";           ok $? "--help lists the commands"
for g in db dataset project user team status; do
	run "$g" --help
	is "$(rc)" 0 "$g --help exits 0"
done
run frobnicate;                 is "$(rc)" 2 "an unknown command exits 2"
run dataset import onlyname;    is "$(rc)" 2 "a missing argument exits 2"
run dataset import --shard-tokens 7 x y; is "$(rc)" 2 "a bad --shard-tokens exits 2"

# ---- migrations -------------------------------------------------------------
run status;                     is "$(rc)" 1 "status on an empty database fails"
err_has "db migrate";           ok $? "  with a hint to migrate"
run db migrate;                 is "$(rc)" 0 "db migrate on an empty database"
out_has "applied";              ok $? "  applies migrations: $(cat "$T/out")"
n=$(q "SELECT count(*) FROM schema_migrations")
run db migrate;                 is "$(rc)" 0 "db migrate again"
out_has "nothing to do";        ok $? "  is a no-op: $(cat "$T/out")"
is "$(q "SELECT count(*) FROM schema_migrations")" "$n" "  and records nothing new"

# ---- dataset import ---------------------------------------------------------
mkdir -p "$T/src/sub"
printf 'The quick brown fox jumps over the lazy dog.\n' >"$T/src/a.txt"
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "line %d: naïve café, Grüße, 世界\n", i }' >"$T/src/sub/b.txt"
run dataset import --shard-tokens 8192 tiny "$T/src"
is "$(rc)" 0 "import a folder"
out_has "from 2 documents";     ok $? "  $(head -1 "$T/out")"
ntok=$(( $(wc -c <"$T/src/a.txt") + 2 + $(wc -c <"$T/src/sub/b.txt") ))
is "$(q "SELECT n_tokens FROM dataset WHERE name = 'tiny'")" "$ntok" "  n_tokens is the bytes plus one separator"
# The held-out part by default: 2% of the tokens, at least 4104.
held=$(( (ntok * 2 + 99) / 100 )); [ "$held" -lt 4104 ] && held=4104
train=$((ntok - held))
is "$(q "SELECT heldout_tokens FROM dataset WHERE name = 'tiny'")" "$held" "  the last 2% (at least 4104 tokens) are held out"
out_has "held out: the last $held tokens"; ok $? "  and it says so"
nshards=$(( (train + 8191) / 8192 + (held + 8191) / 8192 ))
is "$(q "SELECT count(*) FROM shard s JOIN dataset d ON d.id = s.dataset_id WHERE d.name = 'tiny'")" \
   "$nshards" "  shards of 8192 tokens, cut where the held-out part starts"
is "$(q "SELECT count(*) FROM shard s JOIN dataset d ON d.id = s.dataset_id WHERE d.name = 'tiny'
          AND s.first_token < $train AND s.first_token + s.n_tokens > $train")" 0 \
   "  no shard holds both training and held-out tokens"
is "$(q "SELECT count(*) FROM shard s JOIN file f ON f.sha256 = s.sha256 AND f.kind = 'shard'")" \
   "$nshards" "  every shard has its file row"
is "$(q "SELECT sum(n_tokens) = max(first_token + n_tokens) FROM shard")" "t" "  shards tile the stream"
man=$(q "SELECT manifest_sha256 FROM dataset WHERE name = 'tiny'")
[ -f "$D/files/$(echo "$man" | cut -c1-2)/$man" ] && [ "$(sha256sum <"$D/files/$(echo "$man" | cut -c1-2)/$man" | cut -d' ' -f1)" = "$man" ]
ok $? "  the manifest is in the store under its sha256"
grep -q "\"heldout_tokens\": $held," "$D/files/$(echo "$man" | cut -c1-2)/$man"
ok $? "  the manifest records the held-out tokens"
run dataset list;               out_has "^tiny ";     ok $? "dataset list shows it"

before=$(snapshot)
run dataset import tiny "$T/src"
is "$(rc)" 1 "importing a taken name fails"
err_has 'dataset "tiny" already exists'; ok $? "  $(cat "$T/err")"
printf 'caf\351 au lait\n' >"$T/src/latin1.txt"
run dataset import other "$T/src"
is "$(rc)" 1 "a Latin-1 file fails the import"
err_has "latin1.txt" && err_has "not valid UTF-8" && err_has "byte offset 3"
ok $? "  naming the file and the offset: $(head -1 "$T/err")"
is "$(snapshot)" "$before" "  and changes nothing in the database"
rm "$T/src/latin1.txt"
(cd "$T/src" && tar -czf "$T/good.tar.gz" a.txt sub/b.txt)
head -c 3000 "$T/good.tar.gz" >"$T/cut.tar.gz"
run dataset import other "$T/cut.tar.gz"
is "$(rc)" 1 "a truncated .tar.gz fails the import"
err_has "cut.tar.gz";           ok $? "  naming it: $(head -1 "$T/err")"
is "$(snapshot)" "$before" "  and changes nothing in the database"
printf 'PK\003\004 broken beyond repair' >"$T/bad.zip"
run dataset import other "$T/bad.zip"
is "$(rc)" 1 "a corrupt .zip fails the import"
is "$(snapshot)" "$before" "  and changes nothing in the database"
for f in -0.1 0.51 1 nan inf -inf 1e400 abc '' 0.02x '0,02' ' 0.1'; do
	run dataset import --heldout-fraction "$f" other "$T/src"
	[ "$(rc)" = 2 ] && err_has "heldout-fraction must be a number from 0 to 0.5"
	ok $? "--heldout-fraction '$f' is refused: $(head -1 "$T/err")"
done
is "$(snapshot)" "$before" "  and changes nothing in the database"
printf 'Too little text for a held-out part.\n' >"$T/small.txt"
run dataset import small "$T/small.txt"
is "$(rc)" 1 "a dataset too small for the held-out minimum is refused"
err_has "too small for a held-out part" && err_has "heldout-fraction 0"
ok $? "  with a hint: $(tr '\n' ' ' <"$T/err")"
is "$(snapshot)" "$before" "  and changes nothing in the database"
run dataset import --heldout-fraction 0 small "$T/small.txt"
is "$(rc)" 0 "--heldout-fraction 0 imports it"
out_has "no held-out part";     ok $? "  without a held-out part"
is "$(q "SELECT heldout_tokens FROM dataset WHERE name = 'small'")" 0 "  heldout_tokens 0"
run dataset import --heldout-fraction 0.25 --shard-tokens 4096 quarter "$T/src"
is "$(rc)" 0 "--heldout-fraction 0.25 imports"
is "$(q "SELECT heldout_tokens FROM dataset WHERE name = 'quarter'")" "$(( (ntok + 3) / 4 ))" \
   "  holding out the last quarter, rounded up"
is "$(q "SELECT min(first_token) FROM shard s JOIN dataset d ON d.id = s.dataset_id
          WHERE d.name = 'quarter' AND s.first_token >= $ntok - $(( (ntok + 3) / 4 ))")" \
   "$(( ntok - (ntok + 3) / 4 ))" "  in shards of its own"
before=$(snapshot)
run dataset import other "$T/good.tar.gz"
is "$(rc)" 0 "the intact .tar.gz imports"
is "$(q "SELECT count(DISTINCT manifest_sha256) FROM dataset")" 4 "  as a dataset of its own name (beside tiny, small and quarter)"
is "$(q "SELECT count(*) FROM (SELECT sha256 FROM shard GROUP BY sha256) s")" \
   "$(q "SELECT count(*) FROM shard")" "  (shard.json names its dataset, so shards differ)"

# ---- project create ---------------------------------------------------------
cat >"$T/p.json" <<'EOF'
{"name": "demo", "title": "Demo", "dataset": "tiny",
 "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 64},
 "optimizer": {"type": "adamw", "lr": 0.001},
 "target_batch": 32, "microbatch_size": 4, "seed": 7}
EOF
run project create "$T/p.json"
is "$(rc)" 0 "project create"
mbe=$(( (train - 1) / 64 / 4 ))
is "$(q "SELECT mb_per_epoch FROM project WHERE name = 'demo'")" "$mbe" "  mb_per_epoch = floor((training tokens - 1) / seq_len) / microbatch_size"
is "$(q "SELECT (mb_per_epoch * microbatch_size * seq_len + 1) <= $train FROM project WHERE name = 'demo'")" t \
   "  an epoch reads no held-out token"
out_has "held-out evaluation: every 1 version on 32 sequences"; ok $? "  evaluation on 32 held-out sequences by default"
is "$(q "SELECT config->'optimizer'->>'beta2' FROM project WHERE name = 'demo'")" "0.999" "  the stored config has the defaults filled in"
ck=$(q "SELECT v.checkpoint_sha256 FROM model_version v JOIN project p ON p.id = v.project_id WHERE p.name = 'demo' AND v.version = 0")
is "$(q "SELECT kind FROM file WHERE sha256 = '$ck'")" "checkpoint" "  version 0 has a checkpoint in the store"
[ -f "$D/files/$(echo "$ck" | cut -c1-2)/$ck" ]; ok $? "  the checkpoint file exists"
is "$(q "SELECT flops_per_sample > 0 AND seed = 7 FROM project WHERE name = 'demo'")" "t" "  flops and seed recorded"

before=$(snapshot)
bad() { # bad DESC FIELD-TEXT SED-EXPRESSION
	sed "$3" "$T/p.json" >"$T/bad.json"
	run project create "$T/bad.json"
	[ "$(rc)" = 1 ] && err_has "$2"
	ok $? "refuse $1: $(head -1 "$T/err")"
}
bad "a taken name"            'project "demo" already exists' 's/x/x/'
bad "an unknown dataset"      'field "dataset"'         's/"tiny"/"nosuch"/'
bad "a string for n_head"     '"model.n_head"'          's/"n_head": 2/"n_head": "2"/'
bad "an invalid model shape"  '"model.d_model"'         's/"d_model": 32/"d_model": 33/'
bad "an unknown key"          '"model.depth"'           's/"seq_len": 64/"seq_len": 64, "depth": 3/'
bad "a missing target batch"  '"target_batch"'          's/"target_batch": 32, //'
bad "a dataset too small"     '"model.seq_len"'         's/"seq_len": 64/"seq_len": 8192/; s/"target_batch": 32, "microbatch_size": 4/"target_batch": 64, "microbatch_size": 64/; s/"name": "demo"/"name": "demo2"/'
bad "malformed JSON"          'not valid JSON'          's/}$//'
is "$(snapshot)" "$before" "bad project files change nothing"
run project list;               out_has "^demo ";     ok $? "project list shows it"

# ---- users and teams --------------------------------------------------------
echo "correct horse battery" | "$A" user create --password-stdin --admin alice@example.org Alice >"$T/out" 2>"$T/err"
ok $? "user create"
key=$(sed -n 's/^account key: //p' "$T/out")
[ ${#key} -ge 40 ]; ok $? "  prints an account key"
is "$(q "SELECT count(*) FROM account_key k JOIN account a ON a.id = k.account_id
         WHERE a.email = 'alice@example.org' AND k.key_hash = sha256('$key'::bytea)")" 1 "  whose sha256 is stored"
is "$(q "SELECT password_hash LIKE 'pbkdf2-sha256\$%' AND is_admin FROM account WHERE email = 'alice@example.org'")" "t" \
   "  password stored with the KDF, administrator"
run user create ALICE@example.org Other
is "$(rc)" 1 "the same email in other case is refused"
run user create not-an-email Bob;   is "$(rc)" 1 "a bad email is refused"
run team create --founder alice@example.org "Night Owls"
is "$(rc)" 0 "team create"
run team create "night owls";   is "$(rc)" 1 "  a team name taken in other case is refused"
run user create --team "night owls" --no-key bob@example.org Bob
is "$(rc)" 0 "user create --team --no-key"
is "$(q "SELECT count(*) FROM account a JOIN team t ON t.id = a.team_id WHERE t.name = 'Night Owls'")" 2 \
   "  the founder and bob are members"
run team list;                  out_has "Night Owls.*2";  ok $? "team list counts members"
run user disable bob@example.org; is "$(q "SELECT disabled FROM account WHERE email = 'bob@example.org'")" "t" "user disable"
run user key bob@example.org;   is "$(rc)" 1 "no key for a disabled account"
run user enable bob@example.org;  is "$(q "SELECT disabled FROM account WHERE email = 'bob@example.org'")" "f" "user enable"
run user set-admin bob@example.org yes; is "$(q "SELECT is_admin FROM account WHERE email = 'bob@example.org'")" "t" "user set-admin"
run user key bob@example.org;   is "$(q "SELECT count(*) FROM account_key k JOIN account a ON a.id = k.account_id WHERE a.email = 'bob@example.org'")" 1 "user key issues a key"
run team remove bob@example.org; is "$(q "SELECT team_id IS NULL FROM account WHERE email = 'bob@example.org'")" "t" "team remove"
run team add "Night Owls" bob@example.org nobody@example.org
is "$(rc)" 1 "team add with an unknown account fails"
is "$(q "SELECT team_id IS NULL FROM account WHERE email = 'bob@example.org'")" "t" "  and changes nobody"
run user list;                  out_has "bob@example.org"; ok $? "user list"

# ---- status -----------------------------------------------------------------
run status
is "$(rc)" 0 "status"
grep -q "^  demo  *tiny  *0  *$(echo "$ck" | cut -c1-12)" "$T/out"; ok $? "  shows the project, its version and checkpoint"
out_has "^  tiny ";             ok $? "  shows the datasets"
out_has "live work units";      ok $? "  shows the live work units"

# ---- the embedded default ---------------------------------------------------
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1 && ! id nobody >/dev/null 2>&1; then
	ok 0 "# SKIP no unprivileged user for the embedded cluster"
else
	E="$T/embedded"
	env -u COTRAIN_DB "$A" --data-dir "$E" db migrate >"$T/out" 2>"$T/err"
	st=$?
	[ $st -eq 0 ] && env -u COTRAIN_DB "$A" --data-dir "$E" status >"$T/out" 2>>"$T/err"
	ok $? "the embedded default: db migrate and status with no --db ($(tail -1 "$T/err"))"
	# A relative --data-dir: the cluster's socket and lock files are made
	# from it after postgres has moved into its directory.
	t0=$(date +%s)
	(cd "$T" && env -u COTRAIN_DB "$A" --data-dir relative db migrate >"$T/out" 2>"$T/err")
	st=$?
	secs=$(( $(date +%s) - t0 ))
	ok $([ $st -eq 0 ] && [ $secs -lt 20 ]; echo $?) \
		"a relative --data-dir works (exit $st after $secs s: $(tail -1 "$T/err"))"
fi
done_testing
