#!/bin/sh
# cotrain tests: a GPU volunteer in local mode, its inner steps on the GPU,
# in rounds with CPU peers; see tests/test_rounds_gpu.sh
# (GPU_ROUNDS_MODE=local).
GPU_ROUNDS_MODE=local exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_gpu.sh" "$@"
