#!/bin/sh
# Generate ./configure and the Makefile.in files from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
mkdir -p build-aux m4
autoreconf --install --force
# automake's TAP driver drives every test (see tests/tests.am).
cp -f "$(automake --print-libdir)/tap-driver.sh" build-aux/tap-driver.sh
