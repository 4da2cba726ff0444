-- cotrain functions: a round's plan (doc/api.md, "Rounds"): the
-- coordinator starts it from the reports (round_plan_begin), computes the
-- groups and shares in C (server/round_coord.c) and stores them
-- (round_plan_store); each peer fetches its part (round_plan_get).

-- True while some work unit of round p_version of p_project is still to be
-- reported: live, or finished without its own report.
CREATE OR REPLACE FUNCTION round_units_pending(p_project bigint, p_version integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM work_unit w
                    WHERE w.project_id = p_project AND w.version = p_version
                      AND (w.state = 'live'
                           OR (w.state = 'done' AND NOT EXISTS (
                                   SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id))))
$$;

-- Start planning a closing round: NULL while some work unit of the version
-- is not reported (a live unit, or a finished unit without its own report)
-- and the report deadline (closed_at + p_report_timeout_s) has not passed.
-- (A host reports its units one request at a time: planning after its first
-- report would leave its other units out.)  Otherwise drops every unit that
-- does not count (round_drop_units) and returns {"model": the project's
-- model, "peers": [{"host_id", "samples", "endpoint", "bandwidth",
-- "can_aggregate", "rtt"}, ...] ordered by host id} from each host's reports
-- (samples summed over its counted units; the rest from its latest report).
-- With no peer left the round fails (and reopens) and "peers" is empty.
-- When the peers' samples are fewer than the project's min_batch_fraction
-- (config, default 0: never) of target_batch, the round is not planned but
-- reopened for the rest: it is open again in the same attempt, its reports
-- and the units they count stay, new work fills the rest of the target, and
-- the answer is {"reopened": true, "samples": S, "peers": []}; the reported
-- hosts keep their gradients (round_plan_get tells them) and report again
-- at the next close.
-- After this no report can change the peers: every unit left is reported or
-- finished.
CREATE OR REPLACE FUNCTION round_plan_begin(p_project bigint, p_version integer,
                                 p_report_timeout_s double precision)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r       record;
    v_peers   jsonb;
    v_samples bigint;
BEGIN
    -- Not ready while a unit is still to report: looked at first without
    -- the round's lock.  The coordinator looks each time a report comes in
    -- (at most every 20 ms, round_notify.sql), and a look that waited for
    -- the round FOR UPDATE held up every report behind it (they take the
    -- row FOR SHARE) for as long as its count took, 50 times a second
    -- through a thousand reports.  Counted again under the lock.
    IF NOT EXISTS (SELECT 1 FROM round ro
                    WHERE ro.project_id = p_project AND ro.version = p_version
                      AND ro.state = 'closing'
                      AND (ro.closed_at + make_interval(secs => p_report_timeout_s) <= now()
                           OR NOT round_units_pending(p_project, p_version))) THEN
        RETURN NULL;
    END IF;
    SELECT ro.state, ro.closed_at, p.microbatch_size, p.target_batch, p.config INTO r
      FROM round ro JOIN project p ON p.id = ro.project_id
     WHERE ro.project_id = p_project AND ro.version = p_version
       FOR UPDATE OF ro;
    IF NOT FOUND OR r.state <> 'closing' THEN
        RETURN NULL;
    END IF;
    IF round_units_pending(p_project, p_version)
       AND r.closed_at + make_interval(secs => p_report_timeout_s) > now() THEN
        RETURN NULL;
    END IF;
    PERFORM round_drop_units(p_project, p_version, true);
    -- Hosts an earlier attempt flagged (round_sketch_verify), and hosts
    -- flagged for good in any round (the check under a second seed,
    -- round_seed2_verify; a spot check settled against them, spot_ban),
    -- take no part: their ranges go back to the pool for the others.
    PERFORM round_give_back(ARRAY(
        SELECT w.id FROM work_unit w
         WHERE w.project_id = p_project AND w.version = p_version
           AND (w.mb_done > 0 OR w.state = 'live')
           AND w.host_id = ANY (round_sketch_barred(p_project, p_version))
           FOR UPDATE));
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
    ELSE
        SELECT sum((e->>'samples')::bigint) INTO v_samples FROM jsonb_array_elements(v_peers) e;
        IF v_samples < coalesce((r.config->>'min_batch_fraction')::double precision, 0) * r.target_batch THEN
            UPDATE round SET state = 'open', closed_at = NULL, close_reason = NULL,
                             last_failure = format('reopened for the rest: %s of %s samples after the close',
                                                   v_samples, r.target_batch)
             WHERE project_id = p_project AND version = p_version;
            RETURN jsonb_build_object('reopened', true, 'samples', v_samples, 'peers', '[]'::jsonb);
        END IF;
    END IF;
    RETURN jsonb_build_object('model', r.config->'model', 'peers', v_peers);
