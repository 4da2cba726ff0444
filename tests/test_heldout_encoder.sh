#!/bin/sh
# cotrain tests: held-out evaluation of an encoder (a tiny ALBERT on bytes):
# masked-LM loss and accuracy; see tests/test_heldout_e2e.sh
# (HELDOUT_MODE=encoder).
HELDOUT_MODE=encoder exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_heldout_e2e.sh" "$@"
