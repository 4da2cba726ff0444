#!/bin/sh
# cotrain tests: every C source and header of the tree is formatted as
# .clang-format says (clang-format 14, Debian 12's).  To reformat after an
# edit: clang-format -i FILE... from the top of the tree.
. "$top_srcdir/tests/tap.sh"
command -v clang-format >/dev/null 2>&1 ||
	skip_all "clang-format is not installed (Debian package clang-format)"
v=$(clang-format --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
[ "$v" = 14 ] ||
	skip_all "clang-format ${v:-of unknown version} lays code out differently from version 14, which the tree follows"
cd "$top_srcdir" || bail_out "no source tree at $top_srcdir"
[ -f .clang-format ] || bail_out ".clang-format is missing from $top_srcdir"
files=$(find server client shared kernels tests -name '*.[ch]' | sort)
n=$(echo "$files" | wc -l)
plan 2
ok $([ "$n" -ge 100 ]; echo $?) "the tree's C files are found ($n)"
# shellcheck disable=SC2086
bad=$(clang-format --dry-run -Werror $files 2>&1 | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p' | sort -u)
ok $([ -z "$bad" ]; echo $?) "every C file is formatted as .clang-format says${bad:+ (not: $(echo $bad | tr '\n' ' ')— run clang-format -i on them)}"
done_testing
