#!/bin/sh
# cotrain tests: the command line of every program (shared/common/options.h):
# --version exits 0 with "PROGRAM (cotrain) VERSION"; --help exits 0 and
# lists every option; a value out of range and a malformed one are refused
# with a message naming the option and exit 2; an unknown option exits 2.
# Nothing here starts a server or touches a database.
. "$top_srcdir/tests/tap.sh"

B="$top_builddir"
T=$(mktemp -d /tmp/cot-options-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
: >"$T/empty.conf"
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$B/config.h")
[ -n "$version" ] || bail_out "no PACKAGE_VERSION in $B/config.h"

# run PROGRAM ARG...: keep stdout, stderr and the exit status
run() { "$@" >"$T/out" 2>"$T/err" </dev/null; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }

# version_and_help NAME PATH OPTION...: --version, --help listing OPTIONs, --frobnicate
version_and_help() {
	name=$1; prog=$2; shift 2
	run "$prog" --version
	is "$(rc)" 0 "$name --version exits 0"
	is "$(cat "$T/out")" "$name (cotrain) $version" "  and prints \"$name (cotrain) $version\""
	run "$prog" --help
	is "$(rc)" 0 "$name --help exits 0"
	missing=
	for o in "$@" --help --version; do
		grep -q -e "^ *\(-[A-Za-z], \)\?$o\b" "$T/out" || missing="$missing $o"
	done
	is "$missing" "" "  and lists every option"
	run "$prog" --frobnicate
	is "$(rc)" 2 "$name --frobnicate exits 2"
	err_has "unknown option \"--frobnicate\""; ok $? "  $(head -1 "$T/err")"
}

# refused WANT-MESSAGE PROGRAM ARG...: exit 2 with WANT-MESSAGE on stderr
refused() {
	want=$1; shift
	run "$@"
	is "$(rc)" 2 "$(basename "$1") ${2:+$2 }${3:-}${4:+ ...} exits 2"
	err_has "$want"; ok $? "  $(head -1 "$T/err")"
}

S="$B/server/cotrain-server"
version_and_help cotrain-server "$S" --data-dir --db --listen --port --threads --reap-interval \
	--kdf-iterations --wu-max --pool-chunk --body-limit --cert-lifetime --round-interval \
	--round-report-timeout --round-average-timeout --round-max-group --round-close-fraction \
	--round-straggler-budget --relay-port --relay-listen --relay-bandwidth --relay-idle \
	--stats-dir --stats-interval --timeout --log-level
refused 'invalid value for --port: "70000" (must be between 0 and 65535)' "$S" --port 70000
refused 'invalid value for --port: "80x" (must be an integer between 0 and 65535)' "$S" --port 80x
refused 'invalid value for --round-close-fraction: "0" (must be more than 0 and at most 1)' \
	"$S" --round-close-fraction 0
refused 'invalid value for --round-close-fraction: "half"' "$S" --round-close-fraction half
refused 'invalid value for --body-limit: "512" (must be between 1024 and 67108864)' "$S" --body-limit 512
refused 'invalid value for --log-level: "loud" (must be debug, info, warn or error)' "$S" --log-level loud
refused 'option "--port" needs a value' "$S" --port
refused 'unexpected argument "extra"' "$S" extra

C="$B/client/cotrain-client"
version_and_help cotrain-client "$C" --config --state-dir --socket --log-level --set
run "$C" -V
is "$(cat "$T/out")" "cotrain-client (cotrain) $version" "cotrain-client -V is --version"
refused 'invalid value "9999" for "benchmark_seconds"' "$C" -c "$T/empty.conf" --set benchmark_seconds=9999
refused 'invalid value "loud" for "log_level"' "$C" -c "$T/empty.conf" -l loud
refused '--set needs KEY=VALUE, not "nothing"' "$C" -c "$T/empty.conf" --set nothing

K="$B/client/cotrainctl"
version_and_help cotrainctl "$K" --socket --json
refused 'usage: cotrainctl \[--json\] log' "$K" --socket "$T/none.sock" log -n 0
refused 'usage: cotrainctl \[--json\] log' "$K" --socket "$T/none.sock" log -n ten
refused 'unknown command "frobnicate"' "$K" frobnicate
run "$K" --socket "$T/none.sock" status
is "$(rc)" 3 "cotrainctl --socket NOWHERE status exits 3 (the option was taken)"

A="$B/server/cotrain-admin"
version_and_help cotrain-admin "$A" --data-dir --db
refused '--shard-tokens must be an integer from 64' "$A" --data-dir "$T/data" dataset import --shard-tokens 7 x y
refused '--shard-tokens must be an integer from 64' "$A" --data-dir "$T/data" dataset import --shard-tokens many x y
refused 'unknown command "frobnicate"' "$A" frobnicate

G="$B/cotrain-generate"
version_and_help cotrain-generate "$G" --checkpoint --prompt --tokens --top-k --temperature --seed --threads
refused 'invalid value for --tokens: "-1" (must be between 0 and' "$G" -c x --tokens -1
refused 'invalid value for --tokens: "many" (must be an integer between 0 and' "$G" -c x -n many
refused 'invalid value for --temperature: "2e6" (must be between 0 and 1e+06)' "$G" -c x -t 2e6
refused 'invalid value for --seed: "-1" (must be an unsigned 64-bit integer)' "$G" -c x --seed -1
refused 'no checkpoint given' "$G" --tokens 3

done_testing
