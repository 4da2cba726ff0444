#!/bin/sh
# cotrain tests: seven clients averaging in groups of at most three; see
# tests/test_rounds_e2e.sh (ROUNDS_MODE=groups).
ROUNDS_MODE=groups exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_e2e.sh" "$@"
