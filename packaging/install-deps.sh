#!/bin/sh
# Install every Debian package that cotrain's build, tests and demo need.
# Idempotent: packages already present are left alone, and apt is not
# touched at all when nothing is missing.  Run as root (or through sudo).
#
#   packaging/install-deps.sh          build + tests + demo (python3-torch:
#                                      tests/test_model_export.sh proves the
#                                      GPT-2 export against a torch forward)
#   packaging/install-deps.sh --torch  the same (kept for older scripts)
#
# help2man makes the man pages; debhelper, lintian and fakeroot build and
# check the Debian packages (packaging/build-debs.sh, tests/test_debs.sh).
set -eu

PKGS="
build-essential autoconf automake libtool pkg-config make
libpq-dev postgresql postgresql-client
libcurl4-openssl-dev libssl-dev libjansson-dev libarchive-dev zlib1g-dev
libmicrohttpd-dev libopenblas-dev
libminiupnpc-dev libnatpmp-dev
nftables conntrack libfaketime
miniupnpd miniupnpd-nftables
python3 ca-certificates curl procps iproute2 util-linux
zip tar gzip
python3-torch python3-numpy
g++ libsentencepiece-dev sentencepiece python3-sentencepiece
chromium libxml2-utils
clang-format
help2man debhelper lintian fakeroot
"

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "install-deps: all packages present"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO=sudo
	else
		echo "install-deps: missing packages:$missing" >&2
		echo "install-deps: run this script as root to install them" >&2
		exit 1
	fi
else
	SUDO=
fi

echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