END
$$;

-- Store the plan computed from round_plan_begin's peers: p_members is
-- [{"host_id", "group", "samples", "endpoint", "bandwidth", "can_aggregate",
-- "lo", "hi"}, ...].  The round goes to 'averaging' with outcomes due
-- p_average_timeout_s from now, averaging across groups between the peers
-- when p_cross_peers (round_cross.sql).  False when the round is no longer
-- closing.
DROP FUNCTION IF EXISTS round_plan_store(bigint, integer, bigint, jsonb, double precision);
CREATE OR REPLACE FUNCTION round_plan_store(p_project bigint, p_version integer, p_param_count bigint,
                                 p_members jsonb, p_average_timeout_s double precision,
                                 p_cross_peers boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM round WHERE project_id = p_project AND version = p_version
                           AND state = 'closing' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO round_member (project_id, version, host_id, group_id, samples, endpoint,
                              bandwidth, can_aggregate, lo, hi)
    SELECT p_project, p_version, (m->>'host_id')::bigint, (m->>'group')::integer,
           (m->>'samples')::bigint, m->>'endpoint', (m->>'bandwidth')::double precision,
           (m->>'can_aggregate')::boolean, (m->>'lo')::bigint, (m->>'hi')::bigint
      FROM jsonb_array_elements(p_members) m;
    UPDATE round SET state = 'averaging', planned_at = now(),
                     plan_deadline = now() + make_interval(secs => p_average_timeout_s),
                     param_count = p_param_count, cross_peers = p_cross_peers,
                     samples = (SELECT sum(samples) FROM round_member
                                 WHERE project_id = p_project AND version = p_version),
                     n_groups = (SELECT count(DISTINCT group_id) FROM round_member
                                  WHERE project_id = p_project AND version = p_version)
     WHERE project_id = p_project AND version = p_version;
    PERFORM round_cross_partition_store(p_project, p_version);
    RETURN true;
END
$$;

-- What a plan's answers depend on besides the members and their tokens:
-- the round's fields and the project's averaging settings, as one md5.
-- The plan cache (server/plan_cache.c) keeps a snapshot across a wake-up of
-- the plan polls while this stays the same.  NULL when there is no round.
CREATE OR REPLACE FUNCTION round_plan_stamp(p_project text, p_version integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT md5(row(r.attempt, r.state, r.n_groups, r.samples, r.param_count, r.plan_deadline,
                   r.cross_peers, r.gradient_sha256, r.gradient_samples, r.params_sha256,
                   p.config->'compression', p.config->'aggregation', p.config->'centered_clip')::text)
      FROM project p JOIN round r ON r.project_id = p.id AND r.version = p_version
     WHERE p.name = p_project
$$;

-- The 200 answers of round p_version's plan (round_plan_get) of project
-- p_project (named p_name, configured p_config): one row per member of the
-- plan, only p_host's when p_host is not NULL, none before the plan.  The
-- round's part and each group's member list are built once, and each
-- answer is put together as text (a JSON object; jsonb's concatenations of
-- the aggregators' slices took three times as long): 75 ms for the 1,000
-- answers (12 MB) of a round of tests/bench/bench-scale.sh, against 0.5 ms
-- for one.
CREATE OR REPLACE FUNCTION round_plan_bodies(p_project bigint, p_name text, p_config jsonb,
                                             p_version integer, p_host bigint)
RETURNS TABLE (host_id bigint, body text) LANGUAGE sql STABLE AS $$
    -- MATERIALIZED: the members were inserted by the plan's transaction, the
    -- statistics still say "one row", and a nested loop would build every
    -- group's list again for each member (37 s for 1,000 members).
    WITH ro AS MATERIALIZED (
        SELECT left((jsonb_build_object(
                   'project', p_name, 'version', p_version, 'attempt', r.attempt, 'state', r.state,
                   'n_groups', r.n_groups, 'round_samples', r.samples, 'param_count', r.param_count,
                   'deadline', r.plan_deadline,
                   'compression', coalesce(p_config->'compression', '"none"'::jsonb),
                   'aggregation', coalesce(p_config->'aggregation', '"mean"'::jsonb),
                   'centered_clip', p_config->'centered_clip')
               || CASE WHEN NOT r.cross_peers THEN '{}'::jsonb
                       ELSE jsonb_build_object('cross_group', 'peers') END
               || CASE WHEN r.gradient_sha256 IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object(
                                'gradient', jsonb_build_object('sha256', r.gradient_sha256,
                                                               'samples', r.gradient_samples)
                                            || CASE WHEN r.cross_peers THEN '{}'::jsonb
                                                    ELSE jsonb_build_object('url', '/files/' || r.gradient_sha256) END)
                            || CASE WHEN r.params_sha256 IS NULL THEN '{}'::jsonb
                                    ELSE jsonb_build_object('params_sha256', r.params_sha256) END
                  END)::text, -1) AS head, -- without its closing brace
               r.cross_peers, r.cross_partition IS NOT NULL AS kept
          FROM round r
         WHERE r.project_id = p_project AND r.version = p_version
           AND r.state NOT IN ('open', 'closing')),
    -- The slices across groups kept at the plan (round_cross_partition_store),
    -- each as text once.
    sl AS MATERIALIZED (
        SELECT (e->>'index')::bigint AS idx, (e->>'lo')::bigint AS lo, (e->>'hi')::bigint AS hi,
               e::text AS t
          FROM round r, jsonb_array_elements(r.cross_partition) e
         WHERE r.project_id = p_project AND r.version = p_version AND r.cross_peers),
    grp AS MATERIALIZED (
        SELECT g.group_id, jsonb_agg(jsonb_build_object(
                   'host_id', g.host_id, 'endpoint', g.endpoint, 'samples', g.samples,
                   'can_aggregate', g.can_aggregate, 'lo', g.lo, 'hi', g.hi)
                   ORDER BY g.host_id)::text AS members
          FROM round_member g
         WHERE g.project_id = p_project AND g.version = p_version
           AND (p_host IS NULL OR g.group_id = (SELECT h.group_id FROM round_member h
                                                 WHERE h.project_id = p_project
                                                   AND h.version = p_version AND h.host_id = p_host))
         GROUP BY g.group_id)
    SELECT m.host_id,
           ro.head || ', "host_id": ' || m.host_id || ', "group": ' || m.group_id
           || ', "members": ' || grp.members
           -- An aggregator's slices: those inside its range (as
           -- round_cross_slices gives them), none for a member that
           -- aggregates nothing or a round in one group (no partition kept).
           || CASE WHEN NOT ro.cross_peers OR m.hi <= m.lo THEN ''
                   WHEN ro.kept THEN coalesce(', "cross": [' || (
                            SELECT string_agg(sl.t, ', ' ORDER BY sl.idx) FROM sl
                             WHERE sl.lo >= m.lo AND sl.hi <= m.hi) || ']', '')
                   ELSE coalesce(', "cross": '
                                 || round_cross_slices(p_project, p_version, m.host_id)::text, '')
              END
           || '}'
      FROM ro, round_member m
      JOIN grp ON grp.group_id = m.group_id
     WHERE m.project_id = p_project AND m.version = p_version
       AND (p_host IS NULL OR m.host_id = p_host)
$$;

-- The plan of round p_version for host p_host: 200 with its group, or 204
-- (body: {"state", "attempt"}) while there is none yet, 409 when the host is
-- not in it (it reported nothing, or too late), or 409 with "round":
-- {"state": "open", "reopened": true, ...} when the round it reported to
-- reopened for the rest of its batch.  Once the mean gradient
-- exists the plan also carries "gradient" {"sha256", "url", "samples"} and
-- the server's "params_sha256".  A round averaging across groups between
-- the peers says "cross_group": "peers", its "gradient" has no "url" (the
-- server holds only the hash), and an aggregator's plan carries "cross":
-- the slices of its range (round_cross_slices).
CREATE OR REPLACE FUNCTION round_plan_get(p_token_hash bytea, p_project text, p_version integer,
                                          p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c  record;
    b  text;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host, false);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    IF c.state = 'open' AND EXISTS (SELECT 1 FROM round_report rr
                                     WHERE rr.project_id = c.project_id AND rr.version = p_version
                                       AND rr.host_id = p_host) THEN
        -- Reports survive only a reopening for the rest (round_fail
        -- forgets them): the host keeps its gradient and computes on.
        RETURN QUERY SELECT 409, jsonb_build_object(
            'error', jsonb_build_object(
                'code', 'conflict',
                'message', format('round %s of project "%s" reopened for the rest of its batch',
                                  p_version, p_project),
                'hint', 'Keep the gradient, compute more work units of this version and report them when the round closes again.'),
            'round', jsonb_build_object('state', 'open', 'version', p_version,
                                        'attempt', c.attempt, 'reopened', true))::text;
        RETURN;
    END IF;
    IF c.state IN ('open', 'closing') THEN
        RETURN QUERY SELECT 204, jsonb_build_object('state', c.state, 'attempt', c.attempt)::text;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM round_member rm
                    WHERE rm.project_id = c.project_id AND rm.version = p_version
                      AND rm.host_id = p_host) THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('host %s is not in the plan of round %s', p_host, p_version),
            'Drop the gradients of this version, load the latest checkpoint and ask for new work.');
        RETURN;
    END IF;
    SELECT pb.body INTO b FROM round_plan_bodies(c.project_id, p_project, c.config, p_version, p_host) pb;
    IF b IS NULL THEN
        -- The round failed and closed again since it was looked up.
        RETURN QUERY SELECT 204, jsonb_build_object('state', ro.state, 'attempt', ro.attempt)::text
                       FROM round ro WHERE ro.project_id = c.project_id AND ro.version = p_version;
        RETURN;
    END IF;
    RETURN QUERY SELECT 200, b;
