#!/bin/sh
# cotrain tests: three clients training a tiny ALBERT on the ids of a
# Unigram tokenizer, against the single-process replay; see
# tests/test_rounds_e2e.sh (ROUNDS_MODE=subword).
ROUNDS_MODE=subword exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_e2e.sh" "$@"
