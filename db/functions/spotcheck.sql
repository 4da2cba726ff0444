-- cotrain functions: spot checks (doc/credit.md), BOINC's adaptive
-- replication.  When a round commits, each accepted host is checked with a
-- probability that falls as its record of consecutive agreeing checks grows.
-- A check reissues one of the host's committed work ranges to a second host;
-- both send a fingerprint (the gradient of the range projected on K random
-- directions derived from a seed the server picked after the round
-- committed); the server compares them within a relative tolerance.  While a
-- check is open the host's grant for that round is pending; agreement grants
-- it (and credits the checker), disagreement denies it and every other
-- pending grant of the host and resets its record.  Every project gets the
-- default policy (spot_policy_default); a maintainer may change or delete
-- its row.

-- The policy of a project; without a row, checks are off.
CREATE OR REPLACE FUNCTION spot_policy_of(p_project bigint) RETURNS spot_policy LANGUAGE sql STABLE AS $$
    SELECT coalesce(s, ROW(p_project, 2147483647, 0, 0, 16, 1e-3, 86400)::spot_policy)
      FROM (SELECT NULL) x LEFT JOIN spot_policy s ON s.project_id = p_project
$$;

-- The probability of checking a host with this record under this policy.
CREATE OR REPLACE FUNCTION spot_rate(p spot_policy, p_record integer) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_record < p.trusted_after THEN p.first_rate
                ELSE greatest(p.min_rate, 1.0 / greatest(p_record, 1)) END
$$;

-- Trigger project_spot_policy: every new project gets the default policy.
CREATE OR REPLACE FUNCTION spot_policy_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spot_policy (project_id) VALUES (NEW.id) ON CONFLICT (project_id) DO NOTHING;
    RETURN NEW;
END
$$;

