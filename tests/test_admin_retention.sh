#!/bin/sh
# cotrain tests: the file store's retention (cotrain-admin files gc), pins,
# backup and restore, on a throwaway PostgreSQL.  A project's history (twelve
# committed versions with checkpoints in the store, group sums and mean
# gradients, a live work unit, an open spot check, a pinned version) is
# written into the database and the store as the server would leave it; the
# collector must keep exactly what the policy says and never what a client
# still needs.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
T=$(mktemp -d /tmp/cot-retain-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
export COTRAIN_DATA_DIR="$T/data"
S="$T/data/files"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }
out_has() { grep -q -- "$1" "$T/out"; }

# Store the text $1 as a file; prints its sha256.
put() {
	_s=$(printf '%s' "$1" | sha256sum | cut -c1-64)
	mkdir -p "$S/$(echo "$_s" | cut -c1-2)"
	printf '%s' "$1" >"$S/$(echo "$_s" | cut -c1-2)/$_s"
	echo "$_s"
}
path() { echo "$S/$(echo "$1" | cut -c1-2)/$1"; }

run db migrate;                  is "$(rc)" 0 "db migrate"
cp "$top_srcdir/doc/design.md" "$T/text.txt"
run dataset import text "$T/text.txt"; is "$(rc)" 0 "import a dataset"
printf '{"name": "alpha", "title": "Alpha", "dataset": "text", "license": "CC-BY-4.0",
 "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 32},
 "target_batch": 8, "microbatch_size": 4}\n' >"$T/alpha.json"
run project create "$T/alpha.json"; is "$(rc)" 0 "create project alpha"
echo 'a long enough password' | run user create --password-stdin v@example.org Vol; is "$(rc)" 0 "create an account"

# Versions 1..12 of alpha, as commits leave them: a checkpoint each, rounds
# 0..11 committed, round 12 open.  Round 11 and 12 have a group sum and a
# mean gradient in the store (not indexed).
P=$(q "SELECT id FROM project WHERE name = 'alpha'")
q "UPDATE round SET state = 'committed' WHERE project_id = $P AND version = 0" >/dev/null
for v in 1 2 3 4 5 6 7 8 9 10 11 12; do
	s=$(put "checkpoint alpha $v")
	eval "C$v=$s"
	q "INSERT INTO file (sha256, size, kind) VALUES ('$s', length('checkpoint alpha $v'), 'checkpoint');
	   INSERT INTO model_version (project_id, version, checkpoint_sha256) VALUES ($P, $v, '$s');
	   INSERT INTO round (project_id, version, state) VALUES ($P, $v, CASE WHEN $v = 12 THEN 'open' ELSE 'committed' END);" >/dev/null
done
q "UPDATE project SET current_version = 12 WHERE id = $P" >/dev/null
C0=$(q "SELECT checkpoint_sha256 FROM model_version WHERE project_id = $P AND version = 0")
H=$(q "INSERT INTO host (account_id, token_hash, flops) SELECT id, '\\x01', 1e9 FROM account RETURNING id")
G11=$(put "group sum 11"); M11=$(put "mean 11"); G12=$(put "group sum 12"); M12=$(put "mean 12")
ORPHAN=$(put "left over by a failed attempt")
q "INSERT INTO round_group_sum (project_id, version, group_id, host_id, samples, included, sum_sha256)
   VALUES ($P, 11, 0, $H, 8, '[]', '$G11'), ($P, 12, 0, $H, 8, '[]', '$G12');
   UPDATE round SET gradient_sha256 = '$M11' WHERE project_id = $P AND version = 11;
   UPDATE round SET gradient_sha256 = '$M12' WHERE project_id = $P AND version = 12;" >/dev/null
