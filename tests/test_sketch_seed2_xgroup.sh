#!/bin/sh
# cotrain tests: the check under a second seed of rounds averaged across
# groups peer to peer (cotrain-server --round-cross-peers); see
# tests/test_sketch_seed2.sh (SEED2_MODE=xgroup).
SEED2_MODE=xgroup exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_sketch_seed2.sh" "$@"