-- Settle check p_check, both fingerprints in (or its deadline passed):
-- compare, then apply the consequences.  The caller holds its row lock.
CREATE OR REPLACE FUNCTION spot_settle(p_check bigint, p_now timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    c      record;
    v_diff double precision;
    v_na   double precision;
    v_nb   double precision;
    v_grant bigint;
    g      record;
BEGIN
    SELECT * INTO c FROM spot_check WHERE id = p_check;
    IF c.state <> 'open' THEN
        RETURN c.state;
    END IF;
    SELECT id INTO v_grant FROM credit_grant
     WHERE kind = 'round' AND project_id = c.project_id AND version = c.version
       AND host_id = c.host_id;
    IF c.fp_host IS NOT NULL AND c.fp_checker IS NOT NULL THEN
        SELECT sqrt(sum((a - b) ^ 2)), sqrt(sum(a ^ 2)), sqrt(sum(b ^ 2))
          INTO v_diff, v_na, v_nb
          FROM unnest(c.fp_host, c.fp_checker) AS u(a, b);
        v_diff := CASE WHEN greatest(v_na, v_nb) > 0 THEN v_diff / greatest(v_na, v_nb)
                       ELSE 0 END;
        IF v_diff <= c.tolerance THEN
            UPDATE spot_check SET state = 'agreed', distance = v_diff, resolved_at = p_now
             WHERE id = p_check;
            INSERT INTO host_check_record AS r (host_id, consecutive, n_agreed, last_at)
            VALUES (c.host_id, 1, 1, p_now)
            ON CONFLICT (host_id) DO UPDATE SET consecutive = r.consecutive + 1,
                n_agreed = r.n_agreed + 1, last_at = p_now;
            PERFORM credit_release(v_grant, p_now);
            -- The checker did the same work: a 'check' grant for it.
            SELECT h.id AS host_id, h.account_id, a.team_id, p.flops_per_sample INTO g
              FROM host h JOIN account a ON a.id = h.account_id, project p
             WHERE h.id = c.checker_id AND p.id = c.project_id;
            IF FOUND THEN
                INSERT INTO credit_grant (kind, project_id, version, host_id, account_id,
                                          team_id, samples, flops, credit, status, work_start,
                                          created_at, spot_check_id)
                VALUES ('check', c.project_id, c.version, g.host_id, g.account_id, g.team_id,
                        c.samples, g.flops_per_sample * c.samples,
                        g.flops_per_sample * c.samples / credit_flops_per_credit(), 'pending',
                        c.assigned_at, p_now, p_check)
                ON CONFLICT (project_id, version, host_id, kind) DO NOTHING
                RETURNING id INTO v_grant;
                IF v_grant IS NOT NULL THEN
                    PERFORM credit_release(v_grant, p_now);
                END IF;
            END IF;
            RETURN 'agreed';
        END IF;
        UPDATE spot_check SET state = 'disagreed', distance = v_diff, resolved_at = p_now
         WHERE id = p_check;
        INSERT INTO host_check_record AS r (host_id, consecutive, n_disagreed, last_at)
        VALUES (c.host_id, 0, 1, p_now)
        ON CONFLICT (host_id) DO UPDATE SET consecutive = 0, n_disagreed = r.n_disagreed + 1,
            last_at = p_now;
        -- Withhold: this grant and every other pending grant of the host.
        UPDATE credit_grant SET status = 'denied',
               reason = format('spot check %s disagreed (distance %s)', p_check, v_diff)
         WHERE host_id = c.host_id AND status = 'pending';
        RETURN 'disagreed';
    END IF;
    IF p_now < c.deadline THEN
        RETURN 'open';
    END IF;
    -- Past the deadline.  A host that never sent its own fingerprint cannot
    -- show its work: denied.  One whose checker never came gets its credit.
    UPDATE spot_check SET state = 'expired', resolved_at = p_now WHERE id = p_check;
    IF c.fp_host IS NULL THEN
        UPDATE credit_grant SET status = 'denied',
               reason = format('spot check %s expired without the host''s fingerprint', p_check)
         WHERE id = v_grant AND status = 'pending';
    ELSE
        PERFORM credit_release(v_grant, p_now);
    END IF;
    RETURN 'expired';
END
$$;

-- Settle every open check past its deadline; returns how many.
CREATE OR REPLACE FUNCTION spot_expire(p_now timestamptz DEFAULT credit_now()) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_n  integer := 0;
BEGIN
    FOR v_id IN SELECT id FROM spot_check WHERE state = 'open' AND deadline <= p_now
                 ORDER BY id FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM spot_settle(v_id, p_now);
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END
$$;

-- A check as the hosts see it.
CREATE OR REPLACE FUNCTION spot_check_json(c spot_check) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', c.id, 'project', p.name, 'version', c.version, 'lo', c.lo, 'hi', c.hi,
        'samples', c.samples, 'seed', c.seed::text, 'k', c.k, 'tolerance', c.tolerance,
        'checkpoint_sha256', mv.checkpoint_sha256, 'deadline', c.deadline, 'state', c.state)
      FROM project p
      LEFT JOIN model_version mv ON mv.project_id = p.id AND mv.version = c.version
     WHERE p.id = c.project_id
$$;

