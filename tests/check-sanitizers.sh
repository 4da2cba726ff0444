#!/bin/sh
# cotrain: the sanitizer stage (doc/fuzzing.md, "Sanitizers").  Builds the
# tree with --enable-sanitizers (ASan + UBSan, every report fatal; without
# the CUDA backend, whose runtime the sanitizers do not know) in a build
# folder of its own and runs the tests of tests/sanitizer-tests.txt there,
# with the reports of the programs the tests start (the server, the
# clients, whose stderr the tests keep to themselves) written to
# BUILDDIR/asan/; any report there fails the stage too.  Prints how long the
# build and the tests took.  `make check-sanitizers` runs it.
#
#   tests/check-sanitizers.sh SRCDIR BUILDDIR [JOBS]
#
# BUILDDIR is configured on the first run only (remove it to start over);
# later runs rebuild what changed.  Exit 0 when every test passed and no
# sanitizer reported anything.
set -eu
src=$(cd "$1" && pwd)
bdir=$2
jobs=${3:-2}
mkdir -p "$bdir"
bdir=$(cd "$bdir" && pwd)
now() { date +%s; }
t0=$(now)
cd "$bdir"
if [ ! -f Makefile ]; then
	"$src/configure" -q --enable-sanitizers --without-cuda >configure.log 2>&1 ||
		{ echo "check-sanitizers: configure failed, see $bdir/configure.log" >&2; exit 1; }
fi
make -j"$jobs" >build.log 2>&1 || { echo "check-sanitizers: the build failed, see $bdir/build.log" >&2; exit 1; }
t1=$(now)
tests=$(grep -v '^#' "$src/tests/sanitizer-tests.txt" | tr '\n' ' ')
rm -rf asan && mkdir asan
rc=0
# detect_leaks stays on (the default): a leak at exit is a report.
ASAN_OPTIONS="log_path=$bdir/asan/report:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="print_stacktrace=1:log_path=$bdir/asan/ubsan:${UBSAN_OPTIONS:-}" \
	make -j"$jobs" check TESTS="$tests" >check.log 2>&1 || rc=1
t2=$(now)
reports=$(find asan -type f | wc -l)
grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):' check.log | tail -5 | sed 's/^/check-sanitizers: /'
if [ "$reports" -gt 0 ]; then
	echo "check-sanitizers: $reports sanitizer report(s) of programs the tests started, in $bdir/asan:" >&2
	find asan -type f | head -10 | sed 's/^/  /' >&2
	rc=1
fi
[ "$rc" = 0 ] || grep -E '^(FAIL|ERROR):' check.log | head -20 >&2 || true
echo "check-sanitizers: build $((t1 - t0)) s, tests $((t2 - t1)) s, $(echo "$tests" | wc -w) tests; $([ "$rc" = 0 ] && echo passed || echo FAILED)"
exit "$rc"
