-- cotrain schema, version 7: a round is planned once every work unit of its
-- version is reported, not once every host reported one of them.
--
-- A host reports its units one request at a time; planning after its first
-- report left its other units out (and refused their reports with 409), so
-- the host dropped its gradient and the round was trained again.  Now a
-- round waits for every live unit and every finished unit of the version to
-- be reported, or for the report deadline (closed_at + the report timeout);
-- then, as before, what was not reported does not count and goes back to
-- the pool.  The rest of round_plan_begin is unchanged (0003_rounds.sql).

CREATE OR REPLACE FUNCTION round_plan_begin(p_project bigint, p_version integer,
                                 p_report_timeout_s double precision)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r       record;
    v_pend  bigint;
    v_peers jsonb;
BEGIN
    SELECT ro.state, ro.closed_at, p.microbatch_size, p.config INTO r
      FROM round ro JOIN project p ON p.id = ro.project_id
     WHERE ro.project_id = p_project AND ro.version = p_version
       FOR UPDATE OF ro;
    IF NOT FOUND OR r.state <> 'closing' THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_pend FROM work_unit w
     WHERE w.project_id = p_project AND w.version = p_version
       AND (w.state = 'live'
            OR (w.state = 'done' AND NOT EXISTS (
                    SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id)));
    IF v_pend > 0 AND r.closed_at + make_interval(secs => p_report_timeout_s) > now() THEN
        RETURN NULL;
    END IF;
    PERFORM round_drop_units(p_project, p_version, true);
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'host_id', h.host_id, 'samples', h.samples, 'endpoint', l.endpoint,
               'bandwidth', l.bandwidth, 'can_aggregate', l.can_aggregate, 'rtt', l.rtt)
               ORDER BY h.host_id), '[]'::jsonb)
      INTO v_peers
      FROM (SELECT w.host_id, sum(w.mb_done) * r.microbatch_size AS samples
              FROM work_unit w
             WHERE w.project_id = p_project AND w.version = p_version AND w.mb_done > 0
               AND w.host_id IN (SELECT host_id FROM round_report
                                  WHERE project_id = p_project AND version = p_version)
             GROUP BY w.host_id) h
      CROSS JOIN LATERAL (
            SELECT rr.endpoint, rr.bandwidth, rr.can_aggregate, rr.rtt FROM round_report rr
             WHERE rr.project_id = p_project AND rr.version = p_version AND rr.host_id = h.host_id
             ORDER BY rr.reported_at DESC, rr.work_unit_id DESC LIMIT 1) l;
    IF v_peers = '[]'::jsonb THEN
        PERFORM round_fail(p_project, p_version, 'no host reported gradients');
    END IF;
    RETURN jsonb_build_object('model', r.config->'model', 'peers', v_peers);
END
$$;
