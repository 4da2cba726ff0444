#!/bin/sh
# Build the Debian packages cotrain-client and cotrain-server, then lint them.
#
#   packaging/build-debs.sh [OUTDIR]        (default: _build/debs)
#
# The working tree (what git tracks, and new files it does not ignore; the
# whole tree without _build* when it is not a git checkout) is exported to
# OUTDIR/src/cotrain-VERSION, packaging/debian/ becomes its debian/, and
# dpkg-buildpackage -us -uc -b builds it there, so the checkout itself stays
# clean.  The .deb, .changes and .buildinfo files land in OUTDIR, lintian's
# report in OUTDIR/lintian.txt.  When the exported sources are the same as
# for the packages already in OUTDIR (OUTDIR/sources.sha256), nothing is
# rebuilt.  Missing tools and build dependencies are installed with apt when
# run as root.  JOBS (default 2) sets the build's parallelism.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/_build/debs}
jobs=${JOBS:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)

say() { echo "build-debs: $*"; }
die() { echo "build-debs: $*" >&2; exit 1; }

apt_install() {
	[ "$(id -u)" -eq 0 ] || die "missing: $*; install them (or run this as root)"
	say "installing: $*"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The packaging tools.
need=""
command -v dpkg-buildpackage >/dev/null 2>&1 || need="$need dpkg-dev"
command -v dh >/dev/null 2>&1 || need="$need debhelper"
command -v fakeroot >/dev/null 2>&1 || need="$need fakeroot"
command -v lintian >/dev/null 2>&1 || need="$need lintian"
command -v git >/dev/null 2>&1 || need="$need git"
# shellcheck disable=SC2086
[ -z "$need" ] || apt_install $need

version=$(sed -n 's/^AC_INIT(\[cotrain\], \[\([^]]*\)\].*/\1/p' "$top/configure.ac")
[ -n "$version" ] || die "no version in configure.ac's AC_INIT"
debversion=$(dpkg-parsechangelog -l "$top/packaging/debian/changelog" -S Version)
[ "$debversion" = "$version" ] ||
	die "packaging/debian/changelog is at $debversion, configure.ac at $version; add a changelog entry (dch -v $version)"

# The files to build from, and their fingerprint.
list=$(mktemp)
trap 'rm -f "$list"' EXIT INT TERM
cd "$top"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files --cached --others --exclude-standard | sort -u | while IFS= read -r f; do
		[ -f "$f" ] && printf '%s\n' "$f"
	done >"$list"
else
	find . -path './_build*' -prune -o -path ./debian -prune -o -type f -print |
		sed 's|^\./||' | sort >"$list"
fi
sum=$( (tr '\n' '\0' <"$list" | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
if [ -f "$out/sources.sha256" ] && [ "$(cat "$out/sources.sha256")" = "$sum" ] &&
	ls "$out"/cotrain-client_"$version"_*.deb "$out"/cotrain-server_"$version"_*.deb >/dev/null 2>&1; then
	say "packages in $out are up to date"
	exit 0
fi
rm -f "$out/sources.sha256" "$out"/cotrain-*_"$version"_*.deb "$out"/cotrain*_"$version"_*.changes \
	"$out"/cotrain*_"$version"_*.buildinfo "$out"/cotrain-*-dbgsym_"$version"_*.deb

# Export the tree, packaging/debian as its debian/.
src=$out/src/cotrain-$version
rm -rf "$out/src"
mkdir -p "$src"
tr '\n' '\0' <"$list" | tar --null -T - -cf - | tar -xf - -C "$src"
cp -R "$top/packaging/debian" "$src/debian"

# Build dependencies.
cd "$src"
if ! dpkg-checkbuilddeps >/dev/null 2>&1; then
	unmet=$(dpkg-checkbuilddeps 2>&1 | sed -n 's/.*Unmet build dependencies: //p' |
		sed 's/([^)]*)//g; s/|[^ ]*//g')
	[ -n "$unmet" ] || { dpkg-checkbuilddeps; exit 1; }
	# shellcheck disable=SC2086
	apt_install $unmet
fi

say "building cotrain $version in $src (-j$jobs)"
log=$out/build.log
# A clean environment for the build: run from make check (tests/test_debs.sh)
# the caller's MAKEFLAGS would carry its TESTS= into debian/rules' make check.
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u top_srcdir -u top_builddir \
	DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage -us -uc -b >"$log" 2>&1; then
	tail -40 "$log" >&2
	die "dpkg-buildpackage failed; the whole log is $log"
fi
for f in "$out"/src/*_"$version"_*.deb "$out"/src/*_"$version"_*.changes "$out"/src/*_"$version"_*.buildinfo; do
	mv "$f" "$out/"
done

changes=$(ls "$out"/cotrain_"$version"_*.changes)
# Errors fail the build; warnings are reported (README, "Installing the
# Debian packages", says which remain and why).
rc=0
lintian --fail-on error --tag-display-limit 0 "$changes" >"$out/lintian.txt" 2>&1 || rc=$?
sed 's/^/lintian: /' "$out/lintian.txt"
[ "$rc" -eq 0 ] || die "lintian found errors (see $out/lintian.txt)"
echo "$sum" >"$out/sources.sha256"
for f in "$out"/*.deb; do
	say "$(basename "$f"): $(du -k "$f" | cut -f1) KiB"
done
say "packages in $out"
