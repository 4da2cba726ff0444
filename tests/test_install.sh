#!/bin/sh
# cotrain tests: make install into a scratch DESTDIR.  Every doc/*.md is
# installed; the units' ExecStart= names the installed programs; the
# client's configuration is installed where the unit and the daemon's
# default read it; the man pages (made by help2man from --help) and the bash
# completions are installed, and cotrain-admin(1) describes every command of
# cotrain-admin --help.  No root needed.
. "$top_srcdir/tests/tap.sh"

T=$(mktemp -d /tmp/cot-install-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
D=$T/root
make -s -C "$top_builddir" install DESTDIR="$D" >"$T/log" 2>&1
ok $? "make install DESTDIR=..." || { tail -20 "$T/log" | sed 's/^/# /'; done_testing; exit; }

# The configured directories, from the Makefile.
mkvar() { sed -n "s|^$1 = ||p" "$top_builddir/Makefile" | head -1; }
prefix=$(mkvar prefix)
bindir=$(mkvar bindir | sed "s|\${exec_prefix}|$(mkvar exec_prefix)|; s|\${prefix}|$prefix|")
sysconfdir=$(mkvar sysconfdir | sed "s|\${prefix}|$prefix|")

missing=
for f in "$top_srcdir"/doc/*.md; do
	[ -n "$(find "$D" -path "*/doc/cotrain/$(basename "$f")")" ] || missing="$missing $(basename "$f")"
done
is "$missing" "" "every doc/*.md is installed"

for u in cotrain-client cotrain-server; do
	unit=$(find "$D" -name "$u.service" | head -1)
	prog=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit" 2>/dev/null)
	is "$prog" "$bindir/$u" "$u.service runs the installed $bindir/$u"
	[ -x "$D$prog" ]
	ok $? "  which make install put there"
done
conf=$(sed -n 's/^ExecStart=.*--config \([^ ]*\).*/\1/p' "$(find "$D" -name cotrain-client.service)")
is "$conf" "$sysconfdir/cotrain/client.conf" "the client unit reads \$(sysconfdir)/cotrain/client.conf"
[ -f "$D$conf" ]
ok $? "  which make install put there"
"$D$bindir/cotrain-client" --help | tr -s ' \n' ' ' | grep -q "(default $conf;"
ok $? "  and which is the daemon's default"

for c in cotrainctl cotrain-admin; do
	[ -n "$(find "$D" -path "*/bash-completion/completions/$c")" ]
	ok $? "bash completion for $c is installed"
done

if grep -q '^HELP2MAN = .' "$top_builddir/Makefile"; then
	missing=
	for p in cotrain-server cotrain-admin cotrain-client cotrainctl cotrain-generate; do
		[ -n "$(find "$D" -path "*/man1/$p.1")" ] || missing="$missing $p"
	done
	is "$missing" "" "a man page for every program"
	# Every command of cotrain-admin --help ("  db migrate   ...", "  user list | user
	# disable EMAIL ...") has its entry in the hand-written COMMANDS IN DETAIL.
	page=$(find "$D" -path '*/man1/cotrain-admin.1')
	detail=$(sed -n '/^\.SH "COMMANDS IN DETAIL"/,/^\.SH/p' "$page" | sed 's/\\f[BIRP]//g; s/\\-/-/g')
	missing=
	for cmd in $("$D$bindir/cotrain-admin" --help | sed -n '/^Commands:/,/^$/p' |
		grep '^  [a-z]' | sed 's/^  //; s/  .*//; s/ | /\n/g' |
		awk '{ if ($1 == "status") print $1; else print $1 "-" $2 }'); do
		printf '%s\n' "$detail" | grep -q "$(echo "$cmd" | sed 's/-/ /')" || missing="$missing $cmd"
	done
	is "$missing" "" "cotrain-admin(1) describes every command of cotrain-admin --help"
else
	echo "ok $((_tap_n + 1)) # SKIP no help2man: no man pages"; _tap_n=$((_tap_n + 1))
fi

done_testing
