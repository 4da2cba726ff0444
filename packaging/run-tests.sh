#!/bin/sh
# The test command: install what is missing, build, run every test through
# automake's harness, and end with one line "N passed, N failed, N skipped".
# Exits non-zero when any test failed.
#   packaging/run-tests.sh [TESTS='tests/test_db ...']
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/packaging/build.sh" || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
cd "$top/_build" || exit 1
# The tests start and kill tens of thousands of short processes; with the
# kernel's old default of 32,768 process ids a run wraps them within minutes,
# and a test's signal to a process that exited long ago can then reach one of
# another test.  Give ids room where we may (root, not in a read-only /proc).
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0)
if [ "$(id -u)" = 0 ] && [ "$pid_max" -lt 4194304 ]; then
	echo 4194304 >/proc/sys/kernel/pid_max 2>/dev/null || true
fi
find . -name '*.trs' -delete
make -j"$(nproc)" -k check "$@"
rc=$?
summary=$(find . -name '*.trs' -exec grep -h '^:test-result:' {} + |
	awk '{c[$2]++} END {printf "%d passed, %d failed, %d skipped\n",
	     c["PASS"]+0, c["FAIL"]+c["ERROR"]+c["XPASS"]+0, c["SKIP"]+0}')
failed=$(echo "$summary" | awk '{print $3}')
[ "$rc" -eq 0 ] && [ "${failed:-1}" -ne 0 ] && rc=1
if [ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ]; then
	# make failed outside the harness (a build error): count it.
	summary=$(echo "$summary" | awk '{printf "%d passed, %d failed, %d skipped\n", $1, $3 + 1, $5}')
fi
echo "$summary"
exit "$rc"
