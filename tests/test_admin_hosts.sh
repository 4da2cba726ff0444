#!/bin/sh
# cotrain tests: cotrain-admin host merge on a throwaway PostgreSQL: the old
# host's credit, pending credit, spot checks, check record and finished units
# move to the survivor, whose pending credit is granted when the moved check
# agrees; refusals (one host, two accounts, unknown or merged ids, bad
# arguments) change nothing.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
T=$(mktemp -d /tmp/cot-hosts-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
export COTRAIN_DATA_DIR="$T/data"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }
# everything a merge touches, one line: what "nothing changed" compares
state() {
	q "SELECT (SELECT string_agg(id || ':' || revoked || ':' || coalesce(merged_into, 0), ',' ORDER BY id) FROM host)
	   || '|' || (SELECT string_agg(id || ':' || host_id || ':' || status, ',' ORDER BY id) FROM credit_grant)
	   || '|' || (SELECT string_agg(host_id || ':' || total, ',' ORDER BY host_id) FROM host_credit)
	   || '|' || (SELECT string_agg(id || ':' || host_id || ':' || checker_id, ',' ORDER BY id) FROM spot_check)
	   || '|' || (SELECT string_agg(id || ':' || host_id, ',' ORDER BY id) FROM work_unit)"
}

run db migrate;                  is "$(rc)" 0 "db migrate"
cp "$top_srcdir/doc/design.md" "$T/text.txt"
run dataset import text "$T/text.txt"; is "$(rc)" 0 "import a dataset"
printf '{"name": "alpha", "title": "Alpha", "dataset": "text",
 "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 32},
 "target_batch": 8, "microbatch_size": 4}\n' >"$T/alpha.json"
run project create "$T/alpha.json"; is "$(rc)" 0 "create a project"
for who in alice bob; do
	echo 'a long enough password' | run user create --password-stdin "$who@example.org" "$who"
	is "$(rc)" 0 "create account $who"
done
P=$(q "SELECT id FROM project WHERE name = 'alpha'")
AL=$(q "SELECT id FROM account WHERE name = 'alice'")
BO=$(q "SELECT id FROM account WHERE name = 'bob'")
host() { q "INSERT INTO host (account_id, token_hash, flops) VALUES ($1, '\\x$2', 1e9) RETURNING id"; }
OLD=$(host "$AL" 01)   # the machine before its state folder was lost
NEW=$(host "$AL" 02)   # the same machine registered again
CHK=$(host "$AL" 03)   # a third machine of alice's: the checker
BOB=$(host "$BO" 04)

# OLD: granted credit for versions 1 and 3, pending for version 2 (a spot
# check open on it, checked by CHK), a finished and a live unit; NEW: a grant
# of version 3 too (both ran in round 3: that grant of OLD stays put).
q "INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, samples, flops, credit, status, created_at, granted_at)
   VALUES ('round', $P, 1, $OLD, $AL, 8, 4.32e11, 1, 'granted', now(), now()),
          ('round', $P, 2, $OLD, $AL, 8, 8.64e11, 2, 'pending', now(), NULL),
          ('round', $P, 3, $OLD, $AL, 8, 1.296e12, 3, 'granted', now(), now()),
          ('round', $P, 3, $NEW, $AL, 8, 2.16e12, 5, 'granted', now(), now());
   INSERT INTO host_credit (host_id, total, rac, rac_time, rac_key)
   VALUES ($OLD, 4, 1, now(), 0), ($NEW, 5, 1, now(), 0);
   INSERT INTO account_credit (account_id, total) VALUES ($AL, 9);
   INSERT INTO work_unit (project_id, host_id, version, lo, hi, state, deadline)
   VALUES ($P, $OLD, 2, 0, 2, 'done', now()), ($P, $OLD, 4, 2, 4, 'live', now() + interval '1 hour');
   INSERT INTO host_check_record (host_id, consecutive, n_agreed) VALUES ($OLD, 3, 3);" >/dev/null
WU=$(q "SELECT id FROM work_unit WHERE state = 'done'")
q "INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi, samples, seed, k, tolerance,
                           checker_id, created_at, assigned_at, deadline)
   VALUES ($P, 2, $WU, $OLD, 0, 2, 8, 42, 2, 1e-3, $CHK, now(), now(), now() + interval '1 day')" >/dev/null

