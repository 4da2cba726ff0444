# cotrain tests: the checks that end every rounds end-to-end run
# (tests/test_rounds_e2e.sh, tests/test_multi_server.sh): nine TAP checks.
# Source it after tests/tap.sh and tests/invariants.sh; call
# rounds_replay_checks once the clients have stopped.  It reads $T (the
# test's folder, the server's data folder in $T/srv), $B (top_builddir), $V
# (the last committed version) and the project "tiny", and calls the test's
# sql function.
#
#   - the plan cache's one query of all answers is each member's own;
#   - the model never forks: every included peer holds the server's
#     parameters after every committed round;
#   - the committed rounds' work units are known for every version, and each
#     round's gradient holds exactly their samples;
#   - the stream is tiled exactly (coverage_exact);
#   - a single process replaying the same global batches in the same order
#     (tests/replay_rounds) reaches the server's checkpoint of every version
#     (the first 25) and its loss curve.
rounds_replay_checks() {
	# What the plan cache answers from (round_plan_all: every member's plan
	# in one query) is round_plan_get's answer to each member, in every
	# round still holding its plan.
	plans=$(sql "select count(*) || ' ' || count(*) filter (where g.status <> 200 or g.body <> a.body)
	  from round r join project p on p.id = r.project_id
	  cross join lateral round_plan_all(p.name, r.version) a
	  join host h on h.id = a.host_id
	  cross join lateral round_plan_get(h.token_hash, p.name, r.version, a.host_id) g
	  where p.name = 'tiny'")
	members=$(sql "select count(*) from round r join project p on p.id = r.project_id
	  join round_member m using (project_id, version) where p.name = 'tiny' and r.state not in ('open', 'closing')")
	ok $([ "${plans% *}" = "$members" ] && [ "$members" -ge 2 ] && [ "${plans#* }" = 0 ]; echo $?) \
		"every member's plan from the one query of all is its own look's (members, answers, differing: $members $plans)"
	# The model never forks: in every committed round, every peer whose
	# parameters the server accepted holds exactly the server's.
	forks=$(sql "select count(*) from round r join round_member m using (project_id, version)
	  where r.state = 'committed' and m.included and m.outcome = 'ok' and m.params_sha256 <> r.params_sha256")
	shared=$(sql "select count(*) from (select r.version from round r join round_member m using (project_id, version)
	  where r.state = 'committed' and m.included and m.params_sha256 = r.params_sha256
	  group by r.version having count(*) >= 2) x")
	if ! ok $([ "$forks" = 0 ] && [ "$shared" -ge 2 ]; echo $?) \
		"every included peer holds the server's parameters after every round ($shared rounds of several peers, $forks forks)"; then
		# Who took part in each committed round, and any flag that kept a
		# host out.
		sql "select 'round ' || r.version || ' attempt ' || r.attempt || ': ' || string_agg('host ' || m.host_id
		    || coalesce(' ' || m.outcome, '') || case when m.included then '' else ' (not included)' end
		    || case when m.params_sha256 = r.params_sha256 then ' =' else '' end, ', ' order by m.host_id)
		  from round r join round_member m using (project_id, version) where r.state = 'committed'
		  group by r.version, r.attempt order by r.version" | while read -r l; do diag "$l"; done
		sql "select 'flag: host ' || host_id || ' round ' || version || ': ' || reason from round_sketch_flag
		  order by id" | while read -r l; do diag "$l"; done
	fi

	# The global batches of the committed rounds, as the replay takes them.
	sql "select rr.version, w.lo, w.lo + rr.mb_done
	  from round_report rr join work_unit w on w.id = rr.work_unit_id
	  join round r on r.project_id = rr.project_id and r.version = rr.version
	  join round_member m on m.project_id = rr.project_id and m.version = rr.version and m.host_id = rr.host_id
	  join project p on p.id = rr.project_id
	  where p.name = 'tiny' and r.state = 'committed' and m.included and rr.mb_done > 0
	  order by rr.version, w.lo" | tr '|' ' ' >"$T/rounds.txt"
	nrounds=$(cut -d' ' -f1 "$T/rounds.txt" | sort -un | wc -l)
	ok $([ "$V" -ge 3 ] && [ "$nrounds" = "$V" ]; echo $?) \
		"the committed rounds' work units are known for every version ($nrounds of $V, at least 3)"
	samples_ok=$(sql "select bool_and(r.samples_counted = r.target) from (
	  select r.version, coalesce(r.gradient_samples, 0) as samples_counted,
	         (select sum(rr.mb_done) * 2 from round_report rr join round_member m
	            on m.project_id = rr.project_id and m.version = rr.version and m.host_id = rr.host_id
	          where rr.project_id = r.project_id and rr.version = r.version and m.included) as target
	  from round r join project p on p.id = r.project_id where p.name = 'tiny' and r.state = 'committed') r")
	is "$samples_ok" t "each round's gradient holds exactly the samples of its included work units"

	MANIFEST=$(sql "select d.manifest_sha256 from dataset d where d.name = 'tiny'")
	CK0=$(sql "select checkpoint_sha256 from model_version m join project p on p.id = m.project_id where p.name = 'tiny' and version = 0")
	ck() { _s=$(sql "select checkpoint_sha256 from model_version m join project p on p.id = m.project_id
	  where p.name = 'tiny' and version = $1"); echo "$T/srv/files/$(echo "$_s" | cut -c1-2)/$_s"; }
	# fp32 sums in another order drift apart slowly, the more so the longer the
	# run, and AdamW's first steps (m / sqrt(v) near +-1 for every element)
	# amplify the relative error of gradients near zero: measured up to 1.1e-5
	# (parameters, groups without clipping) and 1.0e-4 (moments, 20 rounds), so
	# the replay is held to 5e-5 (moments 10x that) over the first 25 rounds.
	# A parameter off by 1e-3, or a mean gradient off by a factor (its moments
	# off by that factor), fails by orders of magnitude.
	VC=$((V < 25 ? V : 25))
	TOL=${REPLAY_TOLERANCE:-5e-5} # the test may hold a short run tighter
	awk -v n="$VC" '$1 < n' "$T/rounds.txt" >"$T/rounds-cmp.txt"
	mkdir -p "$T/replay"
	# The project as stored: a subword encoder's special ids are set at create.
	sql "select config from project where name = 'tiny'" >"$T/project-db.json"
	"$B/tests/replay_rounds" --project "$T/project-db.json" --rounds "$T/rounds-cmp.txt" --store "$T/srv/files" \
		--manifest "$MANIFEST" --checkpoint "$(ck 0)" --out "$T/replay" >"$T/replay.out" 2>"$T/replay.err"
	ok $? "the single-process replay of the same global batches runs" || cat "$T/replay.err" >&2
	coverage_exact tiny "at the end of the run, the stream is tiled exactly by the pool, live units and trained ranges"

	worst=ok
	[ "$VC" -ge 3 ] || worst="only $VC versions to compare"
	v=1
	while [ "$worst" = ok ] && [ $v -le "$VC" ]; do
		if ! "$B/tests/replay_rounds" --compare "$T/replay/v$v.safetensors" "$(ck $v)" --tolerance "$TOL" \
			>"$T/cmp$v.out" 2>&1; then
			worst="version $v: $(cat "$T/cmp$v.out")"
			break
		fi
		v=$((v + 1))
	done
	is "$worst" ok "the server's checkpoint of every version (1 to $VC) equals the replay's per element, within $TOL for the parameters and 10 times that for the optimizer moments (relative to the larger of the element and its buffer's RMS)"

	# The same loss curve: the server's round loss (sample-weighted mean of the
	# reported unit losses) against the replay's.
	sql "select version, loss from round r join project p on p.id = r.project_id
	  where p.name = 'tiny' and r.state = 'committed' order by version" | tr '|' ' ' >"$T/loss.server"
	awk '$1 == "round" { print $2, $6 }' "$T/replay.out" >"$T/loss.replay"
	cmp_loss=$(awk 'NR == FNR { s[$1] = $2; next }
	  { m++; if (!($1 in s) || s[$1] == "") { print "no server loss for round " $1; exit }
	    d = s[$1] - $2; if (d < 0) d = -d; if (d > 1e-4 * ($2 > 1 ? $2 : 1)) { print "round " $1 ": server " s[$1] ", replay " $2; exit } }
	  END { if (m < n) print "the replay has " m + 0 " rounds of " n }' n="$VC" "$T/loss.server" "$T/loss.replay")
	is "${cmp_loss:-same}" same "the loss curve matches the replay's ($(tr '\n' ' ' <"$T/loss.server"))"
	first=$(head -1 "$T/loss.replay" | cut -d' ' -f2)
	last=$(tail -1 "$T/loss.replay" | cut -d' ' -f2)
	ok $(awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; echo $?) "the loss falls ($first -> $last)"
}
