#!/bin/sh
# cotrain tests: the stats export as BOINC stats sites read it (doc/credit.md,
# "Stats export"), through the real cotrain-server, cotrain-admin and
# PostgreSQL (tests/with-pgtmp).
#
# A population made through the API (and psql for credit, a disabled account
# and a legacy row): hostile names (markup, quotes, "]]>", astral and other
# non-ASCII characters), a teamless user, zero-credit users and teams, a
# disabled account, a revoked host, a hidden owner, a user-entered BOINC
# cross-project id.  U+FFFE, U+FFFF and control characters are refused at the
# API.  The export, by `cotrain-admin export stats` and by the server's timer,
# is read by xmllint, by python3's xml.etree and by an importer written here
# the way BOINC stats sites read db_dump (tests/stats_import.py); the folder
# swap is checked under a reader that loops while exports run.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
S="$top_builddir/server/cotrain-server"
IMPORT="$top_srcdir/tests/stats_import.py"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
command -v curl >/dev/null 2>&1 || skip_all "curl not found"
command -v python3 >/dev/null 2>&1 || skip_all "python3 not found"
command -v xmllint >/dev/null 2>&1 || skip_all "xmllint not found (Debian package libxml2-utils)"

T=$(mktemp -d /tmp/cot-stats-XXXXXX)
spid=
cleanup() {
	[ -n "$spid" ] && kill_ours "$spid" && wait "$spid" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM
chmod 755 "$T"
q() { "$PSQL" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1" 2>&1; }

"$A" db migrate >/dev/null || bail_out "db migrate failed"

# start_server [ARGS...]: a server on a free port; sets spid and URL
start_server() {
	# Emptied here, not by the child's redirection, which may come after the
	# first look below: that look would find the last server's address.
	: >"$T/server.out"
	"$S" --db "$COTRAIN_DB" --port 0 --data-dir "$T/data" --log-level warn "$@" >"$T/server.out" 2>&1 &
	spid=$!
	URL=
	for i in $(seq 1 100); do
		URL=$(sed -n 's/^cotrain-server: listening on \(http[^ ]*\).*/\1/p' "$T/server.out" | head -1)
		[ -n "$URL" ] && break
		sleep 0.1
	done
	[ -n "$URL" ] || bail_out "the server did not start: $(cat "$T/server.out")"
}
stop_server() { kill "$spid"; wait "$spid" 2>/dev/null; spid=; }
# api METHOD PATH BODY [KEY]: answer body in $T/body, prints the status
api() {
	curl -s -o "$T/body" -w '%{http_code}' -X "$1" ${4:+-H "Authorization: Bearer $4"} \
	     -H 'Content-Type: application/json' --data-binary "$3" "$URL/v1$2"
}
jget() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$T/body" "$1"; }
# account EMAIL NAME-JSON: prints the account key
account() {
	st=$(api POST /accounts "{\"email\": \"$1\", \"name\": $2, \"password\": \"password1\"}")
	[ "$st" = 201 ] || bail_out "account $1: $st $(cat "$T/body")"
	jget account_key
}
# host KEY CPU-JSON CORES FLOPS: prints the host id
host() {
	st=$(api POST /hosts "{\"cpu_model\": $2, \"cores\": $3, \"flops\": $4, \"memory_bytes\": 8589934592,
	                      \"os_name\": \"Linux\", \"os_version\": \"6.1 <x86_64> & co\"}" "$1")
	[ "$st" = 201 ] || bail_out "host: $st $(cat "$T/body")"
	jget host_id
}

start_server

# ---- the population ----------------------------------------------------------
# Names as JSON (escapes), the importer compares them with what it decodes.
N_ALICE='"<b>x</b><script>alert(\"1\")</script> & '"'"'q'"'"' ]]> é"'
N_BOB='"Bob 😀 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Grüße 世界 \u202eevil"'
N_TEAM='"<Team> \"A&B\" ]]>🚀"'
ka=$(account alice@example.org "$N_ALICE")
kb=$(account Bob@Example.org "$N_BOB")
kc=$(account carol@example.org '"carol (no credit)"')
kd=$(account dave@example.org '"dave <disabled>"')
ke=$(account erin@example.org '"erin"')

is "$(api POST /teams "{\"name\": $N_TEAM, \"description\": \"we <3 \\\"XML\\\" & ]]> 日本\"}" "$ka")" 201 "a team with a hostile name and description"
team=$(jget team_id)
is "$(api POST /teams '{"name": "empty team"}' "$kc")" 201 "a team without credit"
is "$(api POST /teams/$team/join '' "$kd")" 200 "dave joins alice's team"

ha1=$(host "$ka" '"Intel <Core> i7 \"quoted\" & ]]>"' 8 8e10)
ha2=$(host "$ka" '"AMD Ryzen™ 9"' 16 3.2e11)
hb=$(host "$kb" '"Apple M2"' 4 2e10)
hc=$(host "$kc" '"carol cpu"' 2 1e9)
hd=$(host "$kd" '"dave cpu"' 2 1e9)
he1=$(host "$ke" '"erin cpu"' 2 1e9)
he2=$(host "$ke" '"erin cpu 2"' 2 1e9)

# ---- refused at the API --------------------------------------------------------
for bad in '"a\ufffeb"' '"a\uffffb"' '"a\u0001b"' '"a\u001bb"' '"a\rb"'; do
	is "$(api POST /accounts "{\"email\": \"x$(date +%N)@example.org\", \"name\": $bad, \"password\": \"password1\"}")" 400 "account name $bad refused"
done
grep -q 'contains the character U+FFFF, which cannot be stored' "$T/body" 2>/dev/null ||
grep -q 'contains the character U+000D' "$T/body"
ok $? "  with a message naming the character: $(cat "$T/body")"
is "$(api POST /accounts '{"email": "tab@example.org", "name": "tab\there\nnewline", "password": "password1"}')" 201 "tab and newline are accepted"
is "$(api POST /teams '{"name": "t\ufffe"}' "$kc")" 400 "team name with U+FFFE refused"
is "$(api POST /teams '{"name": "ok", "description": "\uffff"}' "$kc")" 400 "team description with U+FFFF refused"
is "$(api POST /hosts '{"flops": 1e9, "cpu_model": "cpu\ufffe"}' "$kc")" 400 "host cpu_model with U+FFFE refused"
is "$(api POST /hosts '{"flops": 1e9, "os_name": "x\u0007"}' "$kc")" 400 "host os_name with BEL refused"
is "$(api PATCH /account '{"name": "z\ufffe"}' "$kc")" 400 "renaming to U+FFFE refused"
is "$(q "SELECT count(*) FROM account WHERE name LIKE '%' || U&'\\FFFE' || '%' OR name LIKE '%' || U&'\\FFFF' || '%'")" 0 "  none of them reached the database"

# ---- account settings ------------------------------------------------------------
XPID=0123456789ABCDEF0123456789abcdef
is "$(api PATCH /account '{"cross_project_id": "0123456789abcdef"}' "$kb")" 400 "a short cross-project id is refused"
is "$(api PATCH /account '{"cross_project_id": "0123456789abcdef0123456789abcdeg"}' "$kb")" 400 "a non-hex cross-project id is refused"
is "$(api PATCH /account '{"show_hosts": "no"}' "$kb")" 400 "show_hosts must be a boolean"
is "$(api PATCH /account '{"email": "x@y"}' "$kb")" 400 "unknown fields are refused"
is "$(api PATCH /account "{\"cross_project_id\": \"$XPID\", \"show_hosts\": false}" "$kb")" 200 "bob enters his BOINC cross-project id and hides his hosts"
want_cpid=$(printf '%s%s' "$(echo $XPID | tr A-F a-f)" bob@example.org | md5sum | cut -c1-32)
is "$(jget cpid)" "$want_cpid" "  GET/PATCH /v1/account show the cpid md5(cross_project_id || email)"
is "$(jget show_hosts)" "False" "  and show_hosts off"
is "$(api GET /account '' "$ka")" 200 "alice's account"
is "$(jget show_hosts)" "True" "  shows her hosts by default, as BOINC"

# ---- credit, a legacy name, a disabled account, a revoked host -------------------
q "INSERT INTO account (email, name, password_hash, cross_project_id)
   VALUES ('legacy@example.org', 'old ' || U&'\\FFFE' || ' name ' || U&'\\FFFF' || chr(1) || '!', 'x', md5('legacy'))" >/dev/null
legacy=$(q "SELECT id FROM account WHERE email = 'legacy@example.org'")
hl=$(q "INSERT INTO host (account_id, token_hash, flops, cores, cpu_model) VALUES ($legacy, sha256('l'::bytea), 4e9, 4, 'legacy' || U&'\\FFFF') RETURNING id")
credit() {  # table key id total rac
	q "INSERT INTO $1 ($2, total, rac, rac_time) VALUES ($3, $4, $5, now() - interval '1 hour')" >/dev/null
}
aid() { q "SELECT id FROM account WHERE lower(email) = lower('$1')"; }
credit account_credit account_id "$(aid alice@example.org)" 1234.5678901 12.25
credit account_credit account_id "$(aid bob@example.org)" 0.000123 1e-9
credit account_credit account_id "$(aid carol@example.org)" 0 0
credit account_credit account_id "$(aid dave@example.org)" 50 5
credit account_credit account_id "$(aid erin@example.org)" 7e6 3e5
credit account_credit account_id "$legacy" 3 0.5
for h in $ha1:1000 $ha2:234.5678901 $hb:0.000123 $hc:0 $hd:50 $he1:3.5e6 $he2:3.5e6 $hl:3; do
	credit host_credit host_id "${h%%:*}" "${h#*:}" 1
done
credit team_credit team_id "$team" 1284.5678901 17.25
q "UPDATE team SET founder_id = $(aid dave@example.org) WHERE id = $team" >/dev/null
is "$(api DELETE /hosts/$he2 '' "$ke")" 200 "erin revokes a host"
"$A" user disable dave@example.org >/dev/null 2>&1 || q "UPDATE account SET disabled = true WHERE email = 'dave@example.org'" >/dev/null
is "$(q "SELECT disabled AND disabled_at IS NOT NULL FROM account WHERE email = 'dave@example.org'")" t "dave's account is disabled, stamped"
is "$(q "SELECT revoked_at IS NOT NULL FROM host WHERE id = $he2")" t "the revoked host is stamped"

# What the importer checks the export against.
q "SELECT json_build_object(
     'users', (SELECT json_agg(json_build_object('id', a.id, 'name', a.name, 'email', lower(a.email),
                 'xpid', a.cross_project_id, 'team', a.team_id, 'total', c.total) ORDER BY a.id)
                 FROM account a JOIN account_credit c ON c.account_id = a.id WHERE NOT a.disabled AND c.total > 0),
     'users_deleted', (SELECT json_agg(json_build_object('id', id, 'cpid', md5(cross_project_id || lower(email))))
                 FROM account WHERE disabled),
     'hosts', (SELECT json_agg(json_build_object('id', h.id, 'owner', h.account_id, 'show', a.show_hosts,
                 'model', h.cpu_model, 'os_version', h.os_version, 'cores', h.cores, 'flops', h.flops,
                 'cpid', md5(h.cpid_seed || lower(a.email)), 'total', c.total) ORDER BY h.id)
                 FROM host h JOIN account a ON a.id = h.account_id JOIN host_credit c ON c.host_id = h.id
                WHERE NOT h.revoked AND NOT a.disabled AND c.total > 0),
     'hosts_deleted', (SELECT json_agg(h.id ORDER BY h.id) FROM host h JOIN account a ON a.id = h.account_id
                WHERE h.revoked OR a.disabled),
     'teams', (SELECT json_agg(json_build_object('id', t.id, 'name', t.name, 'description', t.description,
                 'founder', t.founder_id) ORDER BY t.id)
                 FROM team t JOIN team_credit c ON c.team_id = t.id WHERE c.total > 0),
     'projects', (SELECT coalesce(json_agg(title ORDER BY id), '[]') FROM project),
     'bob_cpid', '$want_cpid', 'legacy', $legacy)" >"$T/expect.json"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/expect.json" ||
	bail_out "could not read the expectations: $(cat "$T/expect.json")"

# ---- the export by cotrain-admin ---------------------------------------------
check_export() {  # DIR WHAT
	for f in tables.xml db_dump.xml; do
		xmllint --noout "$1/$f" 2>"$T/lint"
		ok $? "$2: xmllint accepts $f" || diag "$(head -5 "$T/lint")"
	done
	for f in user team host user_deleted host_deleted; do
		gzip -dc "$1/$f.gz" >"$T/$f.xml" && xmllint --noout "$T/$f.xml" 2>"$T/lint"
		ok $? "$2: xmllint accepts $f.gz" || diag "$(head -5 "$T/lint")"
	done
	python3 "$IMPORT" "$1" "$T/expect.json" >"$T/import.out" 2>&1
	st=$?
	sed 's/^/# /' "$T/import.out"
	ok $st "$2: xml.etree parses every file, the BOINC-style importer reads what was put in"
}
"$A" export stats "$T/stats" >"$T/out" 2>&1
ok $? "cotrain-admin export stats: $(cat "$T/out")"
check_export "$T/stats" "cotrain-admin"
ls -a "$T" | grep -q '^\.stats\.new$'
is $? 1 "  no staging folder is left behind"

# ---- the swap under a concurrent reader ----------------------------------------
touch "$T/reading"
python3 "$IMPORT" --reader "$T/stats" "$T/reading" >"$T/reader.out" 2>&1 &
rpid=$!
i=0; fails=0
while [ $i -lt 12 ]; do
	"$A" export stats "$T/stats" >/dev/null 2>"$T/exp.err" || fails=$((fails + 1))
	i=$((i + 1))
done
rm -f "$T/reading"
wait "$rpid"
rst=$?
is "$fails" 0 "12 exports in a row while a reader loops"
ok $rst "  the reader never saw a missing or partial file: $(tail -1 "$T/reader.out")"

# ---- the server's timed export --------------------------------------------------
stop_server
start_server --stats-dir "$T/timed" --stats-interval 60
for i in $(seq 1 100); do [ -f "$T/timed/tables.xml" ] && break; sleep 0.1; done
[ -f "$T/timed/tables.xml" ]
ok $? "the server's timed export wrote $T/timed"
check_export "$T/timed" "the server's timer"

# ---- served under /stats/ with caching headers ----------------------------------
get() {  # PATH [CURL ARGS...]: the status; body in $T/got, headers in $T/got.h
	_p=$1; shift
	rm -f "$T/got"; curl -s -o "$T/got" -D "$T/got.h" -w '%{http_code}' "$@" "$URL$_p"
}
hdr() { sed -n "s/^$1: \(.*\)\r\$/\1/Ip" "$T/got.h" | head -1; }
st=$(get /stats/tables.xml)
is "$st" 200 "GET /stats/tables.xml"
[ "$st" = 200 ] || diag "the server at $URL: $(kill -0 "$spid" 2>/dev/null && echo running || echo "not running ($(wait "$spid"; echo "exit status $?"))"); curl said: $(curl -sS -o /dev/null "$URL/stats/tables.xml" 2>&1 | head -1); its output: $(tail -5 "$T/server.out")"
cmp -s "$T/got" "$T/timed/tables.xml"; ok $? "  is the exported file"
etag=$(hdr ETag) lm=$(hdr Last-Modified)
ok $([ -n "$etag" ] && [ -n "$lm" ]; echo $?) "  with ETag $etag and Last-Modified $lm"
case $(hdr Content-Type) in application/xml*) ok 0 "  as XML" ;; *) ok 1 "  as XML: $(hdr Content-Type)" ;; esac
is "$(get /stats/tables.xml -H "If-None-Match: $etag")" 304 "  If-None-Match with its tag: 304"
is "$(cat "$T/got" 2>/dev/null | wc -c)" 0 "  with no body"
is "$(get /stats/tables.xml -H "If-None-Match: W/$etag, \"other\"")" 304 "  a weak tag in a list: 304"
is "$(get /stats/tables.xml -H 'If-None-Match: "other"')" 200 "  another tag: 200"
is "$(get /stats/tables.xml -H "If-Modified-Since: $lm")" 304 "  If-Modified-Since its Last-Modified: 304"
is "$(get /stats/tables.xml -H 'If-Modified-Since: Sat, 01 Jan 2000 00:00:00 GMT')" 200 "  an older date: 200"
is "$(get /stats/user.gz)" 200 "GET /stats/user.gz"
cmp -s "$T/got" "$T/timed/user.gz"; ok $? "  is the exported file"
is "$(hdr Content-Type)" application/gzip "  as gzip"
is "$(get /stats/tables.xml -I)" 200 "HEAD /stats/tables.xml"
for bad in nosuch.gz .tables.xml tables.txt '..%2Ftimed%2Ftables.xml' 'TABLES.XML'; do
	is "$(get "/stats/$bad")" 404 "/stats/$bad is 404"
done
stop_server
start_server
is "$(get /stats/tables.xml)" 404 "a server without --stats-dir has no /stats/"
grep -q 'does not export statistics' "$T/got"; ok $? "  and says so"
stop_server

done_testing
