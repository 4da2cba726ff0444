# cotrain tests: shared helpers of the NAT tests and benchmark.  Source it
# after tap.sh; needs $top_builddir, $PG_BINDIR and $COTRAIN_DB (tests/with-pgtmp).
#
#   nat_token ID            the test token of host ID
#   nat_seed "ID:GROUP ..." project "nattest", an account (key nat_account_key),
#                           hosts with their tokens, round 0 averaging with those
#                           peers in those groups
#   nat_free_port           a TCP port P with P+1 also free (loopback check)
#   nat_server LOG ADDR PORT [ARGS...]
#                           start cotrain-server (HTTP on PORT, the NAT service
#                           on PORT+1 and PORT+2) with output in LOG; sets NAT_SPID
#   nat_server_stop         stop that server, if one runs, and wait for it
#   nat_drv CMD ARGS...     run the driver

NAT_B=${top_builddir:-.}
nat_account_key=nat-account-key-0123456789

nat_token() { echo "nat-token-$1-0123456789abcdef"; }

nat_sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }

nat_seed() {
	_sql="INSERT INTO file (sha256, size, kind) VALUES (encode(sha256('nat-manifest'), 'hex'), 1, 'manifest');
INSERT INTO dataset (name, n_tokens, manifest_sha256) VALUES ('nat-data', 1, encode(sha256('nat-manifest'), 'hex'));
INSERT INTO project (name, title, config, dataset_id, seq_len, microbatch_size, target_batch, mb_per_epoch, flops_per_sample)
  SELECT 'nattest', 'NAT test', '{}', id, 8, 1, 64, 1, 1 FROM dataset WHERE name = 'nat-data';
INSERT INTO account (id, email, name, password_hash, cross_project_id) VALUES (1, 'nat@example.org', 'nat', 'x', 'x');
INSERT INTO account_key (account_id, key_hash) VALUES (1, sha256('$nat_account_key'::bytea));
UPDATE round SET state = 'averaging', plan_deadline = now() + interval '1 hour'
  WHERE project_id = (SELECT id FROM project WHERE name = 'nattest');"
	for _hg in $1; do
		_h=${_hg%%:*} _g=${_hg#*:}
		_sql="$_sql
INSERT INTO host (id, account_id, token_hash, flops) VALUES ($_h, 1, sha256('$(nat_token "$_h")'::bytea), 1e9);"
		[ "$_g" = "-" ] || _sql="$_sql
INSERT INTO round_member (project_id, version, host_id, group_id, samples, endpoint, bandwidth, can_aggregate, lo, hi)
  SELECT id, 0, $_h, $_g, 1, '0.0.0.0:1', 1, true, 0, 0 FROM project WHERE name = 'nattest';"
	done
	nat_sql "$_sql" >/dev/null
}

nat_port_free() {
	! (ss -Htln "sport = :$1" 2>/dev/null | grep -q .)
}

nat_free_port() {
	# Below the ephemeral range (32768 and up), where other tests' outgoing
	# connections would take the port between the check and the bind.
	_p=$((20000 + ($$ * 7 + ${RANDOM:-0}) % 12000))
	_i=0
	while [ $_i -lt 50 ]; do
		if nat_port_free $_p && nat_port_free $((_p + 1)) && nat_port_free $((_p + 2)); then
			echo $_p
			return 0
		fi
		_p=$((_p + 3)); _i=$((_i + 1))
	done
	return 1
}

nat_server() {
	_log=$1 _addr=$2 _port=$3; shift 3
	# Empty the log here, not in the child's redirection: the child may open
	# it after the first look below, which would then see a previous run's line.
	: >"$_log"
	"$NAT_B/server/cotrain-server" --db "$COTRAIN_DB" --data-dir "${NAT_DATA:-/tmp}/srv" --listen "$_addr" \
		--port "$_port" --relay-port $((_port + 1)) --round-interval 3600 --kdf-iterations 1000 \
		"$@" >/dev/null 2>"$_log" &
	NAT_SPID=$!
	_n=200
	while [ $_n -gt 0 ]; do
		grep -q 'listening on' "$_log" 2>/dev/null && return 0
		kill -0 $NAT_SPID 2>/dev/null || return 1
		sleep 0.1; _n=$((_n - 1))
	done
	return 1
}

nat_server_stop() {
	[ -n "$NAT_SPID" ] && kill "$NAT_SPID" 2>/dev/null && wait "$NAT_SPID" 2>/dev/null
	NAT_SPID=
}

nat_drv() { "$NAT_B/tests/nat/nat_driver" "$@"; }
