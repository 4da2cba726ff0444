#!/bin/sh
# cotrain tests: the web site's sign-up form against the real server and
# PostgreSQL (tests/with-pgtmp), driven with curl as a browser would: the
# form's token and cookie, an account made with the exact attach command
# shown, cross-site posts refused, the API's account rules, markup shown as
# text, and a flood from one address cut at --auth-per-minute.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
command -v curl >/dev/null 2>&1 || skip_all "curl not found"
T=$(mktemp -d /tmp/cotrain-signup-XXXXXX)
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
printf '{"name": "tiny", "title": "tiny", "dataset": "tiny",
 "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 16},
 "target_batch": 64, "microbatch_size": 2}\n' >"$T/p.json"
admin db migrate >/dev/null && admin dataset import tiny "$T/text" >/dev/null &&
	admin project create "$T/p.json" >/dev/null || bail_out "could not set up the project"
"$B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "$T/srv" --port 0 --kdf-iterations 1000 \
	--auth-per-minute 4 --log-level warn 2>"$T/server.log" &
SPID=$!
wait_for 20 grep -q 'listening on' "$T/server.log" || bail_out "server did not start"
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/server.log")
U="http://127.0.0.1:$PORT"

# get_form: fetch the form with a fresh cookie jar; TOKEN is its hidden field.
get_form() {
	rm -f "$T/jar"
	curl -s -c "$T/jar" -D "$T/form.h" -o "$T/form.html" "$U/signup?project=tiny"
	TOKEN=$(sed -n 's/.*name="csrf" value="\([^"]*\)".*/\1/p' "$T/form.html")
}
# post ARGS...: send the form (curl --data-urlencode ARGS) with the jar;
# prints the status, the page lands in $T/post.html, the headers in $T/post.h.
post() {
	curl -s -b "$T/jar" -D "$T/post.h" -o "$T/post.html" -w '%{http_code}' "$U/signup" "$@"
}
accounts() { sql "select count(*) from account"; }

