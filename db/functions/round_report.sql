-- cotrain functions: the reports of a closing round's work units
-- (doc/api.md, "Rounds"): one per work unit, what the plan is made from.

-- The answer to a report, from its row.
CREATE OR REPLACE FUNCTION round_report_answer(p_wu bigint) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_build_object(
                'work_unit_id', rr.work_unit_id, 'state', w.state, 'version', rr.version,
                'mb_done', rr.mb_done, 'samples', rr.samples,
                'returned_lo', w.lo + rr.mb_done, 'returned_hi', w.hi,
                'round', round_note(rr.project_id, rr.version))::text
              FROM round_report rr JOIN work_unit w ON w.id = rr.work_unit_id
             WHERE rr.work_unit_id = p_wu);
END
$$;

-- A work unit's report once its round is closing: the exact microbatches
-- done (samples = mb_done * microbatch_size), what the plan needs of its
-- host (endpoint, bandwidth in bytes/s, whether it accepts connections,
-- round-trip times to other hosts), the unit's mean training loss (NULL:
-- unknown) and the sketches of its microbatches' gradients (NULL: none; else
-- an array of mb_done arrays of the policy's k numbers, row i for stream
-- microbatch lo + i, under the round's sketch seed: what spot checks compare
-- with, doc/credit.md).  A live unit becomes 'returned' and its rest [lo + mb_done, hi)
-- goes back to the pool; a finished one must report all of its range.  The
-- same report (loss included) again answers the same; a different one is
-- 409.  Holds the round row FOR SHARE, so the plan (which takes it FOR
-- UPDATE) sees every report made before it, and none after.
CREATE OR REPLACE FUNCTION round_report(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_samples bigint,
                             p_endpoint text, p_bandwidth double precision,
                             p_can_aggregate boolean, p_rtt jsonb, p_loss double precision,
                             p_sketches jsonb)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint;
    w      record;
    v_state text;
    prev   record;
    v_k    integer;
    v_flat double precision[];
    v_err  text;
BEGIN
    v_host := host_auth(p_token_hash);
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT wu.host_id, wu.project_id, wu.version, wu.lo, wu.hi, wu.mb_done, wu.state,
           p.microbatch_size
      INTO w
      FROM work_unit wu JOIN project p ON p.id = wu.project_id
     WHERE wu.id = p_wu;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('work unit %s does not exist', p_wu));
        RETURN;
    END IF;
    IF w.host_id <> v_host THEN
        RETURN QUERY SELECT 403, api_error('forbidden', format('work unit %s belongs to another host', p_wu));
        RETURN;
    END IF;
    IF p_sketches IS NOT NULL AND jsonb_typeof(p_sketches) <> 'null' THEN
        v_k := (spot_policy_of(w.project_id)).k;
        v_err := spot_sketches_invalid(p_sketches, p_mb_done, v_k);
        IF v_err IS NOT NULL THEN
            RETURN QUERY SELECT 400, api_error('invalid', v_err);
            RETURN;
        END IF;
        v_flat := spot_sketches_flat(p_sketches);
    END IF;
    SELECT * INTO prev FROM round_report WHERE work_unit_id = p_wu;
    IF FOUND THEN
        IF prev.mb_done = p_mb_done AND prev.samples = p_samples AND prev.endpoint = p_endpoint
           AND prev.bandwidth = p_bandwidth AND prev.can_aggregate = p_can_aggregate
           AND prev.rtt = p_rtt AND prev.loss IS NOT DISTINCT FROM p_loss
           AND (SELECT ws.sketches FROM work_unit_sketch ws WHERE ws.work_unit_id = p_wu)
               IS NOT DISTINCT FROM v_flat THEN
            RETURN QUERY SELECT 200, round_report_answer(p_wu);
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('work unit %s was already reported differently', p_wu),
                'Send the same report again, or nothing.');
        END IF;
        RETURN;
    END IF;
    -- The round first, then the unit: the order the plan takes them in.  A
    -- round that is not closing is not locked, so a heartbeat closing it
    -- never waits on a report.
    SELECT state INTO v_state FROM round WHERE project_id = w.project_id AND version = w.version;
    IF v_state = 'closing' THEN
        SELECT state INTO v_state FROM round
         WHERE project_id = w.project_id AND version = w.version FOR SHARE;
    END IF;
    IF v_state IS DISTINCT FROM 'closing' THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s of work unit %s is %s, not closing', w.version, p_wu,
                   coalesce(v_state, 'unknown')),
            CASE WHEN v_state = 'open' THEN 'Keep working; report when a heartbeat says the round is closing.'
                 ELSE 'Drop the gradients of this version and ask for new work.' END);
        RETURN;
    END IF;
    SELECT wu.mb_done, wu.state INTO prev FROM work_unit wu WHERE wu.id = p_wu FOR UPDATE;
    w.mb_done := prev.mb_done;
    w.state := prev.state;
    IF EXISTS (SELECT 1 FROM round_report WHERE work_unit_id = p_wu) THEN
        -- The same unit reported concurrently: answer as a repeat.
        RETURN QUERY SELECT * FROM round_report(p_token_hash, p_wu, p_mb_done, p_samples, p_endpoint,
                                                p_bandwidth, p_can_aggregate, p_rtt, p_loss,
                                                p_sketches);
        RETURN;
    END IF;
    IF w.state NOT IN ('live', 'done') THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('work unit %s is %s', p_wu,
                   CASE w.state WHEN 'returned' THEN 'already handed back' ELSE 'expired' END),
            'Drop the gradients of this version and ask for new work.');
        RETURN;
    END IF;
    IF p_mb_done > w.hi - w.lo THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('mb_done %s is more than the %s microbatches of work unit %s',
                   p_mb_done, w.hi - w.lo, p_wu));
        RETURN;
    END IF;
    IF p_mb_done < w.mb_done THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('mb_done cannot decrease: work unit %s already reported %s', p_wu, w.mb_done));
        RETURN;
    END IF;
    IF w.state = 'done' AND p_mb_done <> w.hi - w.lo THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('work unit %s is finished: mb_done must be %s', p_wu, w.hi - w.lo));
        RETURN;
    END IF;
    IF p_samples <> p_mb_done * w.microbatch_size THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('samples %s is not mb_done %s times the microbatch size %s',
                   p_samples, p_mb_done, w.microbatch_size));
        RETURN;
    END IF;
    IF w.state = 'live' THEN
        UPDATE work_unit SET mb_done = p_mb_done, state = 'returned',
                             last_heartbeat = now(), finished_at = now()
         WHERE id = p_wu;
        IF w.lo + p_mb_done < w.hi THEN
            INSERT INTO mb_pool (project_id, lo, hi) VALUES (w.project_id, w.lo + p_mb_done, w.hi);
        END IF;
    END IF;
    INSERT INTO round_report (work_unit_id, project_id, version, host_id, mb_done, samples,
                              endpoint, bandwidth, can_aggregate, rtt, loss)
    VALUES (p_wu, w.project_id, w.version, v_host, p_mb_done, p_samples,
            p_endpoint, p_bandwidth, p_can_aggregate, p_rtt, p_loss);
    IF v_flat IS NOT NULL AND p_mb_done > 0 THEN
        INSERT INTO work_unit_sketch (work_unit_id, k, sketches) VALUES (p_wu, v_k, v_flat)
        ON CONFLICT (work_unit_id) DO UPDATE SET k = EXCLUDED.k, sketches = EXCLUDED.sketches;
    END IF;
    RETURN QUERY SELECT 200, round_report_answer(p_wu);
END
$$;
