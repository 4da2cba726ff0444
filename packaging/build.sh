#!/bin/sh
# Install what is missing, then configure and build cotrain in _build/.
# Idempotent: a second run only rebuilds what changed.
#   packaging/build.sh [configure options...]
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
"$top/packaging/install-deps.sh"
if [ ! -x "$top/configure" ] || [ "$top/configure.ac" -nt "$top/configure" ]; then
	"$top/autogen.sh"
fi
mkdir -p "$top/_build"
cd "$top/_build"
if [ ! -f Makefile ] || [ "$#" -gt 0 ]; then
	"$top/configure" -q "$@"
fi
make -j"$(nproc)" >/dev/null
echo "build: cotrain built in $top/_build"
