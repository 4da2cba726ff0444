#!/bin/sh
# cotrain tests: cotrain-admin project list --json, show, pause, resume and delete on
# a throwaway PostgreSQL, with hostile arguments that must change nothing.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
PY=/usr/bin/python3
T=$(mktemp -d /tmp/cot-plife-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
export COTRAIN_DATA_DIR="$T/data"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }
out_has() { grep -q -- "$1" "$T/out"; }
state() { q "SELECT string_agg(name || '=' || active, ',' ORDER BY name) FROM project"; }

run db migrate;                  is "$(rc)" 0 "db migrate"
run project list --json;         is "$(rc)" 0 "project list --json with no projects"
is "$(cat "$T/out")" "[]" "  is an empty array"
cp "$top_srcdir/doc/design.md" "$T/text.txt"
run dataset import text "$T/text.txt"; is "$(rc)" 0 "import a dataset"
# beta names its GPU hosts' precision; alpha takes the default.
for n in alpha beta; do
	extra=; [ "$n" = beta ] && extra=', "precision": "fp32"'
	printf '{"name": "%s", "title": "Project %s", "dataset": "text", "license": "CC-BY-4.0",
	 "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 32},
	 "target_batch": 8, "microbatch_size": 4%s}\n' "$n" "$n" "$extra" >"$T/$n.json"
	run project create "$T/$n.json"; is "$(rc)" 0 "create project $n"
done
sed 's/"alpha"/"gamma"/; s/"microbatch_size": 4/&, "precision": "fp16"/' "$T/alpha.json" >"$T/gamma.json"
run project create "$T/gamma.json"
[ "$(rc)" = 1 ] && err_has 'field "precision" must be one of "fp32", "tf32", "bf16"' &&
	[ "$(q "SELECT count(*) FROM project WHERE name = 'gamma'")" = 0 ]
ok $? "refuse a project with precision fp16, creating nothing: $(head -1 "$T/err")"

run project list --json;         is "$(rc)" 0 "project list --json"
"$PY" -c 'import json, sys; a = json.load(open(sys.argv[1]))
assert [p["name"] for p in a] == ["alpha", "beta"], a
assert a[0]["active"] is True and a[0]["current_version"] == 0 and a[0]["dataset"] == "text"
assert a[0]["config"]["model"]["d_model"] == 16 and a[0]["round"]["state"] == "open"' "$T/out"
ok $? "  parses as JSON: both projects, active, version 0, config and round"
run project list;                is "$(rc)" 0 "project list"
out_has "^alpha .* yes "; ok $? "  alpha is active"

run project show alpha;          is "$(rc)" 0 "project show alpha"
out_has "^title  *Project alpha$" && out_has "^round  *version 0, open, attempt 1$" && out_has '"license": "CC-BY-4.0"'
ok $? "  shows the title, the round and the config"
out_has '"precision": "bf16"'; ok $? "  the config names the default precision, bf16"
run project show --json beta;    is "$(rc)" 0 "project show --json beta"
"$PY" -c 'import json, sys; p = json.load(open(sys.argv[1])); assert p["name"] == "beta" and p["target_batch"] == 8, p
assert p["config"]["precision"] == "fp32", p["config"]' "$T/out"
ok $? "  one JSON object, its config with precision fp32"

run project pause alpha;         is "$(rc)" 0 "project pause alpha"
out_has "paused project"; ok $? "  $(cat "$T/out")"
is "$(state)" "alpha=false,beta=true" "  only alpha is paused"
run project pause alpha;         is "$(rc)" 0 "pausing again"
out_has "already paused"; ok $? "  says so: $(cat "$T/out")"
run project show --json alpha
"$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["active"] is False' "$T/out"
ok $? "  show --json has active false"
run project resume alpha;        is "$(rc)" 0 "project resume alpha"
is "$(state)" "alpha=true,beta=true" "  alpha is active again"
run project resume alpha;        out_has "already active"; ok $? "  resuming again: $(cat "$T/out")"

before=$(state)
hostile() { # DESC RC MESSAGE ARGS...
	_d=$1 _r=$2 _m=$3; shift 3
	run "$@"
	[ "$(rc)" = "$_r" ] && err_has "$_m"
	ok $? "refuse $_d (exit $_r): $(head -1 "$T/err")"
}
hostile "show of a missing project"   1 'project "nosuch" does not exist' project show nosuch
err_has "project list shows"; ok $? "  with a hint"
hostile "pause of a missing project"  1 'does not exist' project pause nosuch
hostile "resume of a quoted name"     1 'does not exist' project resume "alpha'; UPDATE project SET active = false; --"
hostile "show without a name"         2 'give exactly one project NAME' project show
hostile "pause of two names"          2 'give exactly one project NAME' project pause alpha beta
hostile "an unknown option"           2 'unknown option "--all"' project pause --all
hostile "list with an argument"       2 'unexpected argument' project list alpha
hostile "an unknown command"          2 'unknown command "remove"' project remove alpha
hostile "delete of a missing project" 1 'project "nosuch" does not exist' project delete nosuch
hostile "delete of a quoted name"     1 'does not exist' project delete "alpha'; DELETE FROM project; --"
hostile "delete without a name"       2 'give exactly one project NAME' project delete
hostile "delete of two names"         2 'give exactly one project NAME' project delete alpha beta
hostile "delete with a bad option"    2 'unknown option "--yes"' project delete --yes alpha
is "$(state)" "$before" "nothing changed"

