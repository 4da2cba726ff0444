#!/bin/sh
# cotrain tests: shared/ is in layers (each folder's README): a layer's
# sources include only its own headers and those of the layers below it,
# and the volunteer's programs (cotrain-client, cotrainctl) do not need
# libpq.
. "$top_srcdir/tests/tap.sh"

# layer: the layers it may include, itself first.
while read -r layer allowed; do
	bad=$(grep -HnoE '#include "shared/[a-z]+/' "$top_srcdir/shared/$layer/"*.[ch] |
		grep -vE "\"shared/($allowed)/" | sed "s|^$top_srcdir/||")
	is "$bad" "" "shared/$layer includes only shared/{$(echo "$allowed" | sed 's/|/,/g')}"
done <<'LAYERS'
common common
database database|common
peer peer|common
nat nat|peer|common
averaging averaging|nat|peer|common
LAYERS

flat=$(grep -rlE '#include "shared/[a-z_]+\.h"' "$top_srcdir/server" "$top_srcdir/client" \
	"$top_srcdir/kernels" "$top_srcdir/tests" "$top_srcdir/shared" --include='*.[ch]' | sed "s|^$top_srcdir/||")
is "$flat" "" "no source includes a flat shared/NAME.h"

command -v readelf >/dev/null 2>&1 || { diag "readelf not found: the libpq checks are left out"; done_testing; }
for b in client/cotrain-client client/cotrainctl; do
	f="$top_builddir/$b"
	if [ ! -x "$f" ]; then
		ok 1 "$b is built"
		continue
	fi
	readelf -d "$f" | grep -q 'NEEDED.*libpq'
	ok $((! $?)) "$b does not need libpq"
	nm "$f" 2>/dev/null | grep -qE ' U PQ[a-zA-Z]+'
	ok $((! $?)) "$b calls nothing from libpq"
done
done_testing
