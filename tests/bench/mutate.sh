#!/bin/sh
# The mutation check: does the suite catch small deliberate bugs?  Each line
# of the list (tests/bench/mutations.txt by default) names a file, a text to
# find in it (exactly once), its replacement and the tests that must catch
# it, separated by " @@ ":
#
#   FILE @@ FIND @@ REPLACE @@ TEST [TEST...]
#
# '#' starts a comment line; in FIND and REPLACE, "\n" is a newline and "\t"
# a tab.  For each mutation, in a scratch copy of the tree (the working tree
# as it is, built once in its own folder): apply it, rebuild, run the named
# tests through the harness, undo it.  A mutation is caught when a named test
# fails; "not applied" when FIND is not in FILE exactly once (the list has
# gone stale: fix it); "does not build" when the compiler refuses it (not a
# test's catch: rewrite it).  Prints one line per mutation and ends with
# "N caught / M listed".  Exits 0 only when every mutation is caught.
#
#   tests/bench/mutate.sh [LIST] [FIRST-LINE-NUMBER]
#
# Runs as root (the suite's netns tests) or not (they skip: name tests that
# run either way).  Keeps nothing: the scratch copy is removed on every exit
# path.  Takes about a minute per mutation whose tests are unit tests.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
list=${1:-$top/tests/bench/mutations.txt}
first=${2:-1}
[ -r "$list" ] || { echo "mutate: cannot read \"$list\"" >&2; exit 2; }
S=$(mktemp -d /tmp/cotrain-mutate-XXXXXX)
trap 'rm -rf "$S"' EXIT INT TERM

# The scratch copy: every file git knows or does not ignore, as it is now.
(cd "$top" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) |
	(mkdir -p "$S/src" && tar -xf - -C "$S/src") || { echo "mutate: could not copy the tree" >&2; exit 2; }
cd "$S/src" && ./autogen.sh >/dev/null 2>&1 && mkdir -p _build && cd _build &&
	../configure -q >/dev/null 2>&1 && make -j"$(nproc)" >/dev/null 2>&1 ||
	{ echo "mutate: the unmutated tree does not build" >&2; exit 2; }

caught=0 listed=0 n=0
while IFS= read -r line; do
	n=$((n + 1))
	[ "$n" -lt "$first" ] && continue
	case "$line" in '#'* | '') continue ;; esac
	listed=$((listed + 1))
	file=$(printf '%s' "$line" | awk -F ' @@ ' '{print $1}')
	tests=$(printf '%s' "$line" | awk -F ' @@ ' '{print $4}')
	cp "$S/src/$file" "$S/orig" 2>/dev/null || { echo "line $n: $file: no such file"; continue; }
	if ! MUT_LINE=$line python3 - "$S/src/$file" <<'EOF'
import os, sys
parts = os.environ["MUT_LINE"].split(" @@ ")
find, repl = (p.replace("\\n", "\n").replace("\\t", "\t") for p in parts[1:3])
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
if text.count(find) != 1:
    sys.exit(1)
open(path, "w", encoding="utf-8").write(text.replace(find, repl))
EOF
	then
		echo "line $n: not applied ($file: the text to find is not there exactly once)"
		continue
	fi
	cd "$S/src/_build"
	if ! make -j"$(nproc)" >"$S/make.out" 2>&1; then
		verdict="does not build"
	else
		find . -name '*.trs' -delete
		make -k check TESTS="$tests" >"$S/check.out" 2>&1
		failed=$(grep -h '^:test-result: \(FAIL\|ERROR\)' $(find . -name '*.trs') 2>/dev/null | wc -l)
		ran=$(grep -h '^:test-result:' $(find . -name '*.trs') 2>/dev/null | wc -l)
		if [ "$ran" -eq 0 ]; then
			verdict="no test ran (check the names: $tests)"
		elif [ "$failed" -gt 0 ]; then
			verdict="caught ($failed failing results)"
			caught=$((caught + 1))
		else
			verdict="MISSED ($ran results, all passing)"
		fi
	fi
	cp "$S/orig" "$S/src/$file"
	touch "$S/src/$file"
	# printf, not echo: dash's echo would turn the list's "\n" into newlines.
	printf 'line %s: %s: %s: %s [%s]\n' "$n" "$verdict" "$file" \
		"$(printf '%s' "$line" | awk -F ' @@ ' '{print $2 " -> " $3}' | cut -c1-110)" "$tests"
done <"$list"
# Leave the scratch build as the unmutated tree was (for the next run's make).
echo "$caught caught / $listed listed"
[ "$caught" -eq "$listed" ]
