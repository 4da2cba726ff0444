#!/bin/sh
# cotrain benchmark: the BOINC stats export (cotrain-admin export stats) at
# 100,000 users and hosts, 1,000 teams and 1,000,000 ledger rows
# (tests/bench/bench-data.sql, the data of bench-leaderboard.sh), beside a
# plain COPY of the same rows, gzip-compressed, on the same PostgreSQL in
# the same run.
#
#   tests/bench/bench-export.sh [RUNS]
#
# Runs the export RUNS times (default 3) and the reference as often; prints
# the best and median wall time of each, their ratio, and the size of every
# file.  Nothing is asserted.  Not run by make check.
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
runs=${1:-3}
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "$(dirname "$0")" && pwd)
for f in "$b/server/cotrain-admin" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-export: $f is missing; run make first" >&2; exit 1; }
done
command -v gzip >/dev/null || { echo "bench-export: gzip is missing" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
chmod 755 "$work"
cat > "$work/inner.sh" <<EOS
set -eu
cd "$work"
"$b/server/cotrain-admin" db migrate >/dev/null
psql -q -v ON_ERROR_STOP=1 -f "$src/bench-data.sql"
echo "ledger_rows=\$(psql -Atc 'SELECT count(*) FROM credit_grant') users=\$(psql -Atc 'SELECT count(*) FROM account_credit') hosts=\$(psql -Atc 'SELECT count(*) FROM host_credit')"
now() { date +%s.%N; }
# The reference: the rows and columns the export writes, by COPY, through
# gzip, one snapshot; what any export must at least do.
cat > copy.sql <<'SQL'
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
\copy (SELECT a.id, a.name, a.created_at, c.total, c.rac, c.rac_time, md5(a.cross_project_id || lower(a.email)), a.team_id FROM account a JOIN account_credit c ON c.account_id = a.id WHERE NOT a.disabled AND c.total > 0 ORDER BY a.id) TO PROGRAM 'gzip > ref/user.gz'
\copy (SELECT h.id, h.account_id, c.total, c.rac, c.rac_time, h.cpu_model, h.os_name, h.os_version, h.created_at, h.last_seen, h.cores, h.flops / h.cores, h.memory_bytes, md5(h.cpid_seed || lower(a.email)) FROM host h JOIN account a ON a.id = h.account_id JOIN host_credit c ON c.host_id = h.id WHERE NOT h.revoked AND NOT a.disabled AND c.total > 0 ORDER BY h.id) TO PROGRAM 'gzip > ref/host.gz'
\copy (SELECT t.id, t.name, t.founder_id, c.total, c.rac, c.rac_time, t.created_at, t.description FROM team t JOIN team_credit c ON c.team_id = t.id WHERE c.total > 0 ORDER BY t.id) TO PROGRAM 'gzip > ref/team.gz'
COMMIT;
SQL
i=0
while [ \$i -lt $runs ]; do
	t0=\$(now)
	"$b/server/cotrain-admin" export stats "$work/stats" >/dev/null
	t1=\$(now)
	rm -rf ref; mkdir ref
	psql -q -v ON_ERROR_STOP=1 -f copy.sql
	t2=\$(now)
	echo "export_s=\$(echo "\$t1 - \$t0" | bc -l) copy_s=\$(echo "\$t2 - \$t1" | bc -l)"
	i=\$((i + 1))
done
for f in "$work"/stats/*; do
	n=\$(basename "\$f")
	case "\$n" in *.gz) raw=\$(gzip -dc "\$f" | wc -c) ;; *) raw=\$(wc -c < "\$f") ;; esac
	echo "file=\$n:\$(wc -c < "\$f"):\$raw"
done
for f in ref/*; do echo "ref=\$(basename "\$f"):\$(wc -c < "\$f"):\$(gzip -dc "\$f" | wc -c)"; done
EOS
"$b/tests/with-pgtmp" sh "$work/inner.sh" > "$work/out"
tr ' ' '\n' < "$work/out" | grep = | awk -F= '
	$1 == "export_s" { e[++ne] = $2 } $1 == "copy_s" { c[++nc] = $2 }
	$1 == "file" { files[++nf] = $2 } $1 == "ref" { refs[++nr] = $2 }
	$1 == "users" || $1 == "hosts" || $1 == "ledger_rows" { v[$1] = $2 }
	function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
	END {
		sort(e, ne); sort(c, nc)
		printf "stats export: %d users and %d hosts with credit, %d ledger rows, %d runs\n", v["users"], v["hosts"], v["ledger_rows"], ne
		printf "  %-44s %9s %9s %10s\n", "", "best s", "median s", "best / COPY"
		printf "  %-44s %9.3f %9.3f %10.2f\n", "cotrain-admin export stats", e[1], e[int((ne + 1) / 2)], e[1] / c[1]
		printf "  %-44s %9.3f %9.3f %10s\n", "reference: COPY of the same rows | gzip", c[1], c[int((nc + 1) / 2)], "1.00"
		printf "  %-44s %12s %14s\n", "file", "bytes", "uncompressed"
		for (i = 1; i <= nf; i++) { split(files[i], x, ":"); printf "  %-44s %12d %14d\n", x[1], x[2], x[3]; te += x[2]; tu += x[3] }
		printf "  %-44s %12d %14d\n", "export, all files", te, tu
		for (i = 1; i <= nr; i++) { split(refs[i], x, ":"); printf "  %-44s %12d %14d\n", "reference " x[1], x[2], x[3]; re += x[2]; ru += x[3] }
		printf "  %-44s %12d %14d\n", "reference, all files", re, ru
	}'