END
$$;

-- Every member's answer of round p_version's plan of project p_project
-- (round_plan_get's 200 body), with the hex sha256 of the member host's
-- token, whether the mean gradient is in, and the round's stamp
-- (round_plan_stamp): what cotrain-server's plan cache (server/plan_cache.c)
-- answers a round's thousand held plan polls from, in one query instead of
-- one each.  Hosts whose token is revoked, or whose account is disabled,
-- are left out (as host_auth refuses them).  No rows while the round is open or closing, or when there
-- is no such round.  In no order.
CREATE OR REPLACE FUNCTION round_plan_all(p_project text, p_version integer)
RETURNS TABLE (host_id bigint, token_sha256 text, has_gradient boolean, stamp text, body text)
LANGUAGE sql STABLE AS $$
    SELECT b.host_id, encode(h.token_hash, 'hex'), ro.gradient_sha256 IS NOT NULL,
           (SELECT round_plan_stamp(p_project, p_version)), b.body
      FROM project p
      JOIN round ro ON ro.project_id = p.id AND ro.version = p_version
     CROSS JOIN LATERAL round_plan_bodies(p.id, p.name, p.config, p_version, NULL) b
      JOIN host h ON h.id = b.host_id
      JOIN account a ON a.id = h.account_id
     WHERE p.name = p_project AND NOT h.revoked AND NOT a.disabled
$$;
