#!/bin/sh
# cotrain tests: what the NAT service learns is kept in the host row
# (db/migrations/0009_nat_links.sql), on loopback (no root needed), against
# the real server and a real PostgreSQL: the class and public endpoint after
# a registration, the relay totals written in batches (not per chunk), the
# owner's and the public host views, `cotrain-admin status`, and
# GET /v1/hosts/{id}/nat answering from the row after a restart.
. "$top_srcdir/tests/tap.sh"
B=$top_builddir
[ -n "$COTRAIN_DB" ] || exec "$B/tests/with-pgtmp" "$SHELL" "$0" "$@"
. "$top_srcdir/tests/nat/nat-lib.sh"
T=$(mktemp -d /tmp/cotrain-natp-XXXXXX)
NAT_DATA=$T
NAT_SPID=
cleanup() {
	nat_server_stop
	rm -rf "$T"
}
trap cleanup EXIT INT TERM

# Start the server on a free port (a port found free may be taken before
# the server binds it: a few tries).  Sets P and NP.
start_server() {
	for _try in 1 2 3 4 5; do
		P=$(nat_free_port) || bail_out "no free port"
		if nat_server "$T/server.log" 127.0.0.1 "$P" "$@"; then
			NP=$((P + 1))
			return 0
		fi
	done
	cat "$T/server.log" >&2
	bail_out "the server did not start"
}
get() { curl -s -H "Authorization: Bearer $nat_account_key" "http://127.0.0.1:$P$1"; }
# The first integer value of "key" in a JSON text.
jint() { sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" | head -1; }

plan 18
"$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" db migrate >/dev/null ||
	bail_out "could not migrate"
nat_seed "1001:0 1002:0"
# Count the writes of relay totals (test instrumentation, not in the schema).
nat_sql "CREATE TABLE relay_writes (host_id bigint);
CREATE FUNCTION relay_writes_count() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN INSERT INTO relay_writes VALUES (NEW.id); RETURN NEW; END \$\$;
CREATE TRIGGER relay_writes AFTER UPDATE OF relay_bytes_in ON host
  FOR EACH ROW EXECUTE FUNCTION relay_writes_count();" >/dev/null || bail_out "could not add the trigger"
start_server --relay-bandwidth 1000000
nat_drv mkca "$T" nattest || bail_out "could not make the CA"
common() { echo "--server 127.0.0.1 --nat-port $NP --host $1 --token $(nat_token "$1") --ca-dir $T --seconds 20"; }

is "$(nat_sql "SELECT coalesce(nat_class, 'none') FROM host WHERE id = 1001")" none \
	"a host never registered has no class in its row"
out=$(nat_drv observe $(common 1001))
set -- $out
case $out in "SEEN public "*) ok 0 "host 1001 registers and is public ($out)" ;;
	*) ok 1 "host 1001 registers and is public ($out)" ;; esac
row=$(nat_sql "SELECT nat_class, nat_mapping, nat_public_addr, nat_public_port, nat_observed_at > now() - interval '1 minute' FROM host WHERE id = 1001")
is "$row" "public|independent|127.0.0.1|$5|t" "its row holds the class, mapping, public endpoint and time"

# 4 MiB through the relay at 1 MB/s: about 4 s, 64 chunks of 64 KiB each way.
nat_drv accept $(common 1001) --peer 1002 --rung relay --bytes 4194304 >"$T/acc.out" 2>"$T/acc.err" &
APID=$!
out=$(nat_drv dial $(common 1002) --peer 1001 --rung relay --bytes 4194304 2>"$T/dial.err" | grep "^RUNG")
wait $APID
case $out in "RUNG relay "*) ok 0 "4 MiB went through the relay ($out)" ;;
	*) ok 1 "4 MiB went through the relay ($out; $(cat "$T/dial.err"))" ;; esac
# The totals reach the row within a flush interval (2 s) of the session's end.
n=0
while [ $n -lt 50 ]; do
	got=$(nat_sql "SELECT relay_bytes_in >= 4194304 FROM host WHERE id = 1002")
	[ "$got" = t ] && break
	sleep 0.2; n=$((n + 1))
