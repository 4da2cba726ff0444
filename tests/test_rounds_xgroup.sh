#!/bin/sh
# cotrain tests: nine clients averaging in three groups of three, across
# groups peer to peer (cotrain-server --round-cross-peers); see
# tests/test_rounds_e2e.sh (ROUNDS_MODE=xgroup).
ROUNDS_MODE=xgroup exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_e2e.sh" "$@"