# project delete: refused while a host holds live work, unless --force; the
# credit it granted stays in the totals; its checkpoints go at the next gc.
echo 'a long enough password' | run user create --password-stdin v@example.org Vol
is "$(rc)" 0 "create an account"
H=$(q "INSERT INTO host (account_id, token_hash, flops) SELECT id, '\\x02', 1e9 FROM account RETURNING id")
AID=$(q "SELECT id FROM account")
A_ID=$(q "SELECT id FROM project WHERE name = 'alpha'")
q "INSERT INTO work_unit (project_id, host_id, version, lo, hi, deadline)
   VALUES ($A_ID, $H, 0, 0, 2, now() + interval '1 hour');
   INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, samples, flops, credit, status, created_at)
   VALUES ('round', $A_ID, 0, $H, $AID, 8, 4.32e11, 1, 'granted', now()),
          ('round', $A_ID, 1, $H, $AID, 8, 4.32e11, 1, 'pending', now());
   INSERT INTO account_credit (account_id, total) VALUES ($AID, 1)
     ON CONFLICT (account_id) DO UPDATE SET total = 1;
   INSERT INTO host_credit (host_id, total) VALUES ($H, 1)
     ON CONFLICT (host_id) DO UPDATE SET total = 1;" >"$T/setup"
is "$(cat "$T/setup")" "" "  a live work unit, a granted and a pending grant" 
ck=$(q "SELECT checkpoint_sha256 FROM model_version WHERE project_id = $A_ID AND version = 0")
run project delete alpha
[ "$(rc)" = 1 ] && err_has 'cannot delete project "alpha": 1 hosts hold 1 live work units' && err_has "give --force"
ok $? "refuse to delete a project whose hosts hold live work: $(head -1 "$T/err")"
is "$(q "SELECT count(*) FROM project WHERE name = 'alpha'")" 1 "  alpha is still there"
run project delete --force alpha; is "$(rc)" 0 "project delete --force alpha"
out_has 'deleted project "alpha": 1 model versions, 0 committed rounds, 1 live work units (1 pending'
ok $? "  $(cat "$T/out")"
is "$(q "SELECT (SELECT count(*) FROM project WHERE name = 'alpha') || ',' ||
            (SELECT count(*) FROM work_unit) || ',' || (SELECT count(*) FROM round WHERE project_id = $A_ID) || ',' ||
            (SELECT count(*) FROM model_version WHERE project_id = $A_ID) || ',' ||
            (SELECT count(*) FROM credit_grant)")" "0,0,0,0,0" "  its project, work units, rounds, versions and grants are gone"
is "$(q "SELECT total FROM account_credit WHERE account_id = $AID")/$(q "SELECT total FROM host_credit WHERE host_id = $H")" \
	"1/1" "  the credit it granted stays with the account and the host"
bk=$(q "SELECT checkpoint_sha256 FROM model_version mv JOIN project p ON p.id = mv.project_id WHERE p.name = 'beta'")
run files gc --grace 0;          is "$(rc)" 0 "files gc after the delete"
if [ "$ck" = "$bk" ]; then
	[ -f "$COTRAIN_DATA_DIR/files/$(echo "$ck" | cut -c1-2)/$ck" ]; ok $? "  beta's version 0 (the same bytes) stays"
else
	[ ! -e "$COTRAIN_DATA_DIR/files/$(echo "$ck" | cut -c1-2)/$ck" ] && [ -f "$COTRAIN_DATA_DIR/files/$(echo "$bk" | cut -c1-2)/$bk" ]
	ok $? "  alpha's checkpoint goes, beta's stays"
fi
run project delete beta;         is "$(rc)" 0 "delete beta (no live work)"
run files gc --grace 0
[ ! -e "$COTRAIN_DATA_DIR/files/$(echo "$bk" | cut -c1-2)/$bk" ]; ok $? "  its checkpoint goes at the next gc"
is "$(q "SELECT count(*) FROM shard s JOIN file f ON f.sha256 = s.sha256")" "$(q "SELECT count(*) FROM shard")" \
	"  the dataset's shards stay"
run project --help;              is "$(rc)" 0 "project --help"
out_has "project pause NAME" && out_has "project delete \[--force\] NAME"; ok $? "  lists pause, resume and delete"

done_testing
