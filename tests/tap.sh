# cotrain tests: TAP helpers for shell tests.  Source it: . "$top_srcdir/tests/tap.sh"
#   plan N | skip_all REASON | bail_out REASON | ok COND-EXIT-STATUS DESC... | is GOT WANT DESC |
#   skip N REASON | log_clean FILE | done_testing
_tap_n=0
_tap_failed=0
_tap_planned=
plan() { _tap_planned=$1; echo "1..$1"; }
skip_all() { echo "1..0 # SKIP $*"; exit 0; }
# bail_out REASON: stop the whole test (the harness counts it an error)
bail_out() { echo "Bail out! $*"; exit 1; }
diag() { echo "$*" | sed 's/^/# /'; }
# ok STATUS DESC: STATUS is an exit status (0 = pass), e.g. ok $? "it ran"
ok() {
	_st=$1; shift
	_tap_n=$((_tap_n + 1))
	if [ "$_st" -eq 0 ]; then echo "ok $_tap_n - $*"; else echo "not ok $_tap_n - $*"; _tap_failed=$((_tap_failed + 1)); fi
	return "$_st"
}
# _tap_flat: stdin as the start of one "not ok" line (CI's summary shows
# only those lines; '#' as '_': no TAP directive)
_tap_flat() { tr '\n#' ' _' | cut -c1-300; }
# ok_said STATUS FILE DESC: ok, with a failure's line carrying the start of
# FILE (what the command said)
ok_said() {
	_st=$1 _said=$2; shift 2
	if [ "$_st" -eq 0 ]; then ok 0 "$@"; else
		ok 1 "$* [said: $(_tap_flat <"$_said" 2>/dev/null)]"; fi
}
# skip N REASON: N checks that cannot run here, each reported as a SKIP
skip() { _k=$1; shift; while [ "$_k" -gt 0 ]; do _tap_n=$((_tap_n + 1)); echo "ok $_tap_n # SKIP $*"; _k=$((_k - 1)); done; }
is() {
	_got=$1; _want=$2; shift 2
	# A failure's line carries the start of what was got.
	if [ "$_got" = "$_want" ]; then ok 0 "$@"; else
		ok 1 "$* [got: $(printf '%s' "$_got" | _tap_flat)]"
		diag "  got: '$_got', expected: '$_want'"; return 1; fi
}
# log_clean FILE: FILE is UTF-8 text without control characters, one line
# per message (what a daemon logs of hostile input must be escaped)
log_clean() {
	python3 -c '
import sys
bad = [l for l in open(sys.argv[1], "rb").read().split(b"\n")
       if any(b < 0x20 or b == 0x7F for b in l) or l.decode("utf-8", "replace") != l.decode("utf-8", "ignore")]
sys.exit(1 if bad else 0)' "$1"
}
done_testing() {
	[ -z "$_tap_planned" ] && echo "1..$_tap_n"
	if [ -n "$_tap_planned" ] && [ "$_tap_planned" -ne "$_tap_n" ]; then diag "planned $_tap_planned, ran $_tap_n"; exit 1; fi
	[ "$_tap_failed" -eq 0 ]
	exit $?
}

# Processes a test started: once one has exited and the shell has reaped
# it (dash and bash reap any child as they wait for another), its number
# is free, and the suite starts enough processes for numbers to come
# round within minutes, so a late kill can reach another test's server.
# A test signals only what it still knows to be running: it drops a
# process it killed and waited for from its variables (pids_without), and
# signals one that may have exited on its own through kill_ours.
# ours PID: PID is a child of this shell not yet reaped (running, stopped,
# or exited and not yet waited for)
ours() { [ -n "$1" ] && [ "$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)" = "$$" ]; }
# kill_ours [-SIGNAL] PID...: send SIGNAL (TERM) to each PID that is ours
kill_ours() {
	_ks=-TERM
	case ${1:-} in -*) _ks=$1; shift ;; esac
	for _kp; do ours "$_kp" && kill "$_ks" "$_kp" 2>/dev/null; done
	return 0
}
# pids_without LIST PID...: LIST less each PID given
pids_without() {
	_pl=$1; shift
	_pw=
	for _pp in $_pl; do case " $* " in *" $_pp "*) ;; *) _pw="$_pw $_pp" ;; esac; done
	echo "$_pw"
}