# a live work unit on version 3, an open spot check on version 4 (of a
# finished unit), version 6 pinned
W3=$(q "INSERT INTO work_unit (project_id, host_id, version, lo, hi, deadline)
        VALUES ($P, $H, 3, 0, 2, now() + interval '1 hour') RETURNING id")
W4=$(q "INSERT INTO work_unit (project_id, host_id, version, lo, hi, state, mb_done, deadline)
        VALUES ($P, $H, 4, 2, 4, 'done', 2, now()) RETURNING id")
SC=$(q "INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi, samples, seed, k,
                                tolerance, created_at, deadline)
        VALUES ($P, 4, $W4, $H, 2, 4, 8, 1, 4, 0.01, now(), now() + interval '1 day') RETURNING id")
run model pin alpha 6;           is "$(rc)" 0 "model pin alpha 6"
out_has "pinned version 6"; ok $? "  $(cat "$T/out")"
is "$(q "SELECT version FROM model_version WHERE pinned")" "6" "  version 6 is pinned"

snapshot() { q "SELECT string_agg(version || ':' || coalesce(left(checkpoint_sha256, 8), '-'), ',' ORDER BY version)
                FROM model_version WHERE project_id = $P"; }
stored() { find "$S" -path "$S/tmp" -prune -o -type f -print | sort | xargs -r sha256sum | sha256sum; }
rows0=$(q "SELECT count(*) FROM file"); snap0=$(snapshot); store0=$(stored)

# Policy: the last 3 (10, 11, 12), every 5th (0, 5, 10), pinned 6, live 3,
# spot-checked 4.  Goes: 1, 2, 7, 8, 9; round 11's sum and mean; the orphan.
run files gc --dry-run --keep-last 3 --keep-every 5 --grace 0
is "$(rc)" 0 "files gc --dry-run"
is "$(grep -c '^would remove checkpoint' "$T/out")" 5 "  would remove five checkpoints"
for v in 1 2 7 8 9; do
	grep -q "^would remove checkpoint .*project alpha, version $v)" "$T/out"
	ok $? "  version $v's among them"
done
for v in 0 3 4 5 6 10 11 12; do
	! grep -q "project alpha, version $v)" "$T/out"
	ok $? "  version $v's kept"
done
grep -q "unindexed  *$G11 " "$T/out" && grep -q "unindexed  *$M11 " "$T/out" && grep -q "unindexed  *$ORPHAN " "$T/out"
ok $? "  would remove round 11's group sum and mean gradient and the orphan"
! grep -q "$G12\|$M12" "$T/out"; ok $? "  keeps the open round's group sum and mean gradient"
bytes=$(( $(printf 'checkpoint alpha 1' | wc -c) * 5 + 12 + 7 + 29 ))
out_has "^would remove 8 files, $bytes bytes (dry run: nothing changed)$"; ok $? "  total: $(tail -1 "$T/out")"
is "$(q "SELECT count(*) FROM file")" "$rows0" "  no row deleted"
is "$(snapshot)" "$snap0" "  no version lost its checkpoint"
is "$(stored)" "$store0" "  the store is unchanged"

# A file stored within the grace period stays whatever the rest says.
run files gc --dry-run --keep-last 3 --keep-every 5
out_has "^would remove 0 files, 0 bytes"; ok $? "  with the default grace (an hour) nothing is old enough"

run files gc --keep-last 3 --keep-every 5 --grace 0
is "$(rc)" 0 "files gc"
out_has "^removed 8 files, $bytes bytes$"; ok $? "  $(tail -1 "$T/out")"
for v in 1 2 7 8 9; do
	eval "s=\$C$v"
	[ ! -e "$(path "$s")" ] && [ "$(q "SELECT count(*) FROM file WHERE sha256 = '$s'")" = 0 ] &&
		[ -z "$(q "SELECT checkpoint_sha256 FROM model_version WHERE project_id = $P AND version = $v")" ]
	ok $? "  version $v: file, row and reference gone, the version itself kept"
done
all=1
for v in 0 3 4 5 6 10 11 12; do
	eval "s=\$C$v"
	[ -f "$(path "$s")" ] && [ "$(q "SELECT checkpoint_sha256 FROM model_version WHERE project_id = $P AND version = $v")" = "$s" ] || all=0
done
is "$all" 1 "  versions 0, 3, 4, 5, 6, 10, 11, 12 keep their checkpoints"
[ ! -e "$(path "$G11")" ] && [ ! -e "$(path "$M11")" ] && [ ! -e "$(path "$ORPHAN")" ] &&
	[ -f "$(path "$G12")" ] && [ -f "$(path "$M12")" ]
ok $? "  round 11's sum and mean and the orphan are gone, round 12's stay"
is "$(q "SELECT count(*) FROM dataset d JOIN shard s ON s.dataset_id = d.id JOIN file f ON f.sha256 = s.sha256")" \
	"$(q "SELECT count(*) FROM shard")" "  every shard of the dataset is still indexed"
missing=0
for s in $(q "SELECT sha256 FROM file"); do [ -f "$(path "$s")" ] || missing=$((missing + 1)); done
is "$missing" 0 "  every remaining row has its file"
run model export --version 7 alpha "$T/exp7"
[ "$(rc)" = 1 ] && err_has "has no checkpoint" && err_has "retention"
ok $? "  exporting a collected version says why: $(head -2 "$T/err" | tail -1)"
run files gc --keep-last 3 --keep-every 5 --grace 0
out_has "^removed 0 files, 0 bytes$"; ok $? "  a second pass removes nothing"

# What a client needs goes only once nothing needs it.
q "UPDATE work_unit SET state = 'expired' WHERE id = $W3; UPDATE spot_check SET state = 'agreed' WHERE id = $SC" >/dev/null
run model unpin alpha 6;         is "$(rc)" 0 "model unpin alpha 6"
run files gc --keep-last 3 --keep-every 5 --grace 0
grep -q "version 3)" "$T/out" && grep -q "version 4)" "$T/out" && grep -q "version 6)" "$T/out" &&
	out_has "^removed 3 files"
ok $? "  once the unit expired, the check settled and the pin went: versions 3, 4 and 6 go"

# hostile arguments change nothing
before="$(snapshot) $(stored)"
hostile() { # DESC RC MESSAGE ARGS...
	_d=$1 _r=$2 _m=$3; shift 3
	run "$@"
	[ "$(rc)" = "$_r" ] && err_has "$_m"
	ok $? "refuse $_d (exit $_r): $(head -1 "$T/err")"
}
hostile "--keep-last 0"              2 '--keep-last must be an integer from 1' files gc --keep-last 0
hostile "--keep-last abc"            2 '--keep-last must be an integer' files gc --keep-last abc
hostile "--keep-every -1"            2 '--keep-every must be an integer from 0' files gc --keep-every -1
hostile "--grace without a value"    2 '--grace must be an integer' files gc --dry-run --grace
hostile "--keep-last 1e3"            2 '--keep-last must be an integer' files gc --keep-last 1e3
hostile "an unknown option"          2 'unexpected argument "--all"' files gc --all
hostile "files without a command"    2 'files: no command given' files
hostile "an unknown files command"   2 'unknown command "rm"' files rm
hostile "pin of a missing version"   1 'has no model version 99' model pin alpha 99
hostile "pin of a missing project"   1 'has no model version' model pin "alpha'; DELETE FROM file; --" 1
hostile "pin of a bad version"       2 'VERSION must be an integer' model pin alpha -1
hostile "pin without a version"      2 'give a PROJECT and a VERSION' model pin alpha
is "$(snapshot) $(stored)" "$before" "nothing changed"

# Backup, then restore into a new data folder and an empty database.
run backup "$T/bk";              is "$(rc)" 0 "backup"
out_has "^backed up the database"; ok $? "  $(cat "$T/out")"
[ -f "$T/bk/backup.json" ] && [ -f "$T/bk/db.dump" ]; ok $? "  db.dump and backup.json written"
bad=0
for s in $(q "SELECT sha256 FROM file") $G12 $M12; do
	f="$T/bk/files/$(echo "$s" | cut -c1-2)/$s"
	[ "$(sha256sum <"$f" | cut -c1-64)" = "$s" ] || bad=$((bad + 1))
done
is "$bad" 0 "  every file the database names is in the backup, with the right bytes"
is "$(find "$T/bk/files" -type f | wc -l)" "$(( $(q "SELECT count(*) FROM file") + 2 ))" "  and nothing else"
run backup "$T/bk"
[ "$(rc)" = 1 ] && err_has "the folder is not empty"; ok $? "refuse a backup into a non-empty folder"

NEWDB=$(echo "$COTRAIN_DB" | sed 's/dbname=[^ ]*/dbname=restored/')
q "CREATE DATABASE restored" >/dev/null
COTRAIN_DATA_DIR="$T/new" COTRAIN_DB="$NEWDB" run restore "$T/bk"
is "$(rc)" 0 "restore into a new data folder and an empty database"
out_has "^restored the database"; ok $? "  $(cat "$T/out")"
dumpq() { "$PSQL" -X -A -t -q -d "$1" -c "SELECT (SELECT string_agg(sha256 || size || kind, ',' ORDER BY sha256) FROM file)
   || (SELECT string_agg(project_id || ':' || version || ':' || coalesce(checkpoint_sha256, '-') || pinned, ',' ORDER BY project_id, version) FROM model_version)
   || (SELECT string_agg(version || state || coalesce(gradient_sha256, '-'), ',' ORDER BY version) FROM round)
   || (SELECT count(*) FROM account) || (SELECT count(*) FROM shard) || (SELECT max(version) FROM schema_migrations)"; }
is "$(dumpq "$NEWDB" | sha256sum)" "$(dumpq "$COTRAIN_DB" | sha256sum)" "  the restored database has the same files, versions, rounds, accounts, shards"
bad=0
for s in $("$PSQL" -X -A -t -q -d "$NEWDB" -c "SELECT sha256 FROM file") $G12 $M12; do
	f="$T/new/files/$(echo "$s" | cut -c1-2)/$s"
	[ "$(sha256sum <"$f" | cut -c1-64)" = "$s" ] || bad=$((bad + 1))
done
is "$bad" 0 "  every file it names is in the new store, with the right bytes"
COTRAIN_DATA_DIR="$T/new" COTRAIN_DB="$NEWDB" run db status
is "$(rc)" 0 "  and its schema is this build's"
COTRAIN_DATA_DIR="$T/new" COTRAIN_DB="$NEWDB" run model export --version 0 --format cotrain alpha "$T/exp0"
is "$(rc)" 0 "  its version 0 exports (the checkpoint loads)"

mkdir -p "$T/other"
COTRAIN_DATA_DIR="$T/new2" COTRAIN_DB="$NEWDB" run restore "$T/bk"
[ "$(rc)" = 1 ] && err_has "database that is not empty"; ok $? "refuse a restore into a database that is not empty"
COTRAIN_DATA_DIR="$T/new" COTRAIN_DB="$NEWDB" run restore "$T/bk"
[ "$(rc)" = 1 ] && err_has "the folder is not empty"; ok $? "refuse a restore into a data folder that is not empty"
COTRAIN_DATA_DIR="$T/new3" run restore "$T/other"
[ "$(rc)" = 1 ] && err_has "is not a complete backup"; ok $? "refuse a restore from a folder that is not a backup"
run restore
[ "$(rc)" = 2 ] && err_has "give one DIR"; ok $? "refuse a restore without DIR"
# a damaged file in the backup is caught
cp -r "$T/bk" "$T/bk2"
s=$(q "SELECT sha256 FROM file WHERE kind = 'checkpoint' LIMIT 1")
f="$T/bk2/files/$(echo "$s" | cut -c1-2)/$s"
rm -f "$f"; printf 'damaged' >"$f"
COTRAIN_DATA_DIR="$T/new4" run restore "$T/bk2"
[ "$(rc)" = 1 ] && err_has "$s"; ok $? "refuse a backup whose file does not hash to its name: $(head -1 "$T/err")"

run status;                      is "$(rc)" 0 "status"
out_has "CREDIT_GRANTED" && out_has "OPEN_CHECKS" && out_has "CHECKPOINT_BYTES" && out_has "ON_DISK"
ok $? "  shows credit, open spot checks and the store's bytes"
run files --help;                is "$(rc)" 0 "files --help"
out_has "keep-last"; ok $? "  describes the policy"

done_testing