done
row=$(nat_sql "SELECT relay_bytes_in, relay_bytes_out, relay_sessions FROM host WHERE id = 1002")
case $row in 4[0-9][0-9][0-9][0-9][0-9][0-9]\|*\|1) ok 0 "the dialer's row holds its relay totals ($row, after $((n * 200)) ms)" ;;
	*) ok 1 "the dialer's row holds its relay totals ($row, after $((n * 200)) ms)" ;; esac
row=$(nat_sql "SELECT relay_bytes_out >= 4194304, relay_sessions FROM host WHERE id = 1001")
is "$row" "t|1" "the acceptor's row counts the bytes delivered to it and its session"
w=$(nat_sql "SELECT count(*) FROM relay_writes WHERE host_id = 1002")
[ "$w" -ge 1 ] && [ "$w" -le 6 ]
ok $? "the totals were written in batches, not per chunk ($w writes for about 4 s and 64 chunks)"
nat=$(get /v1/hosts/1002/nat)
row=$(nat_sql "SELECT relay_bytes_in FROM host WHERE id = 1002")
is "$(echo "$nat" | jint relay_bytes_in)" "$row" "GET /v1/hosts/1002/nat shows the same total as the row"

# The views.  (The driver's sessions register again from their own
# listening ports: the row holds the latest.)
port=$(nat_sql "SELECT nat_public_port FROM host WHERE id = 1001")
v=$(get /v1/hosts/1001)
echo "$v" | grep -q "\"public_endpoint\" *: *\"127.0.0.1:$port\"" && echo "$v" | grep -q '"class" *: *"public"'
ok $? "the owner's host view shows the class and public endpoint ($v)"
v=$(curl -s "http://127.0.0.1:$P/api/v1/hosts/1001/network")
echo "$v" | grep -q '"class" *: *"public"' && ! echo "$v" | grep -q "127.0.0.1"
ok $? "the public network view shows the class, not the address ($v)"
"$B/server/cotrain-admin" --db "$COTRAIN_DB" --data-dir "$T/srv" status >"$T/status.out" 2>&1
grep -q "^  1001  *1  *[0-9-]* [0-9:]*  *public  *independent  *127.0.0.1:$port " "$T/status.out"
ok $? "cotrain-admin status shows the host's class ($(grep '^  1001 ' "$T/status.out"))"
grep -A2 "^hosts$" "$T/status.out" | grep -q "PUBLIC  *MAPPED  *NAT  *UNKNOWN"
ok $? "  and counts hosts per class"

# A restart: the broker forgets, the row remembers.
nat_server_stop
start_server --relay-bandwidth 1000000
nat=$(get /v1/hosts/1001/nat)
echo "$nat" | grep -q '"reachability" *: *"public"' && echo "$nat" | grep -q '"source" *: *"database"' &&
	echo "$nat" | grep -q '"public_addr" *: *"127.0.0.1"'
ok $? "after a restart GET /v1/hosts/{id}/nat answers from the row ($nat)"
is "$(echo "$nat" | jint relay_sessions)" 1 "  with the relay totals"
is "$(echo "$nat" | jint advertised_port)" "$(nat_sql "SELECT nat_advertised_port FROM host WHERE id = 1001")" \
	"  and the advertised port the row keeps"
# A meeting before either host registered again is planned from the rows:
# 1001 is public, so 1002 dials it directly at its advertised port (an
# unknown class would have sent them through the relay).
line() { nat_drv line --server 127.0.0.1 --nat-port $NP --host 1 --token x --seconds 5 "$@"; }
line MEET nattest 0 1001 1002 "$(nat_token 1001)" ACCEPT >"$T/meet-acc.out" &
MPID=$!
sleep 0.3
out=$(line MEET nattest 0 1002 1001 "$(nat_token 1002)" DIAL)
wait $MPID
adv=$(nat_sql "SELECT nat_advertised_port FROM host WHERE id = 1001")
case $out in "GO direct 127.0.0.1 $adv "*) st=0 ;; *) st=1 ;; esac
ok $st "after a restart a meeting is planned from the rows: direct to port $adv (dialer: $out; acceptor: $(cat "$T/meet-acc.out"))"
out=$(nat_drv observe $(common 1001))
nat=$(get /v1/hosts/1001/nat)
echo "$nat" | grep -q '"source" *: *"memory"'
ok $? "a new registration is answered from memory again ($nat)"
kill -0 "$NAT_SPID"
ok $? "the server is still running"
done_testing
