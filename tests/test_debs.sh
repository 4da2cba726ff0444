#!/bin/sh
# cotrain tests: the Debian packages.  packaging/build-debs.sh builds
# cotrain-client and cotrain-server (once: it skips the build while the
# sources match the packages in $top_builddir/debs) with no lintian error;
# dpkg -i installs them; the files are where the units say, the installed
# programs answer --version and --help, the units pass systemd-analyze
# verify with an exposure of at most 2.0, the man pages and completions are
# there, the installed daemon starts as the user "cotrain" with the packaged
# configuration and answers cotrainctl; dpkg --purge removes it all.  The
# machine is left as it was: users and folders the installation made are
# removed on every exit path.  Needs root and the packaging tools
# (packaging/install-deps.sh installs them).
. "$top_srcdir/tests/tap.sh"

[ "$(id -u)" -eq 0 ] || skip_all "needs root (dpkg -i)"
for t in dpkg-buildpackage dh dh_autoreconf lintian help2man; do
	command -v "$t" >/dev/null 2>&1 || skip_all "no $t (packaging/install-deps.sh installs it)"
done
for p in cotrain-client cotrain-server; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'installed'; then
		skip_all "$p is installed on this machine; this test would remove it"
	fi
done
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$top_builddir/config.h")
[ -n "$version" ] || bail_out "no PACKAGE_VERSION in $top_builddir/config.h"

