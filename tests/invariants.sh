# cotrain tests: invariants checked at the end of every end-to-end run, from
# the work units and the stream, never from a round's own totals.  Source it
# after tests/tap.sh; the test sets COTRAIN_DB and PG_BINDIR (with-pgtmp).
#
#   credit_wrong FPS MB_SAMPLES   prints (empty when all is right) every
#       granted round credit that is not the accepted peer's reported
#       samples x FPS FLOPs / 4.32e11, the samples being the mb_done of its
#       reports in committed rounds x MB_SAMPLES (the microbatch size).
#   coverage_exact PROJECT DESC   one TAP check: the stream [0, frontier) is
#       tiled exactly, with no gap and no overlap, by the pool, the live work
#       units, the microbatches that committed rounds trained on (the reports
#       of their included peers, the ranges the replay trains on) and the
#       finished parts of work units of the version still open.  A microbatch
#       lost or trained twice by a failed round, a reopened round, an expired
#       work unit or a restart breaks the tiling.

_inv_sql() { "$PG_BINDIR/psql" "$COTRAIN_DB" -Atqc "$1"; }

# Prints "lo hi kind frontier" per piece of the tiling, ordered by lo: one
# statement, so one snapshot (the clients go on taking units meanwhile).
_inv_pieces() {
	_inv_sql "with p as (select id, frontier, current_version from project where name = '$1'),
	  iv as (
	    select b.lo, b.hi, 'pool' as kind from mb_pool b, p where b.project_id = p.id
	    union all
	    select w.lo, w.hi, 'live' from work_unit w, p where w.project_id = p.id and w.state = 'live'
	    union all
	    select w.lo, w.lo + rr.mb_done, 'trained-v' || rr.version
	      from round_report rr join work_unit w on w.id = rr.work_unit_id
	      join round r on r.project_id = rr.project_id and r.version = rr.version
	      join round_member m on m.project_id = rr.project_id and m.version = rr.version
	                         and m.host_id = rr.host_id, p
	     where rr.project_id = p.id and r.state = 'committed' and m.included and rr.mb_done > 0
	    union all
	    select w.lo, w.lo + w.mb_done, 'pending-v' || w.version from work_unit w, p
	     where w.project_id = p.id and w.state <> 'live' and w.mb_done > 0
	       and w.version >= p.current_version)
	  select lo, hi, kind, (select frontier from p) from iv order by lo, hi" | tr '|' ' '
}

coverage_exact() {
	_proj=$1; shift
	# One snapshot, one pass: "TRAINED<tab>FRONTIER<tab>PROBLEMS".
	_res=$(_inv_pieces "$_proj" | awk '
	  { if ($1 != at) bad = bad sprintf("%s at %d: [%d, %d) %s; ", ($1 > at ? "gap" : "overlap"), at, $1, $2, $3)
	    if ($2 > at) at = $2; trained += ($3 ~ /^trained/) ? $2 - $1 : 0; pieces++; f = $4 }
	  END { if (at != f) bad = bad sprintf("the tiling ends at %d, the frontier is %d; ", at, f)
	        if (trained == 0) bad = bad "no microbatch was trained; "
	        if (pieces == 0) bad = bad "nothing to tile; "
	        printf "%d\t%s\t%s", trained, f, bad }')
	_trained=${_res%%	*}
	_res=${_res#*	}
	_front=${_res%%	*}
	_bad=${_res#*	}
	ok $([ -z "$_bad" ]; echo $?) "$* ($_trained microbatches trained, frontier ${_front:-none})${_bad:+: $_bad}" ||
		_inv_explain "$_proj" "$_bad"
}

# On a failure: every work unit over the first gap or overlap, with its
# round's state and its host's membership, as diagnostics.
_inv_explain() {
	_at=$(echo "$2" | sed -n 's/^[a-z]* at \([0-9]*\): \[\([0-9]*\),.*/\1 \2/p' | head -1)
	[ -n "$_at" ] || return 0
	_inv_sql "select 'unit ' || w.id || ' host ' || w.host_id || ' v' || w.version || ' [' || w.lo || ', ' || w.hi
	    || ') done ' || w.mb_done || ' ' || w.state || coalesce(' report ' || rr.mb_done, ' no report')
	    || coalesce(' round ' || r.state || ' attempt ' || r.attempt, '')
	    || coalesce(' included ' || m.included::text, ' not in the plan')
	  from work_unit w join project p on p.id = w.project_id
	  left join round_report rr on rr.work_unit_id = w.id
	  left join round r on r.project_id = w.project_id and r.version = w.version
	  left join round_member m on m.project_id = w.project_id and m.version = w.version and m.host_id = w.host_id
	  where p.name = '$1' and w.lo < ${_at#* } + 1 and w.hi > ${_at% *}
	  order by w.id" | while IFS= read -r _l; do diag "  $_l"; done
}

credit_wrong() {
	_inv_sql "with g as (select version, host_id, samples, credit from credit_grant
	    where kind = 'round' and status = 'granted'),
	  rep as (select rr.version, rr.host_id, sum(rr.mb_done) * $2 as samples
	    from round_report rr join round_member m on m.project_id = rr.project_id and m.version = rr.version
	      and m.host_id = rr.host_id and m.accepted
	    join round r on r.project_id = rr.project_id and r.version = rr.version and r.state = 'committed'
	    group by rr.version, rr.host_id)
	  select string_agg(format('v%s host %s: %s samples, %s credit', g.version, g.host_id, g.samples, g.credit), '; ')
	  from g left join rep using (version, host_id)
	  where g.samples is distinct from rep.samples
	     or abs(g.credit - $1 * rep.samples / 4.32e11) > 1e-9 * g.credit"
}
