#!/bin/sh
# cotrain benchmark: cotrain-server work assignments per second with 32
# concurrent hosts (p50/p99 latency), beside the ceiling measured in the same
# run on the same PostgreSQL cluster: pgbench select-only and simple-update
# with 32 clients.  Prints the figures and the ratios.  Not run by make check.
#
#   tests/bench/bench-scheduler.sh [SECONDS] [SERVER_THREADS]
#
# SERVER_THREADS defaults to the server's own default (--threads).
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
secs=${1:-10}
threads=${2:-}
b=${top_builddir:-.}
PG_BINDIR=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
for f in "$b/server/cotrain-server" "$b/tests/bench/bench_scheduler" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-scheduler: $f is missing; run make (and make check TESTS=) first" >&2; exit 1; }
done
[ -x "$PG_BINDIR/pgbench" ] || { echo "bench-scheduler: no pgbench in $PG_BINDIR" >&2; exit 1; }

inner=$(mktemp)
trap 'rm -f "$inner"' EXIT INT TERM
cat > "$inner" <<EOS
set -eu
load=\$("$b/tests/bench/bench_scheduler" "$b/server/cotrain-server" --hosts 32 --seconds $secs ${threads:+--threads $threads})
echo "\$load"
"$PG_BINDIR/pgbench" -q -i -s 10 >/dev/null 2>&1
sel=\$("$PG_BINDIR/pgbench" -n -S -c 32 -j 2 -T $secs 2>/dev/null | sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p')
upd=\$("$PG_BINDIR/pgbench" -n -N -c 32 -j 2 -T $secs 2>/dev/null | sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p')
echo "pgbench_select_only_tps=\$sel pgbench_simple_update_tps=\$upd"
EOS
out=$("$b/tests/with-pgtmp" sh "$inner")
echo "$out"
echo "$out" | awk '
	{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
	END {
		printf "\ncotrain-server, 32 concurrent hosts, %s server threads:\n", v["server_threads"]
		printf "  work assignments/s   %10.0f   (p50 %.2f ms, p99 %.2f ms)\n", v["assignments_per_s"], v["p50_ms"], v["p99_ms"]
		printf "  pgbench select-only  %10.0f tps   ratio %.3f\n", v["pgbench_select_only_tps"], v["assignments_per_s"] / v["pgbench_select_only_tps"]
		printf "  pgbench simple-update%10.0f tps   ratio %.3f\n", v["pgbench_simple_update_tps"], v["assignments_per_s"] / v["pgbench_simple_update_tps"]
		printf "  goal: >= 2000 assignments/s with p99 < 50 ms: %s\n", (v["assignments_per_s"] >= 2000 && v["p99_ms"] < 50) ? "met" : "NOT met"
	}'