# ---- refusals ----------------------------------------------------------------
before=$(state)
refuse() {  # WHAT EXIT-STATUS MESSAGE ARGS...
	what=$1 want=$2 msg=$3; shift 3
	run "$@"
	is "$(rc)" "$want" "$what: exits $want"
	err_has "$msg"; ok $? "  says \"$msg\": $(head -c 300 "$T/err")"
}
refuse "merge a host into itself" 1 "cannot merge host $OLD into itself" host merge "$OLD" "$OLD"
refuse "merge hosts of two accounts" 1 "cannot merge host $BOB of account $BO into host $NEW of account $AL" \
	host merge "$BOB" "$NEW"
err_has "hint: Only the hosts of one account"; ok $? "  with a hint"
refuse "merge an unknown host" 1 "host 999999 does not exist" host merge 999999 "$NEW"
refuse "merge into an unknown host" 1 "host 999999 does not exist" host merge "$OLD" 999999
refuse "a host id that is not a number" 2 'OLD must be a host id, not "x1"' host merge x1 "$NEW"
refuse "a negative host id" 2 'NEW must be a host id' host merge "$OLD" -3
refuse "one id only" 2 "give OLD and NEW host ids" host merge "$OLD"
refuse "an unknown host command" 2 'unknown command "split"' host split "$OLD" "$NEW"
is "$(state)" "$before" "the refusals changed nothing"

# ---- the merge -----------------------------------------------------------------
run host merge "$OLD" "$NEW";    is "$(rc)" 0 "host merge OLD NEW"
grep -q "host $OLD merged into host $NEW: 2 grants moved (1 pending), 1 kept" "$T/out"
ok $? "  reports what moved: $(cat "$T/out")"
is "$(q "SELECT revoked || ',' || merged_into FROM host WHERE id = $OLD")" "true,$NEW" "  the old host is revoked and marked merged"
is "$(q "SELECT string_agg(version || ':' || host_id, ',' ORDER BY version, host_id) FROM credit_grant")" \
   "1:$NEW,2:$NEW,3:$OLD,3:$NEW" "  its grants move but the one of a round both took"
is "$(q "SELECT host_id || ',' || checker_id FROM spot_check")" "$NEW,$CHK" "  its pending spot check moves"
is "$(q "SELECT total FROM host_credit WHERE host_id = $NEW") $(q "SELECT total FROM host_credit WHERE host_id = $OLD")" \
   "6 3" "  its credit moves, less the grant it keeps"
is "$(q "SELECT count(*) FROM host_credit h WHERE h.total <> (SELECT coalesce(sum(credit), 0) FROM credit_grant g
                                                          WHERE g.host_id = h.host_id AND g.status = 'granted')")" \
   0 "  every host's total is still the sum of its granted grants"
is "$(q "SELECT n_agreed FROM host_check_record WHERE host_id = $NEW"),$(q "SELECT count(*) FROM host_check_record WHERE host_id = $OLD")" \
   "3,0" "  its check record moves"
is "$(q "SELECT string_agg(state || ':' || host_id, ',' ORDER BY id) FROM work_unit")" "done:$NEW,live:$OLD" \
   "  its finished unit moves; the live one stays to expire"
is "$(q "SELECT total FROM account_credit WHERE account_id = $AL")" 9 "  the account's credit is unchanged"

# The survivor answers the moved check and agrees: the pending credit of the
# old host is granted to it, not denied.
q "UPDATE spot_check SET fp_host = '{1,2}', fp_checker = '{1,2}'" >/dev/null
is "$(q "SELECT spot_settle(id, now()) FROM spot_check")" agreed "the moved check settles: agreed"
is "$(q "SELECT status FROM credit_grant WHERE version = 2 AND kind = 'round'")" granted "  the pending credit is granted"
is "$(q "SELECT total FROM host_credit WHERE host_id = $NEW")" 8 "  to the survivor"

before=$(state)
refuse "merge an already merged host" 1 "host $OLD was already merged into host $NEW" host merge "$OLD" "$CHK"
refuse "merge into a merged host" 1 "host $OLD was merged into host $NEW" host merge "$CHK" "$OLD"
err_has "hint: Merge into host $NEW instead"; ok $? "  with a hint"
is "$(state)" "$before" "  and change nothing"
run host --help;                 is "$(rc)" 0 "host --help exits 0"
done_testing