-- GET /v1/hosts/{id}/spotchecks: the open checks of the host's own work that
-- still wait for its fingerprint, and those it claimed as a checker.
CREATE OR REPLACE FUNCTION spot_list(p_token_hash bytea, p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint := host_auth(p_token_hash);
BEGIN
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    IF v_host <> p_host THEN
        RETURN QUERY SELECT 403, api_error('forbidden',
            format('this token belongs to host %s, not to host %s', v_host, p_host));
        RETURN;
    END IF;
    PERFORM spot_expire(credit_now());
    RETURN QUERY SELECT 200, jsonb_build_object(
        'own', coalesce((SELECT jsonb_agg(spot_check_json(c) ORDER BY c.id) FROM spot_check c
                          WHERE c.host_id = p_host AND c.state = 'open' AND c.fp_host IS NULL),
                        '[]'::jsonb),
        'checking', coalesce((SELECT jsonb_agg(spot_check_json(c) ORDER BY c.id) FROM spot_check c
                               WHERE c.checker_id = p_host AND c.state = 'open'
                                 AND c.fp_checker IS NULL), '[]'::jsonb))::text;
END
$$;

-- POST /v1/projects/{name}/spotchecks/claim: give the host the oldest open
-- check of this project that has no checker, is not its own account's work,
-- and whose version checkpoint exists.  204 when there is none.
CREATE OR REPLACE FUNCTION spot_claim(p_token_hash bytea, p_project text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint := host_auth(p_token_hash);
    v_acc  bigint;
    v_pid  bigint;
    c      spot_check;
BEGIN
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT id INTO v_pid FROM project WHERE name = p_project;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('project "%s" does not exist', p_project));
        RETURN;
    END IF;
    PERFORM spot_expire(credit_now());
    SELECT account_id INTO v_acc FROM host WHERE id = v_host;
    -- One claimed, unanswered check at a time: the same again.
    SELECT * INTO c FROM spot_check
     WHERE project_id = v_pid AND checker_id = v_host AND state = 'open' AND fp_checker IS NULL
     ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        SELECT sc.* INTO c FROM spot_check sc JOIN host h ON h.id = sc.host_id
         WHERE sc.project_id = v_pid AND sc.state = 'open' AND sc.checker_id IS NULL
           AND h.account_id <> v_acc
         ORDER BY sc.id LIMIT 1 FOR UPDATE OF sc SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 204, jsonb_build_object('retry_after', 600)::text;
            RETURN;
        END IF;
        UPDATE spot_check SET checker_id = v_host, assigned_at = credit_now()
         WHERE id = c.id RETURNING * INTO c;
    END IF;
    RETURN QUERY SELECT 200, spot_check_json(c)::text;
END
$$;

-- POST /v1/spotchecks/{id}/fingerprint: the host whose work it is, or its
-- checker, sends its K values.  Settles the check once both are in and
-- answers its state (and distance once settled).  The same values again
-- answer the same; different ones are 409.
CREATE OR REPLACE FUNCTION spot_fingerprint(p_token_hash bytea, p_check bigint, p_values double precision[])
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host  bigint := host_auth(p_token_hash);
    c       spot_check;
    v_prev  double precision[];
    v_state text;
BEGIN
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT * INTO c FROM spot_check WHERE id = p_check FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('spot check %s does not exist', p_check));
        RETURN;
    END IF;
    IF v_host <> c.host_id AND v_host IS DISTINCT FROM c.checker_id THEN
        RETURN QUERY SELECT 403, api_error('forbidden',
            format('host %s is neither the host nor the checker of spot check %s', v_host, p_check),
            'Claim a check first (POST /v1/projects/{name}/spotchecks/claim).');
        RETURN;
    END IF;
    IF cardinality(p_values) IS DISTINCT FROM c.k THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('spot check %s wants %s values, not %s', p_check, c.k,
                   coalesce(cardinality(p_values), 0)));
        RETURN;
    END IF;
    v_prev := CASE WHEN v_host = c.host_id THEN c.fp_host ELSE c.fp_checker END;
    IF v_prev IS NOT NULL THEN
        IF v_prev = p_values THEN
            RETURN QUERY SELECT 200, jsonb_build_object('id', c.id, 'state', c.state,
                                                        'distance', c.distance)::text;
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('host %s already sent a different fingerprint for spot check %s',
                       v_host, p_check));
        END IF;
        RETURN;
    END IF;
    IF c.state <> 'open' THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('spot check %s is %s', p_check, c.state), 'Drop it.');
        RETURN;
    END IF;
    IF v_host = c.host_id THEN
        UPDATE spot_check SET fp_host = p_values WHERE id = p_check;
    ELSE
        UPDATE spot_check SET fp_checker = p_values WHERE id = p_check;
    END IF;
    v_state := spot_settle(p_check, credit_now());
    RETURN QUERY SELECT 200, (SELECT jsonb_build_object('id', s.id, 'state', s.state,
                                                        'distance', s.distance)
                                FROM spot_check s WHERE s.id = p_check)::text;
END
$$;
