#!/bin/sh
. "$top_srcdir/tests/tap.sh"
skip_all "not written yet"
