#!/bin/sh
# The test command: install what is missing, build, run every test through
# automake's harness, and end with one line "N passed, N failed, N skipped".
# Exits non-zero when any test failed.
#   packaging/run-tests.sh [TESTS='tests/test_db ...']
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/packaging/build.sh" || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
cd "$top/_build"
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