get_form
grep -q '^HTTP/1.1 200' "$T/form.h"; ok $? "GET /signup answers the form"
ok $([ ${#TOKEN} -ge 40 ]; echo $?) "  with a token in a hidden field"
grep -q "cotrain_csrf	$TOKEN" "$T/jar"; ok $? "  and the same token in a cookie"
grep -qi '^Set-Cookie: cotrain_csrf=.*HttpOnly; SameSite=Strict' "$T/form.h"; ok $? "  HttpOnly, SameSite=Strict"
grep -qi '^Cache-Control: no-store' "$T/form.h" && grep -qi "^Content-Security-Policy: default-src 'none'" "$T/form.h"
ok $? "  not cached, with the site's Content-Security-Policy"

n0=$(accounts)
st=$(post --data-urlencode "csrf=$TOKEN" --data-urlencode project=tiny --data-urlencode email=vol@example.org \
	--data-urlencode 'name=<b>Vol</b> & co' --data-urlencode 'password=a good passphrase')
is "$st" 201 "a good form makes an account"
KEY=$(sed -n 's/.*<pre id="key">\([^<]*\)<.*/\1/p' "$T/post.html")
grep -q "<pre id=\"attach\">cotrainctl attach $U/projects/tiny --key $KEY</pre>" "$T/post.html"
ok $? "  the page shows the account key and the exact attach command"
grep -q 'Welcome, <bdi>&lt;b&gt;Vol&lt;/b&gt; &amp; co</bdi>' "$T/post.html"; ok $? "  the name shows as text, not markup"
is "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$U/v1/account")" 200 "  and the key works with the API"
is "$(accounts)" $((n0 + 1)) "  one account more"

# Cross-site posts: another site's form cannot send the SameSite cookie,
# nor read the token; a browser names the other origin.
get_form
n0=$(accounts)
st=$(post -H "Origin: http://evil.example" --data-urlencode "csrf=$TOKEN" --data-urlencode email=x1@example.org \
	--data-urlencode name=x --data-urlencode 'password=a good passphrase')
is "$st" 403 "a post from another origin is refused"
grep -q 'cross-site form post refused' "$T/post.html"; ok $? "  saying why"
st=$(post -H "Sec-Fetch-Site: cross-site" --data-urlencode "csrf=$TOKEN" --data-urlencode email=x2@example.org \
	--data-urlencode name=x --data-urlencode 'password=a good passphrase')
is "$st" 403 "a post the browser marks cross-site is refused"
st=$(curl -s -o /dev/null -w '%{http_code}' "$U/signup" --data-urlencode "csrf=$TOKEN" \
	--data-urlencode email=x3@example.org --data-urlencode name=x --data-urlencode 'password=a good passphrase')
is "$st" 403 "a post without the cookie is refused"
st=$(post --data-urlencode "csrf=AAAA$TOKEN" --data-urlencode email=x4@example.org --data-urlencode name=x \
	--data-urlencode 'password=a good passphrase')
is "$st" 403 "a post whose token is not the cookie's is refused"
is "$(accounts)" "$n0" "  none of them made an account"

# The API's rules, shown on the form again with what was typed.
bad() {  # WHAT STATUS MESSAGE ARGS...
	_w=$1 _s=$2 _m=$3; shift 3
	get_form
	_n=$(accounts)
	is "$(post --data-urlencode "csrf=$TOKEN" "$@")" "$_s" "$_w: $_s"
	grep -qF -- "$_m" "$T/post.html"; ok $? "  says \"$_m\""
	is "$(accounts)" "$_n" "  and makes no account"
}
bad "a short password" 400 'field &quot;password&quot; must be 8 to' \
	--data-urlencode email=s@example.org --data-urlencode name=s --data-urlencode password=short
bad "an address without @" 400 'field &quot;email&quot; is not an email address' \
	--data-urlencode email=nobody --data-urlencode name=s --data-urlencode 'password=a good passphrase'
bad "a taken address" 409 'an account with this email address already exists' \
	--data-urlencode email=vol@example.org --data-urlencode name=s --data-urlencode 'password=a good passphrase'
bad "a name the stats export cannot carry" 400 'contains the character U+FFFF' \
	--data-urlencode email=u@example.org --data-urlencode "name=$(printf 'a\357\277\277')" \
	--data-urlencode 'password=a good passphrase'
bad "bytes that are not UTF-8" 400 'field &quot;name&quot; is not valid UTF-8' \
	--data-urlencode email=u@example.org --data 'name=%FF%FE' --data-urlencode 'password=a good passphrase'
bad "a field given twice" 400 'field &quot;email&quot; is given twice' \
	--data-urlencode email=u@example.org --data-urlencode email=v@example.org --data-urlencode name=s \
	--data-urlencode 'password=a good passphrase'
bad "an empty name" 400 'field &quot;name&quot; must be 1 to 100' \
	--data-urlencode email=u@example.org --data-urlencode 'password=a good passphrase'
grep -q 'value="u@example.org"' "$T/post.html"; ok $? "  the form keeps the address typed"

# A flood from one address: at most --auth-per-minute (4) sign-ups a
# minute, then 429 with Retry-After.
n0=$(accounts) codes=
for i in 1 2 3 4 5 6 7 8; do
	get_form
	codes="$codes $(post --data-urlencode "csrf=$TOKEN" --data-urlencode "email=flood$i@example.org" \
		--data-urlencode name=flood --data-urlencode 'password=a good passphrase')"
done
case "$codes" in *429*) ok 0 "a flood of sign-ups from one address is cut: $codes" ;;
	*) ok 1 "a flood of sign-ups from one address is cut: $codes" ;; esac
grep -qi '^Retry-After: [0-9]' "$T/post.h"; ok $? "  with Retry-After"
grep -q 'too many log-ins or sign-ups from this address' "$T/post.html"; ok $? "  and says why"
ok $([ $(($(accounts) - n0)) -le 4 ]; echo $?) "  at most 4 accounts made ($(($(accounts) - n0)))"
done_testing
