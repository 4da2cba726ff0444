#!/bin/sh
# cotrain tests: a database migrated before db/functions/ existed (0001..0010,
# each in its own transaction, no function files: what the earlier builds'
# runner did, replayed here with psql) holding a project, accounts, hosts,
# work units and rounds, upgraded by today's "cotrain-admin db migrate":
# its schema equals a fresh database's, its rows survive, the functions work
# on them; a function file whose checksum changed is applied again (and the
# server refuses to start until it is); migrate twice is a no-op.
. "$top_srcdir/tests/tap.sh"

if [ -z "${COTRAIN_DB:-}" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
S="$top_builddir/server/cotrain-server"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
PG_DUMP="$PG_BINDIR/pg_dump"
[ -x "$PG_DUMP" ] || PG_DUMP=pg_dump
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
command -v "$PG_DUMP" >/dev/null 2>&1 || skip_all "pg_dump not found"
command -v sha256sum >/dev/null 2>&1 || skip_all "sha256sum not found"

T=$(mktemp -d /tmp/cot-upgrade-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
BASE=$COTRAIN_DB
# q DB SQL: one query's rows, unaligned
q() { PGDATABASE=$1 "$PSQL" -X -A -t -q -v ON_ERROR_STOP=1 -c "$2" 2>&1; }
# admin DB ARGS...: cotrain-admin on database DB, keeping stdout, stderr and status
admin() {
	_db=$1; shift
	COTRAIN_DB="$BASE dbname=$_db" "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"
}
rc() { cat "$T/rc"; }
# dump DB: its schema, less the random key of the \restrict lines of newer pg_dumps
dump() {
	PGDATABASE=$1 "$PG_DUMP" --schema-only --no-owner --no-privileges >"$T/dump" &&
	sed -e '/^\\restrict /d' -e '/^\\unrestrict /d' "$T/dump"
}

q cotrain "CREATE DATABASE old" >/dev/null && q cotrain "CREATE DATABASE fresh" >/dev/null
ok $? "two empty databases" || bail_out "could not create the databases"

# ---- the database as the earlier runner left it ----------------------------
q old "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                       checksum text NOT NULL,
                                       applied_at timestamptz NOT NULL DEFAULT now())" >/dev/null
good=0
for f in "$top_srcdir"/db/migrations/000[0-9]_*.sql "$top_srcdir"/db/migrations/0010_*.sql; do
	base=$(basename "$f" .sql)
	sum=$(sha256sum "$f" | cut -d' ' -f1)
	PGDATABASE=old "$PSQL" -X -q -v ON_ERROR_STOP=1 -1 -f "$f" >"$T/m.log" 2>&1 &&
	q old "INSERT INTO schema_migrations VALUES (${base%%_*}, '${base#*_}', '$sum')" >/dev/null ||
	{ good=1; diag "$base: $(cat "$T/m.log")"; }
done
ok $good "migrations 0001..0010 applied the earlier way"
is "$(q old "SELECT max(version) FROM schema_migrations")" 10 "  the database is at version 10"
is "$(q old "SELECT to_regclass('schema_function_files') IS NULL")" t "  with no function files recorded"

# Rows, made by the version-10 functions themselves.
q old "
INSERT INTO file (sha256, size, kind) VALUES (encode(sha256('manifest'), 'hex'), 100, 'manifest'),
                                             (encode(sha256('shard0'), 'hex'), 4096, 'shard');
INSERT INTO dataset (name, n_tokens, manifest_sha256) VALUES ('text', 4096, encode(sha256('manifest'), 'hex'));
INSERT INTO shard (dataset_id, idx, first_token, n_tokens, sha256)
SELECT id, 0, 0, 4096, encode(sha256('shard0'), 'hex') FROM dataset;
INSERT INTO project (name, title, config, dataset_id, seq_len, microbatch_size, target_batch,
                     mb_per_epoch, flops_per_sample)
SELECT n, 'Project ' || n, '{\"model\": {}}', d.id, 16, 2, 1000, 64, 1e6
  FROM dataset d, (VALUES ('demo'), ('busy')) v(n);
INSERT INTO team (name) VALUES ('crew');
INSERT INTO account (email, name, password_hash, cross_project_id, team_id)
SELECT 'a' || i || '@example.org', 'user ' || i, 'x', 'cp' || i, (SELECT id FROM team)
  FROM generate_series(1, 2) i;
INSERT INTO host (account_id, token_hash, flops)
SELECT id, sha256(('token-' || id)::bytea), 1e9 FROM account ORDER BY id;
SELECT status FROM sched_assign(sha256('token-1'::bytea), 1, 'demo', 10, 100);
SELECT status FROM sched_assign(sha256('token-2'::bytea), 2, 'demo', 10, 100);
SELECT status FROM sched_heartbeat(sha256('token-1'::bytea), 1, 3, 5);
SELECT status FROM sched_assign(sha256('token-1'::bytea), 1, 'busy', 10, 100);
UPDATE round SET state = 'closing', close_reason = 'stragglers', closed_at = now()
 WHERE project_id = (SELECT id FROM project WHERE name = 'busy');" >"$T/rows" 2>&1
ok $? "rows put in through the version-10 functions" || diag "$(cat "$T/rows")"
counts="SELECT (SELECT count(*) FROM project) || ' ' || (SELECT count(*) FROM account) || ' ' ||
               (SELECT count(*) FROM host) || ' ' || (SELECT count(*) FROM work_unit) || ' ' ||
               (SELECT count(*) FROM round) || ' ' || (SELECT count(*) FROM spot_policy) || ' ' ||
               (SELECT count(*) FROM mb_pool) || ' ' || (SELECT sum(mb_done) FROM version_progress)"
units="SELECT string_agg(id || ':' || host_id || ':' || lo || '-' || hi || ':' || mb_done || ':' || state,
                        ' ' ORDER BY id) FROM work_unit"
