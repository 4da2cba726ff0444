#!/bin/sh
# cotrain tests: three clients training a tiny ALBERT, against the
# single-process replay; see tests/test_rounds_e2e.sh (ROUNDS_MODE=encoder).
ROUNDS_MODE=encoder exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_e2e.sh" "$@"
