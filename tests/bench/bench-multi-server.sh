#!/bin/sh
# cotrain benchmark: work assignments per second with two cotrain-server
# processes on one PostgreSQL (doc/design.md, "Several server processes")
# against one process, measured in the same run: the same 32 hosts asking
# for work as fast as they can (tests/bench/bench_scheduler), first all on
# one server, then spread over two (host i asks server i mod 2), each on a
# fresh cluster.  Prints both figures and the ratio.  Not run by make check.
#
#   tests/bench/bench-multi-server.sh [SECONDS] [SERVER_THREADS]
#
# Run from the build directory (top_builddir), or set top_builddir.
set -eu
secs=${1:-10}
threads=${2:-}
b=${top_builddir:-.}
for f in "$b/server/cotrain-server" "$b/tests/bench/bench_scheduler" "$b/tests/with-pgtmp"; do
	[ -x "$f" ] || { echo "bench-multi-server: $f is missing; run make (and make check TESTS=) first" >&2; exit 1; }
done
run() { # SERVERS
	"$b/tests/with-pgtmp" "$b/tests/bench/bench_scheduler" "$b/server/cotrain-server" --hosts 32 \
		--seconds "$secs" --servers "$1" ${threads:+--threads $threads}
}
one=$(run 1)
two=$(run 2)
echo "$one"
echo "$two"
printf '%s\n%s\n' "$one" "$two" | awk '
	{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[NR, kv[1]] = kv[2] } }
	END {
		printf "\nwork assignments/s, 32 hosts, %d CPUs:\n", '"$(nproc)"'
		printf "  one server process   %8.0f   (p50 %.2f ms, p99 %.2f ms)\n", v[1, "assignments_per_s"], v[1, "p50_ms"], v[1, "p99_ms"]
		printf "  two server processes %8.0f   (p50 %.2f ms, p99 %.2f ms)   ratio %.3f\n", v[2, "assignments_per_s"], v[2, "p50_ms"], v[2, "p99_ms"], v[2, "assignments_per_s"] / v[1, "assignments_per_s"]
	}'
