#!/bin/sh
# cotrain tests: a hostile-input campaign against the real server and
# PostgreSQL (tests/with-pgtmp): tests/hostile_requests.py sends every route
# of the API, the web pages and the NAT service what a hostile volunteer
# could (fields of every wrong type and size, bodies that are not JSON,
# path ids and queries out of range, bad credentials, bytes that are not
# HTTP), with a round driven far enough that its own routes read their
# bodies.  Each answer must be below 500 and, for the API, doc/api.md's
# error object; a batch of refusals must leave the database unchanged; the
# server must outlive it all, log no internal error, and the stream stay
# tiled exactly (tests/invariants.sh).
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/invariants.sh"
. "$top_srcdir/tests/nat/nat-lib.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
command -v python3 >/dev/null 2>&1 || skip_all "python3 not found"
T=$(mktemp -d /tmp/cotrain-hostile-XXXXXX)
SPID=
cleanup() {
	[ -n "$SPID" ] && kill_ours "$SPID" && wait "$SPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
admin() { "$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" "$@"; }
sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }
wait_for() { _n=$(($1 * 10)); shift; while [ $_n -gt 0 ]; do "$@" && return 0; sleep 0.1; _n=$((_n - 1)); done; return 1; }

mkdir -p "$T/text"
head -c 30000 "$top_srcdir/packaging/demo/corpus.txt" >"$T/text/a.txt"
# two microbatches make the round's batch: one work unit reaches it; no held-out
# evaluation, which would change the tables while a batch runs
printf '{"name": "hostile", "title": "hostile", "dataset": "hostile",
 "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 16},
 "target_batch": 4, "microbatch_size": 2, "work_unit_seconds": 600, "eval_every": 0}\n' >"$T/p.json"
admin db migrate >/dev/null && admin dataset import hostile "$T/text" >/dev/null &&
	admin project create "$T/p.json" >/dev/null || bail_out "could not set up the project"
KEY=$(echo secretpassword | admin user create --password-stdin a@example.org alice | sed -n 's/^account key: //p')
[ -n "$KEY" ] || bail_out "no account key"
# free ports for the NAT service (it listens on P and P+1)
RELAY=$(nat_free_port) || bail_out "no free ports for the NAT service"
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --kdf-iterations 1000 \
	--relay-port "$RELAY" --log-level warn 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -qs "listening on" "$T/server.log" || bail_out "server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")

# A digest of every table's rows but the server's own bookkeeping of time
# (hosts' last contact, which an authenticated refusal may move).
cat >"$T/fingerprint.sql" <<'SQL'
select t from (
  select c.relname || ':' || (xpath('/row/d/text()', query_to_xml(format(
    'select md5(coalesce(string_agg(x::text, '','' order by x::text), '''')) as d from %I.%I x',
    n.nspname, c.relname), false, true, '')))[1]::text as t
  from pg_class c join pg_namespace n on n.oid = c.relnamespace
  where c.relkind = 'r' and n.nspname = 'public' and c.relname not in ('host')
  union all
  select 'host:' || md5(coalesce(string_agg((to_jsonb(h) - 'last_seen')::text, ',' order by h.id), ''))
  from host h) s order by t
SQL
python3 "$top_srcdir/tests/hostile_requests.py" --port "$PORT" --relay-port "$RELAY" --project hostile \
	--account-key="$KEY" --fingerprint-cmd "'$PG_BINDIR/psql' '$COTRAIN_DB' -Atq -f '$T/fingerprint.sql'" \
	>"$T/campaign.tap" 2>"$T/campaign.err"
rc=$?
# the campaign's checks, renumbered into this test's
while IFS= read -r line; do
	case $line in
	"ok "*) ok 0 "${line#ok [0-9]* - }" ;;
	"not ok "*) ok 1 "${line#not ok [0-9]* - }" ;;
	"#"*|"Bail out!"*) echo "$line" ;;
	esac
done <"$T/campaign.tap"
is "$rc" 0 "the campaign ran to its end [stderr: $(head -c 300 "$T/campaign.err" | tr '\n' ' ')]"
kill -0 "$SPID" 2>/dev/null; ok $? "the server is still running"
n=$(grep -ci 'internal\|assert\|sanitizer\|panic' "$T/server.log")
is "$n" 0 "the server logged no internal error"
[ "$n" = 0 ] || grep -i 'internal\|assert\|sanitizer\|panic' "$T/server.log" | head -5 | sed 's/^/# /'
log_clean "$T/server.log"
ok $? "the server log is UTF-8 text, one line per message: what the requests held is escaped"
coverage_exact hostile "the stream is tiled exactly after the campaign"
done_testing
