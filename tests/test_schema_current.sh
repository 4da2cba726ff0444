#!/bin/sh
# cotrain tests: db/schema.sql is what db/migrations/ and db/functions/ make
# of a fresh database today (db/dump-schema.sh); it fails while the
# checked-in file is stale.
. "$top_srcdir/tests/tap.sh"

want="$top_srcdir/db/schema.sql"
[ -f "$want" ] || bail_out "$want is missing"
PG_DUMP="$PG_BINDIR/pg_dump"
[ -x "$PG_DUMP" ] || PG_DUMP=pg_dump
command -v "$PG_DUMP" >/dev/null 2>&1 || skip_all "pg_dump not found"
# pg_dump's output differs between major versions; the file names the one
# that wrote it.
have_major=$("$PG_DUMP" --version | sed -n 's/^pg_dump (PostgreSQL) \([0-9]*\).*/\1/p')
want_major=$(sed -n 's/^-- pg_dump \([0-9]*\)$/\1/p' "$want")
[ "$have_major" = "$want_major" ] ||
	skip_all "db/schema.sql was written by pg_dump $want_major, this is pg_dump $have_major"

T=$(mktemp -d /tmp/cot-schema-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
plan 3
top_builddir="$top_builddir" PG_BINDIR="$PG_BINDIR" \
	"$SHELL" "$top_srcdir/db/dump-schema.sh" >"$T/schema.sql" 2>"$T/err"
ok $? "db/dump-schema.sh dumps a freshly migrated database" || diag "$(cat "$T/err")"
grep -q 'CREATE FUNCTION public.host_auth' "$T/schema.sql"
ok $? "  the dump holds the functions"
diff -u "$want" "$T/schema.sql" >"$T/diff"
ok $? "db/schema.sql is up to date" ||
	diag "$(head -60 "$T/diff")
db/schema.sql is stale: run \"make update-schema\" in the build directory and commit it."
done_testing
