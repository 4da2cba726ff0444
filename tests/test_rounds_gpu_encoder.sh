#!/bin/sh
# cotrain tests: a GPU volunteer training an ALBERT in rounds with CPU
# peers; see tests/test_rounds_gpu.sh (GPU_ROUNDS_MODEL=albert).
GPU_ROUNDS_MODEL=albert exec "${SHELL:-/bin/sh}" "$top_srcdir/tests/test_rounds_gpu.sh" "$@"