# What exists before, so that cleanup removes only what the test made.
had_user_client=0; getent passwd cotrain >/dev/null && had_user_client=1
had_group_client=0; getent group cotrain >/dev/null && had_group_client=1
had_user_server=0; getent passwd cotrain-server >/dev/null && had_user_server=1
had_group_server=0; getent group cotrain-server >/dev/null && had_group_server=1
had_server_data=0; [ -e /var/lib/cotrain ] && had_server_data=1
T=$(mktemp -d /tmp/cot-debs-XXXXXX)
daemon=
cleanup() {
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	dpkg --purge cotrain-client cotrain-server >/dev/null 2>&1
	[ "$had_server_data" = 1 ] || rm -rf /var/lib/cotrain
	[ "$had_user_client" = 1 ] || userdel cotrain 2>/dev/null
	[ "$had_group_client" = 1 ] || groupdel cotrain 2>/dev/null
	[ "$had_user_server" = 1 ] || userdel cotrain-server 2>/dev/null
	[ "$had_group_server" = 1 ] || groupdel cotrain-server 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# --- build --------------------------------------------------------------
out=$top_builddir/debs
timeout 900 "$top_srcdir/packaging/build-debs.sh" "$out" >"$T/build" 2>&1
ok $? "packaging/build-debs.sh builds the packages" ||
	{ tail -30 "$T/build" | sed 's/^/# /'; bail_out "no packages to install"; }
client_deb=$(ls "$out"/cotrain-client_"$version"_*.deb 2>/dev/null)
server_deb=$(ls "$out"/cotrain-server_"$version"_*.deb 2>/dev/null)
[ -f "$client_deb" ] && [ -f "$server_deb" ]
ok $? "  cotrain-client and cotrain-server $version are in $out"
! grep -q '^E: ' "$out/lintian.txt"
ok $? "  lintian reports no error"
grep '^[WE]: ' "$out/lintian.txt" | sed 's/^/# lintian: /'
diag "sizes: $(du -k "$client_deb" "$server_deb" | awk '{printf "%s %s KiB; ", $2, $1}' | sed "s|$out/||g")"

# --- install ------------------------------------------------------------
dpkg -i "$client_deb" "$server_deb" >"$T/install" 2>&1
ok $? "dpkg -i installs both" || { sed 's/^/# /' "$T/install"; bail_out "the packages do not install"; }

getent passwd cotrain >/dev/null && getent group cotrain >/dev/null
ok $? "  the user and group cotrain exist"
getent passwd cotrain-server >/dev/null
ok $? "  the user cotrain-server exists"

# unit_key UNIT KEY: the value of KEY= in the installed unit
unit_key() { sed -n "s/^$2=//p" "/lib/systemd/system/$1"; }
for unit in cotrain-client.service cotrain-server.service; do
	[ -f "/lib/systemd/system/$unit" ]
	ok $? "$unit is installed in /lib/systemd/system" || continue
	prog=$(unit_key "$unit" ExecStart | cut -d' ' -f1)
	[ -x "$prog" ] && [ "$(dpkg -S "$prog" 2>/dev/null | cut -d: -f1)" = "${unit%.service}" ]
	ok $? "  its ExecStart program $prog is installed by ${unit%.service}"
	user=$(unit_key "$unit" User)
	state=/var/lib/$(unit_key "$unit" StateDirectory)
	[ -d "$state" ] && [ "$(stat -c %U "$state")" = "$user" ]
	ok $? "  its StateDirectory $state exists, owned by $user"
done
conf=$(unit_key cotrain-client.service ExecStart | sed -n 's/.*--config \([^ ]*\).*/\1/p')
is "$conf" /etc/cotrain/client.conf "the client unit reads /etc/cotrain/client.conf"
dpkg-query -W -f='${Conffiles}\n' cotrain-client | grep -q " $conf "
ok $? "  which the package installs as a conffile"
/usr/bin/cotrain-client --help | tr -s ' \n' ' ' | grep -q "(default $conf;"
ok $? "  and which the daemon reads by default"

# --- the installed programs ---------------------------------------------
for p in cotrain-client cotrain-server cotrain-admin cotrain-generate; do
	is "$(/usr/bin/$p --version 2>&1)" "$p (cotrain) $version" "/usr/bin/$p --version"
done
/usr/bin/cotrainctl --help >"$T/ctl" 2>&1 && grep -q '^usage: cotrainctl' "$T/ctl"
ok $? "/usr/bin/cotrainctl --help"

missing=
for p in cotrain-client cotrainctl cotrain-server cotrain-admin cotrain-generate; do
	[ -f "/usr/share/man/man1/$p.1.gz" ] || missing="$missing $p"
done
is "$missing" "" "a man page for every program"
zcat /usr/share/man/man1/cotrain-server.1.gz | grep -q 'relay\\-bandwidth'
ok $? "  made from --help (cotrain-server.1 has --relay-bandwidth)"
[ -f /usr/share/bash-completion/completions/cotrainctl ] &&
	[ -f /usr/share/bash-completion/completions/cotrain-admin ]
ok $? "bash completion for cotrainctl and cotrain-admin"
[ -f /usr/share/doc/cotrain-client/client.md.gz ] && [ -f /usr/share/doc/cotrain-server/api.md.gz ]
ok $? "the documents in /usr/share/doc"

# --- the units ----------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
	for unit in cotrain-client.service cotrain-server.service; do
		systemd-analyze verify "/lib/systemd/system/$unit" >"$T/verify" 2>&1
		ok $? "systemd-analyze verify $unit" || sed 's/^/# /' "$T/verify"
		exposure=$(systemd-analyze security --offline=yes "/lib/systemd/system/$unit" 2>/dev/null |
			sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
		[ -n "$exposure" ] && awk "BEGIN { exit !($exposure <= 2.0) }"
		ok $? "  systemd-analyze security: exposure ${exposure:-unknown} (at most 2.0)"
	done
else
	echo "ok $((_tap_n + 1)) # SKIP no systemd-analyze"; _tap_n=$((_tap_n + 1))
fi

# --- the installed daemon, as its user, with the packaged configuration --
# (No systemd here to start the unit: the command line of its ExecStart, the
# socket in the state folder since /run/cotrain-client is the unit's.)
sock=/var/lib/cotrain-client/control.sock
runuser -u cotrain -g cotrain -- /usr/bin/cotrain-client --config /etc/cotrain/client.conf \
	--socket "$sock" --set benchmark_seconds=1 >"$T/daemon" 2>&1 &
daemon=$!
i=0
until [ -S "$sock" ] || [ $i -ge 100 ] || ! kill -0 "$daemon" 2>/dev/null; do
	sleep 0.2
	i=$((i + 1))
done
/usr/bin/cotrainctl --socket "$sock" status >"$T/status" 2>&1
ok $? "the installed daemon runs as cotrain and answers cotrainctl status" ||
	{ sed 's/^/# /' "$T/daemon" "$T/status"; }
is "$(stat -c '%U %G %a' "$sock" 2>/dev/null)" "cotrain cotrain 660" "  its socket is 0660, group cotrain"
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=

# --- removal ------------------------------------------------------------
dpkg --purge cotrain-client cotrain-server >"$T/purge" 2>&1
ok $? "dpkg --purge removes both" || sed 's/^/# /' "$T/purge"
left=
for f in /usr/bin/cotrain-client /usr/bin/cotrainctl /usr/bin/cotrain-server /usr/bin/cotrain-admin \
	/etc/cotrain /lib/systemd/system/cotrain-client.service /var/lib/cotrain-client \
	/etc/systemd/system/multi-user.target.wants/cotrain-client.service; do
	[ -e "$f" ] || [ -L "$f" ] && left="$left $f"
done
is "$left" "" "  and leaves none of their files"

done_testing