before=$(q old "$counts")
units_before=$(q old "$units")
is "$before" "2 2 2 3 2 2 2 3" "  2 projects, 2 accounts, 2 hosts, 3 work units, 2 rounds"

admin old status
is "$(rc)" 1 "today's build refuses the version-10 database"
grep -q "db migrate" "$T/err"
ok $? "  with a hint to migrate: $(head -1 "$T/err")"

# ---- upgrade ----------------------------------------------------------------
admin old db migrate
is "$(rc)" 0 "db migrate upgrades it" || diag "$(cat "$T/err")"
n_files=$(ls "$top_srcdir"/db/functions/*.sql | wc -l)
n_mig=$(( $(ls "$top_srcdir"/db/migrations/*.sql | wc -l) - 10 ))   # those after version 10
[ "$n_mig" -eq 1 ] && migs="1 migration" || migs="$n_mig migrations"
grep -q "applied $migs and $n_files function files" "$T/out"
ok $? "  the migrations after version 10, then every function file: $(cat "$T/out")"
admin fresh db migrate
is "$(rc)" 0 "db migrate makes a fresh database" || diag "$(cat "$T/err")"

dump old >"$T/old.sql" && dump fresh >"$T/fresh.sql"
ok $? "both dumped"
diff -u "$T/fresh.sql" "$T/old.sql" >"$T/diff"
ok $? "the upgraded schema equals the fresh one" || diag "$(head -40 "$T/diff")"
old_fn=$(q old "SELECT md5(string_agg(pg_get_functiondef(p.oid), '' ORDER BY p.oid::regprocedure::text))
                 FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace")
fresh_fn=$(q fresh "SELECT md5(string_agg(pg_get_functiondef(p.oid), '' ORDER BY p.oid::regprocedure::text))
                     FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace")
is "$old_fn" "$fresh_fn" "  function for function"
is "$(q old "SELECT count(*) FROM pg_proc WHERE proname LIKE '%\_v2' OR proname = 'spot_host'")" 0 \
	"  with no renamed leftovers"

is "$(q old "$counts")" "$before" "the rows survive"
is "$(q old "$units")" "$units_before" "  the work units unchanged"

# ---- the functions on the old rows -----------------------------------------
is "$(q old "SELECT host_auth(sha256('token-2'::bytea))")" 2 "host_auth finds an old host by its token"
is "$(q old "SELECT host_auth(sha256('nobody'::bytea)) IS NULL")" t "  and no host for a bad token"
r=$(q old "SELECT status || ' ' || (body::jsonb->>'mb_done') FROM sched_heartbeat(sha256('token-1'::bytea), 1, 5, 5)")
is "$r" "200 5" "a heartbeat on an old work unit"
r=$(q old "SELECT status || ' ' || (body::jsonb->>'lo') FROM sched_assign(sha256('token-2'::bytea), 2, 'demo', 10, 100)")
ok $(expr "$r" : '200 [0-9]' >/dev/null; echo $?) "sched_assign hands out work from the old pool: $r"
r=$(q old "SELECT status || ' ' || (body::jsonb->'round'->>'state') FROM sched_assign(sha256('token-2'::bytea), 2, 'busy', 10, 100)")
is "$r" "409 closing" "  and refuses work of the old closing round"
r=$(q old "SELECT status FROM sched_assign(sha256('token-1'::bytea), 2, 'demo', 10, 100)")
is "$r" 403 "  and a token that is another host's"
r=$(q old "SELECT status || ' ' || (body::jsonb->>'state') FROM sched_finish(sha256('token-2'::bytea), 2, 0)")
is "$r" "200 done" "sched_finish on an old work unit"
r=$(q old "SELECT status FROM spot_list(sha256('token-1'::bytea), 1)")
is "$r" 200 "spot_list authenticates an old host"
r=$(q old "SELECT status || ' ' || (body::jsonb->>'state') FROM round_report(sha256('token-1'::bytea), 3, 0, 0, '127.0.0.1:1', 1e6, true, '{}', NULL, NULL)")
is "$r" "200 returned" "round_report on the old closing round"

# ---- a function file that changed -------------------------------------------
q old "CREATE OR REPLACE FUNCTION sched_heartbeat(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_sps real)
       RETURNS TABLE (status integer, body text) LANGUAGE sql AS \$\$ SELECT 500, 'stale' \$\$;
       UPDATE schema_function_files SET checksum = 'an earlier sched.sql' WHERE name = 'sched.sql'" >/dev/null
admin old status
is "$(rc)" 1 "a function file not applied as this build has it is refused"
grep -q "function files" "$T/err" && grep -q "db migrate" "$T/err"
ok $? "  saying so, with a hint to migrate: $(head -1 "$T/err")"
timeout 30 "$S" --db "$BASE dbname=old" --data-dir "$T/srv" --listen 127.0.0.1 --port 0 \
	>"$T/srv.out" 2>"$T/srv.err"
st=$?
ok $([ "$st" -ne 0 ] && [ "$st" -ne 124 ] && grep -q "db migrate" "$T/srv.err"; echo $?) \
	"the server refuses to start on it (exit $st): $(grep -v HINT "$T/srv.err" | tail -1)"
admin old db migrate
grep -q "applied 0 migrations and 1 function file;" "$T/out"
ok $? "db migrate applies that file again, alone: $(cat "$T/out")"
r=$(q old "SELECT status FROM sched_heartbeat(sha256('token-1'::bytea), 1, 6, 5)")
is "$r" 200 "  sched_heartbeat is today's again"
dump old >"$T/old.sql"
cmp -s "$T/fresh.sql" "$T/old.sql"
ok $? "  and the schema equals the fresh one"

# ---- migrate twice ------------------------------------------------------------
applied=$(q old "SELECT string_agg(name || checksum || applied_at, ',' ORDER BY name) FROM schema_function_files")
admin old db migrate
grep -q "nothing to do" "$T/out"
ok $? "db migrate again does nothing: $(cat "$T/out")"
is "$(q old "SELECT string_agg(name || checksum || applied_at, ',' ORDER BY name) FROM schema_function_files")" \
	"$applied" "  and records nothing"
admin old status
is "$(rc)" 0 "the upgraded database passes the schema check"
done_testing
