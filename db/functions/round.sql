-- cotrain functions: a training round's life (doc/api.md, "Rounds").  A
-- round trains version v of a project into v+1:
--
--   open       work units of v go out; heartbeats add up the samples
--   closing    the target was reached (or the stragglers are not worth
--              waiting for): no new work for v; every host holding gradients
--              for v reports the exact count of each of its work units
--              (round_report.sql) and the unprocessed rest goes back to the
--              pool
--   averaging  the plan exists (round_plan.sql); the groups average and
--              upload their sums, the server takes its own optimizer step to
--              v+1, peers report their outcome (round_averaging.sql)
--   committed  v+1 exists and every included peer reported ok:
--              project.current_version = v + 1, round v + 1 is open
--
-- A round that fails (a peer reports failure, no peer holds the server's
-- parameters, the averaging deadline passes, nobody reports) returns every
-- range of its work units to the pool and is open again, as its next
-- attempt, in the same transaction: no sample is lost and none is counted
-- twice; the reason is kept in last_failure.

-- Trigger project_round_ins: a new project's current version gets its
-- (open) round.
CREATE OR REPLACE FUNCTION round_project_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO round (project_id, version) VALUES (NEW.id, NEW.current_version)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- The window, in milliseconds, over which the hosts of round p_version of
-- p_project spread their reports once it closes: 0.8 ms for each report
-- still to come (a unit of the version live or done, not reported yet),
-- at most 2 s.  Each host waits a uniform random part of it before it
-- reports (cotrain-client, simhosts), so that the reports come at about
-- the rate one server process on 2 cores takes them (runs K: 0.8 s for
-- 1,000, most of it queued) instead of all at once (doc/scale.md, "Runs
-- L").  Fixed when the round closes (round.report_spread_ms).
CREATE OR REPLACE FUNCTION round_report_spread_ms(p_project bigint, p_version integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT least(2000, ceil(count(*) * 0.8))::integer FROM work_unit w
     WHERE w.project_id = p_project AND w.version = p_version AND w.state IN ('live', 'done')
       AND NOT EXISTS (SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id)
$$;

-- {"state", "version", "attempt"} of a round that is not open (what a client
-- must know to stop), with "report_spread_ms" while it is closing, or NULL
-- while it is open or does not exist.
CREATE OR REPLACE FUNCTION round_note(p_project bigint, p_version integer) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT state, attempt, report_spread_ms INTO r FROM round
     WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR r.state = 'open' THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('state', r.state, 'version', p_version, 'attempt', r.attempt)
        || CASE WHEN r.state = 'closing'
                THEN jsonb_build_object('report_spread_ms', coalesce(r.report_spread_ms, 0))
                ELSE '{}' END;
END
$$;

-- Lock the open round of (p_project, p_version) and return the project's
-- target read after the lock; NULL when the round is not open.  A project
-- update that changes the target holds that row until it commits, and the
-- statement after the lock sees what it committed (READ COMMITTED): a
-- round closed on this target never closes on one already changed.
CREATE OR REPLACE FUNCTION round_open_locked_target(p_project bigint, p_version integer) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM round WHERE project_id = p_project AND version = p_version AND state = 'open'
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT target_batch FROM project WHERE id = p_project);
END
$$;

-- After samples were added to version p_version: close its round when they
-- reach the target (read again under the round's lock:
-- round_open_locked_target).  Returns round_note().
CREATE OR REPLACE FUNCTION round_progress(p_project bigint, p_version integer, p_accumulated bigint,
                               p_target bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_accumulated >= p_target THEN
        IF p_accumulated >= round_open_locked_target(p_project, p_version) THEN
            UPDATE round SET state = 'closing', close_reason = 'target', closed_at = now(),
                             report_spread_ms = round_report_spread_ms(p_project, p_version)
             WHERE project_id = p_project AND version = p_version AND state = 'open';
        END IF;
    END IF;
    RETURN round_note(p_project, p_version);
END
$$;

-- Add "round" (when the round is not open) to a scheduler answer.
CREATE OR REPLACE FUNCTION round_annotate(p_wu bigint, p_status integer, p_body text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    b jsonb;
    w record;
    n jsonb;
BEGIN
    IF p_status <> 200 THEN
        RETURN QUERY SELECT p_status, p_body;
        RETURN;
    END IF;
    b := p_body::jsonb;
    SELECT project_id, version INTO w FROM work_unit WHERE id = p_wu;
    n := round_progress(w.project_id, w.version, (b->>'accumulated_samples')::bigint,
                        (b->>'target_batch')::bigint);
    IF n IS NOT NULL THEN
        b := b || jsonb_build_object('round', n);
    END IF;
    RETURN QUERY SELECT 200, b::text;
END
$$;

-- Authenticate a host token for host p_host and find project p_project and
-- its round p_version, its row locked FOR UPDATE unless p_lock is false (a
-- read-only caller: a plan poll, of which a thousand come at once when a
-- plan is stored, need not queue behind each other and the writers).
-- status NULL when all is well; else the answer.
DROP FUNCTION IF EXISTS round_lookup(bytea, text, integer, bigint);
CREATE OR REPLACE FUNCTION round_lookup(p_token_hash bytea, p_project text, p_version integer, p_host bigint,
                             p_lock boolean DEFAULT true,
                             OUT status integer, OUT body text, OUT project_id bigint,
                             OUT state text, OUT attempt integer, OUT config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint;
    r      record;
BEGIN
    v_host := host_auth(p_token_hash);
    IF v_host IS NULL THEN
        status := 401;
        body := api_error('unauthorized', 'host token is not valid',
                          'Register the host again to get a new token.');
        RETURN;
    END IF;
    IF v_host <> p_host THEN
        status := 403;
        body := api_error('forbidden',
            format('this token belongs to host %s, not to host %s', v_host, p_host));
        RETURN;
    END IF;
    SELECT p.id, p.config INTO r FROM project p WHERE p.name = p_project;
    IF NOT FOUND THEN
        status := 404;
        body := api_error('not_found', format('project "%s" does not exist', p_project));
        RETURN;
    END IF;
    project_id := r.id;
    config := r.config;
    IF p_lock THEN
        SELECT ro.state, ro.attempt INTO state, attempt FROM round ro
         WHERE ro.project_id = r.id AND ro.version = p_version FOR UPDATE;
    ELSE
        SELECT ro.state, ro.attempt INTO state, attempt FROM round ro
         WHERE ro.project_id = r.id AND ro.version = p_version;
    END IF;
    IF NOT FOUND THEN
        status := 404;
        body := api_error('not_found',
            format('project "%s" has no round for version %s', p_project, p_version));
    END IF;
END
$$;

-- The coordinator's pass over open rounds (the current version of active
-- projects): close those whose samples reached the target, and those that
-- reached p_fraction of it when the hosts computing now, at their summed
-- speed (project_speed: a live unit's last heartbeat, or its host's last
-- measure before the first one), would need more than p_budget_s seconds
-- to fill the rest, or when nobody computed for wu_seconds.  Returns how
-- many closed.
CREATE OR REPLACE FUNCTION round_close_due(p_fraction double precision, p_budget_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    v_acc  bigint;
    v_sps  double precision;
    v_why  text;
    n      integer := 0;
BEGIN
    FOR r IN SELECT ro.project_id, ro.version, p.target_batch, p.microbatch_size, p.wu_seconds
               FROM round ro JOIN project p ON p.id = ro.project_id AND p.current_version = ro.version
              WHERE ro.state = 'open' AND p.active LOOP
        v_acc := sched_accumulated(r.project_id, r.version, r.microbatch_size);
        v_why := NULL;
        IF v_acc >= r.target_batch THEN
            v_why := 'target';
        ELSIF v_acc > 0 AND v_acc >= p_fraction * r.target_batch THEN
            SELECT ps.samples_per_sec INTO v_sps FROM project_speed(r.project_id) ps;
            IF v_sps > 0 AND (r.target_batch - v_acc) / v_sps > p_budget_s THEN
                v_why := 'stragglers';
            ELSIF v_sps <= 0 AND NOT EXISTS (
                    SELECT 1 FROM work_unit w
                     WHERE w.project_id = r.project_id AND w.version = r.version
                       AND coalesce(w.finished_at, w.last_heartbeat) > now() - make_interval(secs => r.wu_seconds)) THEN
                -- Nobody computes, and nobody did for wu_seconds: not a host
                -- between two units (it asks again within milliseconds).
                v_why := 'stragglers';
            END IF;
        END IF;
        IF v_why IS NOT NULL THEN
            -- Decided on the target read above: a target changed meanwhile
            -- (round_open_locked_target) is left to the next pass.
            IF round_open_locked_target(r.project_id, r.version) = r.target_batch THEN
                UPDATE round SET state = 'closing', close_reason = v_why, closed_at = now(),
                                 report_spread_ms = round_report_spread_ms(r.project_id, r.version)
                 WHERE project_id = r.project_id AND version = r.version AND state = 'open';
                n := n + 1;
            END IF;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- Give back the work units p_units (their rows locked by the caller): each
-- becomes 'expired' with mb_done 0, so the version's progress forgets its
-- samples, and its range returns to the pool: all of it for a live unit,
-- its finished part otherwise (the rest is in the pool already).  Returns
-- how many.  The one place a round takes work back (round_drop_units,
-- round_drop_excluded).
CREATE OR REPLACE FUNCTION round_give_back(p_units bigint[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH dropped AS (
        UPDATE work_unit w SET state = 'expired', mb_done = 0,
                               finished_at = coalesce(w.finished_at, now())
          FROM work_unit old
         WHERE w.id = ANY (p_units) AND old.id = w.id
        RETURNING w.project_id, old.lo,
                  CASE WHEN old.state = 'live' THEN old.hi ELSE old.lo + old.mb_done END AS hi
    ), pooled AS (
        INSERT INTO mb_pool (project_id, lo, hi)
        SELECT project_id, lo, hi FROM dropped WHERE lo < hi
    )
    SELECT count(*) INTO n FROM dropped;
    RETURN n;
END
$$;

-- Give up every work unit of version p_version that is not counted (see
-- round_give_back).  A unit counts only when p_keep_reported and it was
-- reported: a client reports every unit its gradient sums, one by one, so
-- a unit it finished but did not report (its gradient was lost, say the
-- daemon restarted after finishing it) is in no gradient, and its range
-- must go back to the pool even though its host reported others.  Returns
-- how many were dropped.
CREATE OR REPLACE FUNCTION round_drop_units(p_project bigint, p_version integer, p_keep_reported boolean)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RETURN round_give_back(ARRAY(
        SELECT w.id FROM work_unit w
         WHERE w.project_id = p_project AND w.version = p_version
           AND (w.mb_done > 0 OR w.state = 'live')
           AND NOT (p_keep_reported
                    AND EXISTS (SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id))
           FOR UPDATE));
END
$$;

-- Drop the work units of version p_version whose host is in the plan but
-- in no group's included set (see round_give_back).  Returns how many.
CREATE OR REPLACE FUNCTION round_drop_excluded(p_project bigint, p_version integer)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RETURN round_give_back(ARRAY(
        SELECT w.id FROM work_unit w
         WHERE w.project_id = p_project AND w.version = p_version
           AND (w.mb_done > 0 OR w.state = 'live')
           AND w.host_id IN (SELECT m.host_id FROM round_member m
                              WHERE m.project_id = p_project AND m.version = p_version
                                AND m.included IS NOT TRUE)
           FOR UPDATE));
END
$$;

-- A round fails: every range of its work units goes back to the pool; its
-- reports, plan, group sums and the server's step (gradient, checkpoint
-- v+1, the mean's samples, the loss) are forgotten; it opens again as the
-- next attempt with p_reason as its last_failure.
CREATE OR REPLACE FUNCTION round_fail(p_project bigint, p_version integer, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM round WHERE project_id = p_project AND version = p_version FOR UPDATE;
    DELETE FROM round_report WHERE project_id = p_project AND version = p_version;
    PERFORM round_drop_units(p_project, p_version, false);
    DELETE FROM round_group_sum WHERE project_id = p_project AND version = p_version;
    DELETE FROM round_member WHERE project_id = p_project AND version = p_version;
    UPDATE round SET state = 'open', attempt = attempt + 1, last_failure = p_reason,
                     close_reason = NULL, samples = NULL, n_groups = NULL, param_count = NULL,
                     plan_deadline = NULL, params_sha256 = NULL, closed_at = NULL,
                     planned_at = NULL, opened_at = now(),
                     gradient_sha256 = NULL, checkpoint_sha256 = NULL,
                     gradient_samples = NULL, loss = NULL
     WHERE project_id = p_project AND version = p_version;
END
$$;

-- The coordinator's pass over rounds in averaging whose deadline passed:
-- they fail.  Returns how many.
CREATE OR REPLACE FUNCTION round_expire_averaging() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT project_id, version FROM round
              WHERE state = 'averaging' AND plan_deadline < now()
                FOR UPDATE SKIP LOCKED LOOP
        PERFORM round_fail(r.project_id, r.version, 'the averaging deadline passed');
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- Commit round p_version when it is averaging, the server's v+1 exists
-- (which needs every group's sum), every included peer reported ok and the
-- sketches of what was averaged pass round_sketch_verify (else the round
-- fails and reruns without the hosts it flagged), and no included host was
-- flagged for good since the plan (round_banned_hosts): each
-- included peer is accepted when its hash equals the server's, the others
-- (and every peer no group included) are not; with no included peer
-- accepted the round fails.  The round's loss is the sample-weighted mean of
-- the reported losses of the units whose samples count.  The caller holds
-- the round's row lock.
CREATE OR REPLACE FUNCTION round_try_commit(p_project bigint, p_version integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ro     record;
    v_left bigint;
    v_ok   bigint;
    v_bad  bigint[];
BEGIN
    SELECT state, params_sha256, checkpoint_sha256, gradient_sha256, cross_peers INTO ro FROM round
     WHERE project_id = p_project AND version = p_version;
    -- Across groups between the peers (round_cross.sql), v+1 is the one a
    -- strict majority of the included peers holds: without one, once they
    -- all said ok, the round fails.
    IF FOUND AND ro.cross_peers AND ro.state = 'averaging' AND ro.gradient_sha256 IS NOT NULL
       AND ro.checkpoint_sha256 IS NULL AND round_cross_majority(p_project, p_version) IS NULL
       AND NOT EXISTS (SELECT 1 FROM round_member WHERE project_id = p_project
                          AND version = p_version AND included AND outcome IS DISTINCT FROM 'ok') THEN
        PERFORM round_fail(p_project, p_version,
                           'no strict majority of the included peers holds the same parameters');
        RETURN;
    END IF;
    IF NOT FOUND OR ro.state <> 'averaging' OR ro.checkpoint_sha256 IS NULL
       OR ro.gradient_sha256 IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) FILTER (WHERE included AND outcome IS DISTINCT FROM 'ok'),
           count(*) FILTER (WHERE included AND params_sha256 = ro.params_sha256)
      INTO v_left, v_ok
      FROM round_member WHERE project_id = p_project AND version = p_version;
    -- Aggregators its group left out still aggregated their range: where
    -- the group's peers sketch (round_sketch_verify), wait for theirs
    -- (outcome 'dropped'); one that never comes runs out the deadline.
    SELECT v_left + count(*) INTO v_left FROM round_member a
     WHERE a.project_id = p_project AND a.version = p_version AND a.hi > a.lo
       AND a.included IS NOT TRUE AND a.outcome IS NULL
       AND EXISTS (SELECT 1 FROM round_member g
                    WHERE g.project_id = p_project AND g.version = p_version
                      AND g.group_id = a.group_id AND g.included AND g.sketches IS NOT NULL);
    IF v_left > 0 THEN
        RETURN;
    END IF;
    -- After any flag for good under way (the check under a second seed, a
    -- spot check settled against a host: round_flag_lock, taken before this
    -- transaction touches what such a flag changes).
    PERFORM round_flag_lock(p_project);
    -- The averaged bytes against the committed sketches: a host that fails
    -- is flagged and denied, and the round reruns without it (its next
    -- attempt's plan leaves it out), so no step takes its bytes.
    v_bad := round_sketch_verify(p_project, p_version);
    IF cardinality(v_bad) > 0 THEN
        PERFORM round_fail(p_project, p_version,
                           format('host(s) %s failed the check of the averaged bytes against the '
                                  'committed sketches; the round reruns without them',
                                  array_to_string(v_bad, ', ')));
        RETURN;
    END IF;
    -- An included host whose bytes no check could see (an aggregator of its
    -- group left out and silent about them): the round reruns.
    v_bad := round_sketch_unverifiable(p_project, p_version);
    IF cardinality(v_bad) > 0 THEN
        PERFORM round_fail(p_project, p_version,
                           format('the bytes host(s) %s sent cannot be checked: an aggregator of their '
                                  'group reported no sketch of them; the round reruns',
                                  array_to_string(v_bad, ', ')));
        RETURN;
    END IF;
    -- A host flagged for good after this attempt was planned (the check
    -- under a second seed, round_sketch_seed2.sql; a spot check settled
    -- against it, spot_ban) takes no part either: the round reruns without
    -- it.
    v_bad := ARRAY(SELECT host_id FROM round_member
                    WHERE project_id = p_project AND version = p_version AND included
                      AND host_id = ANY (round_banned_hosts(p_project)) ORDER BY host_id);
    IF cardinality(v_bad) > 0 THEN
        PERFORM round_fail(p_project, p_version,
                           format('host(s) %s were flagged for good (the check under a second seed '
                                  'or a spot check of an earlier round); the round reruns without them',
                                  array_to_string(v_bad, ', ')));
        RETURN;
    END IF;
    IF v_ok = 0 THEN
        PERFORM round_fail(p_project, p_version,
                           'no peer holds the parameters computed from the group sums');
        RETURN;
    END IF;
    UPDATE round_member
       SET accepted = coalesce(included AND params_sha256 = ro.params_sha256, false)
     WHERE project_id = p_project AND version = p_version;
    -- seed2: drawn now, after every byte was pinned (round_sketch_seed2.sql).
    UPDATE round SET state = 'committed', committed_at = now(), seed2 = round_seed2_draw(),
                     loss = (SELECT sum(rr.loss * w.mb_done::double precision)
                                    / nullif(sum(w.mb_done::double precision), 0)
                               FROM round_report rr JOIN work_unit w ON w.id = rr.work_unit_id
                              WHERE rr.project_id = p_project AND rr.version = p_version
                                AND rr.loss IS NOT NULL AND w.mb_done > 0)
     WHERE project_id = p_project AND version = p_version;
    INSERT INTO model_version (project_id, version, checkpoint_sha256)
    VALUES (p_project, p_version + 1, ro.checkpoint_sha256)
    ON CONFLICT (project_id, version) DO UPDATE SET checkpoint_sha256 = EXCLUDED.checkpoint_sha256;
    INSERT INTO round (project_id, version) VALUES (p_project, p_version + 1)
    ON CONFLICT DO NOTHING;
    UPDATE project SET current_version = p_version + 1
     WHERE id = p_project AND current_version = p_version;
    -- The settings of version v + 1 (project_settings.sql).
    PERFORM project_apply_settings(p_project);
END
$$;

-- The rounds of project p_project, newest first: at most p_limit, of
-- versions below p_before (NULL: all).  404 for an unknown project.
-- "samples" counts what the round holds: the mean's samples once it
-- exists, the plan's while averaging, the accumulated ones while open or
-- closing; "n_peers" likewise the included hosts, the plan's peers, or the
-- hosts holding work of the version.  "heldout_bpb" is the held-out bits
-- per byte of version v, the model the round trained (the one its "loss"
-- was measured on), once the evaluator has computed it (else null);
-- "heldout_mlm_loss" and "heldout_mlm_accuracy" the same for an encoder.
-- "target_batch" is the target in force at the round's version (a change
-- recorded by project update applies from its version on).
CREATE OR REPLACE FUNCTION round_list(p_project text, p_limit integer, p_before integer)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql STABLE AS $$
DECLARE
    p record;
BEGIN
    SELECT * INTO p FROM project WHERE name = p_project;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('project "%s" does not exist', p_project));
        RETURN;
    END IF;
    RETURN QUERY SELECT 200, jsonb_build_object('rounds', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'version', r.version, 'attempt', r.attempt, 'state', r.state,
                   'target_batch', coalesce((project_config_at(p.config, r.version)->>'target_batch')::integer,
                                            p.target_batch),
                   'samples', CASE
                        WHEN r.gradient_samples IS NOT NULL THEN r.gradient_samples
                        WHEN r.state IN ('open', 'closing')
                            THEN sched_accumulated(p.id, r.version, p.microbatch_size)
                        ELSE r.samples END,
                   'loss', r.loss,
                   'heldout_bpb', (SELECT mv.heldout_bpb FROM model_version mv
                                    WHERE mv.project_id = p.id AND mv.version = r.version),
                   'heldout_mlm_loss', (SELECT mv.heldout_mlm_loss FROM model_version mv
                                         WHERE mv.project_id = p.id AND mv.version = r.version),
                   'heldout_mlm_accuracy', (SELECT mv.heldout_mlm_accuracy FROM model_version mv
                                             WHERE mv.project_id = p.id AND mv.version = r.version),
                   'n_peers', CASE
                        WHEN r.gradient_sha256 IS NOT NULL THEN
                            (SELECT count(*) FROM round_member m
                              WHERE m.project_id = p.id AND m.version = r.version AND m.included)
                        WHEN r.state = 'averaging' THEN
                            (SELECT count(*) FROM round_member m
                              WHERE m.project_id = p.id AND m.version = r.version)
                        ELSE (SELECT count(DISTINCT w.host_id) FROM work_unit w
                               WHERE w.project_id = p.id AND w.version = r.version
                                 AND (w.state = 'live' OR w.mb_done > 0)) END,
                   'n_groups', r.n_groups,
                   'opened_at', r.opened_at, 'closed_at', r.closed_at,
                   'committed_at', r.committed_at,
                   'seconds', extract(epoch FROM r.committed_at - r.opened_at)::double precision)
                   ORDER BY r.version DESC)
          FROM (SELECT * FROM round ro
                 WHERE ro.project_id = p.id AND (p_before IS NULL OR ro.version < p_before)
                 ORDER BY ro.version DESC LIMIT p_limit) r), '[]'::jsonb))::text;
END
$$;
