#!/bin/sh
# cotrain benchmark: leaderboard latency with 100,000 users (and as many
# hosts), 1,000 teams and 1,000,000 ledger rows, beside a plain indexed
# SELECT of the same rows on the same PostgreSQL in the same run.
#
#   tests/bench/bench-leaderboard.sh [REQUESTS]
#
# For REQUESTS requests each (default 300, over one kept-alive connection):
# the leaderboard page (HTML), the users JSON first page, JSON pages at
# random depths (keyset cursors), the JSON by recent average credit, and a
# user's page JSON; then the same rows read by psql with a plain indexed
# SELECT ... LIMIT 50.  Prints p50/p99 in ms and the ratio to the SELECT.
# Goal: p99 < 50 ms; printed, never asserted.  Not run by make check.
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
n=${1:-300}
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "$(dirname "$0")" && pwd)
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
for f in "$b/server/cotrain-server" "$b/server/cotrain-admin" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-leaderboard: $f is missing; run make first" >&2; exit 1; }
done
command -v curl >/dev/null || { echo "bench-leaderboard: curl is missing" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
cat > "$work/inner.sh" <<EOS
set -eu
cd "$work"
"$b/server/cotrain-admin" db migrate >/dev/null
psql -q -v ON_ERROR_STOP=1 -f "$src/bench-data.sql"
echo "ledger_rows=\$(psql -Atc 'SELECT count(*) FROM credit_grant') users=\$(psql -Atc 'SELECT count(*) FROM account_credit')"

# Cursors at random depths: "total,id,rank" of the row before the page.
psql -Atc "SELECT total::text || ',' || account_id || ',' || rk FROM (SELECT total, account_id,
           row_number() OVER (ORDER BY total DESC, account_id DESC) rk FROM account_credit) x
           WHERE rk IN (SELECT (random() * 99000)::int + 1 FROM generate_series(1, $n))" > cursors
"$b/server/cotrain-server" --db "\$COTRAIN_DB" --port 0 --data-dir "$work/data" --log-level warn > server.out 2>&1 &
spid=\$!
trap 'kill \$spid 2>/dev/null; wait \$spid 2>/dev/null || true' EXIT
for i in \$(seq 1 100); do
	url=\$(sed -n 's/^cotrain-server: listening on \(http[^ ]*\).*/\1/p' server.out | head -1)
	[ -n "\$url" ] && break
	sleep 0.1
done
[ -n "\$url" ] || { cat server.out >&2; exit 1; }

# One curl per kind, every transfer on one kept-alive connection; ms each.
measure() {  # name, file of URLs
	curl -s -K "\$2" -w '%{http_code} %{time_total}\n' > "\$1.t"
	bad=\$(awk '\$1 != 200' "\$1.t" | wc -l)
	[ "\$bad" -eq 0 ] || echo "warning: \$bad answers of \$1 were not 200" >&2
	awk '{ print \$2 * 1000 }' "\$1.t" | sort -n > "\$1.ms"
}
urls() { while read -r u; do printf 'url = "%s"\noutput = "/dev/null"\n' "\$u"; done; }
for i in \$(seq 1 $n); do echo "\$url/leaderboard"; done | urls > page.k
for i in \$(seq 1 $n); do echo "\$url/api/v1/credit/users?limit=50"; done | urls > first.k
sed "s|^|\$url/api/v1/credit/users?limit=50\&after=|" cursors | urls > deep.k
for i in \$(seq 1 $n); do echo "\$url/api/v1/credit/users?order=rac&limit=50"; done | urls > rac.k
for i in \$(seq 1 $n); do echo "\$url/api/v1/credit/users/\$(( (i * 7919) % 100000 + 1 ))"; done | urls > user.k
curl -s "\$url/api/v1/credit/users?limit=1" > /dev/null
for k in page first deep rac user; do measure \$k \$k.k; done

# The same rows by a plain indexed SELECT (psql, one session, \timing).
{
	printf '%s\n' '\\timing on'
	for i in \$(seq 1 $n); do
		echo "SELECT account_id, total FROM account_credit ORDER BY total DESC, account_id DESC LIMIT 50;"
	done
	while IFS=, read -r t id rk; do
		echo "SELECT account_id, total FROM account_credit WHERE (total, account_id) < (\$t, \$id) ORDER BY total DESC, account_id DESC LIMIT 50;"
	done < cursors
} > sel.sql
psql -q -o /dev/null -f sel.sql | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | sort -n > select.ms
for k in page first deep rac user select; do
	awk -v k=\$k '{ a[NR] = \$1 } END { i50 = int(NR * 0.5); i99 = int(NR * 0.99); if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1;
	             printf "%s_n=%d %s_p50=%.3f %s_p99=%.3f\n", k, NR, k, a[i50], k, a[i99] }' \$k.ms
done
EOS
out=$("$b/tests/with-pgtmp" sh "$work/inner.sh")
echo "$out" | tr ' ' '\n' | grep = | awk -F= '{ v[$1] = $2 } END {
	printf "leaderboards: %d users, %d ledger rows\n", v["users"], v["ledger_rows"]
	printf "  %-34s %9s %9s %12s\n", "", "p50 ms", "p99 ms", "p99 / SELECT"
	split("page first deep rac user", ks, " ")
	name["page"] = "leaderboard page (HTML)"; name["first"] = "users JSON, first page"
	name["deep"] = "users JSON, pages at random depths"; name["rac"] = "users JSON by recent average"
	name["user"] = "one user JSON"
	for (i = 1; i <= 5; i++) { k = ks[i]
		printf "  %-34s %9.3f %9.3f %12.2f\n", name[k], v[k "_p50"], v[k "_p99"], v[k "_p99"] / v["select_p99"] }
	printf "  %-34s %9.3f %9.3f %12s\n", "plain indexed SELECT (psql)", v["select_p50"], v["select_p99"], "1.00"
	worst = 0; split("first deep rac user page", ks, " ")
	for (i = 1; i <= 5; i++) if (v[ks[i] "_p99"] > worst) worst = v[ks[i] "_p99"]
	printf "  goal p99 < 50 ms: %s (worst p99 %.3f ms)\n", worst < 50 ? "met" : "NOT met", worst
}'
