-- cotrain schema, version 5: averaging across groups (doc/api.md, "Rounds").
--
-- Every group of the plan averages on its own; each member that finished
-- the group's all-reduce uploads the group's gradient SUM with the hosts it
-- holds ("included", ascending host ids) and their samples.  The first valid
-- upload per group is kept (round_group_sum, the bytes in the file store).
-- When every group has a kept sum, the server computes the round's mean
-- gradient (sum of the group sums in ascending group order, in double,
-- divided by the total of their samples, rounded once to fp32), drops the
-- work units of every plan host that no group included (their ranges go back
-- to the pool), and takes its own optimizer step to v+1 (as in 0004).
-- The round commits once v+1 exists and every included host reported ok;
-- hosts no group included are ignored (their outcome answers accepted: false
-- and reload).  This replaces 0004's single uploaded mean gradient, whose
-- functions are dropped here.
--
-- Work-unit reports gain an optional "loss" (the mean training loss over
-- the unit's samples); a committed round's loss is the sample-weighted mean
-- over the reported units whose samples count.

ALTER TABLE round ADD COLUMN gradient_samples bigint CHECK (gradient_samples > 0),
                  ADD COLUMN loss double precision;
ALTER TABLE round_report ADD COLUMN loss double precision
    CHECK (loss >= 0 AND loss < 'Infinity'::double precision);
-- NULL until the sum of the member's group is kept; then whether it holds
-- the member's contribution.
ALTER TABLE round_member ADD COLUMN included boolean;

CREATE TABLE round_group_sum (
    project_id  bigint NOT NULL,
    version     integer NOT NULL,
    group_id    integer NOT NULL CHECK (group_id >= 0),
    host_id     bigint NOT NULL REFERENCES host(id),   -- the first uploader
    samples     bigint NOT NULL CHECK (samples > 0),
    included    jsonb NOT NULL,                        -- ascending host ids
    sum_sha256  text NOT NULL CHECK (sum_sha256 ~ '^[0-9a-f]{64}$'),
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, version, group_id),
    FOREIGN KEY (project_id, version) REFERENCES round (project_id, version) ON DELETE CASCADE
);

DROP FUNCTION round_gradient_begin(bytea, text, integer, bigint, bigint);
DROP FUNCTION round_gradient_store(bigint, integer, integer, text, text, bigint, text);
DROP FUNCTION round_gradient_body(bigint, integer);

-- As in 0004, plus: the group sums, the mean's samples and the loss of the
-- failed attempt are forgotten.
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

-- The report of 0003 with the unit's mean training loss (NULL: unknown).
-- The same report (loss included) again answers the same; a different one
-- is 409.
DROP FUNCTION round_report(bytea, bigint, bigint, bigint, text, double precision, boolean, jsonb);
CREATE FUNCTION round_report(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_samples bigint,
                             p_endpoint text, p_bandwidth double precision,
                             p_can_aggregate boolean, p_rtt jsonb, p_loss double precision)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint;
    w      record;
    v_state text;
    prev   record;
BEGIN
    SELECT h.id INTO v_host
      FROM host h JOIN account a ON a.id = h.account_id
     WHERE h.token_hash = p_token_hash AND NOT h.revoked AND NOT a.disabled;
    IF NOT FOUND THEN
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
    SELECT * INTO prev FROM round_report WHERE work_unit_id = p_wu;
    IF FOUND THEN
        IF prev.mb_done = p_mb_done AND prev.samples = p_samples AND prev.endpoint = p_endpoint
           AND prev.bandwidth = p_bandwidth AND prev.can_aggregate = p_can_aggregate
           AND prev.rtt = p_rtt AND prev.loss IS NOT DISTINCT FROM p_loss THEN
            RETURN QUERY SELECT 200, round_report_answer(p_wu);
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('work unit %s was already reported differently', p_wu),
                'Send the same report again, or nothing.');
        END IF;
        RETURN;
    END IF;
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
        RETURN QUERY SELECT * FROM round_report(p_token_hash, p_wu, p_mb_done, p_samples, p_endpoint,
                                                p_bandwidth, p_can_aggregate, p_rtt, p_loss);
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
    RETURN QUERY SELECT 200, round_report_answer(p_wu);
END
$$;

-- Drop the work units of version p_version whose host is in the plan but
-- in no group's included set: like round_drop_units, their finished part
-- goes back to the pool and their samples stop counting.  Returns how many.
CREATE FUNCTION round_drop_excluded(p_project bigint, p_version integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH doomed AS (
        SELECT w.id FROM work_unit w
         WHERE w.project_id = p_project AND w.version = p_version
           AND (w.mb_done > 0 OR w.state = 'live')
           AND w.host_id IN (SELECT m.host_id FROM round_member m
                              WHERE m.project_id = p_project AND m.version = p_version
                                AND m.included IS NOT TRUE)
           FOR UPDATE
    ), dropped AS (
        UPDATE work_unit w SET state = 'expired', mb_done = 0,
                               finished_at = coalesce(w.finished_at, now())
          FROM doomed d, work_unit old
         WHERE w.id = d.id AND old.id = d.id
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

-- Commit round p_version when it is averaging, the server's v+1 exists
-- (which needs every group's sum) and every included peer reported ok: each
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
BEGIN
    SELECT state, params_sha256, checkpoint_sha256, gradient_sha256 INTO ro FROM round
     WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR ro.state <> 'averaging' OR ro.checkpoint_sha256 IS NULL
       OR ro.gradient_sha256 IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) FILTER (WHERE included AND outcome IS DISTINCT FROM 'ok'),
           count(*) FILTER (WHERE included AND params_sha256 = ro.params_sha256)
      INTO v_left, v_ok
      FROM round_member WHERE project_id = p_project AND version = p_version;
    IF v_left > 0 THEN
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
    UPDATE round SET state = 'committed', committed_at = now(),
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
END
$$;

-- The answer to a peer's outcome, as in 0004, except that a peer no group
-- included is never accepted and, once v+1 exists, is told to reload.
CREATE OR REPLACE FUNCTION round_outcome_body(p_project bigint, p_version integer, p_host bigint)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    ro record;
    m  record;
    b  jsonb;
BEGIN
    SELECT * INTO ro FROM round WHERE project_id = p_project AND version = p_version;
    SELECT * INTO m FROM round_member
     WHERE project_id = p_project AND version = p_version AND host_id = p_host;
    b := jsonb_build_object('version', p_version, 'host_id', p_host,
        'status', coalesce(m.outcome, 'failed'),
        'round', jsonb_build_object('state', ro.state, 'version', p_version,
                                    'attempt', ro.attempt, 'last_failure', ro.last_failure));
    IF m.included IS FALSE THEN
        b := b || jsonb_build_object('accepted', false);
        IF ro.params_sha256 IS NOT NULL THEN
            b := b || jsonb_build_object('params_sha256', ro.params_sha256);
        END IF;
    ELSIF m.outcome = 'ok' AND ro.params_sha256 IS NOT NULL THEN
        b := b || jsonb_build_object('params_sha256', ro.params_sha256,
                                     'accepted', m.params_sha256 = ro.params_sha256);
    END IF;
    IF ro.checkpoint_sha256 IS NOT NULL AND b->'accepted' = 'false'::jsonb THEN
        b := b || jsonb_build_object('reload', jsonb_build_object(
            'version', p_version + 1, 'checkpoint_sha256', ro.checkpoint_sha256,
            'url', '/files/' || ro.checkpoint_sha256));
    END IF;
    RETURN b::text;
END
$$;

-- A peer's outcome of averaging.  As in 0004, except: a peer that its
-- group's kept sum does not include is ignored (its outcome is stored and
-- answered, never fails or holds up the round, in 'averaging' or
-- 'committed'); a 'failed' from any other peer fails the round.
CREATE OR REPLACE FUNCTION round_outcome(p_token_hash bytea, p_project text, p_version integer,
                              p_host bigint, p_status text, p_included jsonb, p_sha256 text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c       record;
    m       record;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    SELECT * INTO m FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('host %s is not in the plan of round %s', p_host, p_version),
            'Drop the gradients of this version, load the latest checkpoint and ask for new work.');
        RETURN;
    END IF;
    IF m.outcome IS NOT NULL THEN
        IF m.outcome = p_status AND m.params_sha256 IS NOT DISTINCT FROM p_sha256
           AND m.included_hosts = p_included THEN
            RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('host %s already reported a different outcome for round %s', p_host, p_version));
        END IF;
        RETURN;
    END IF;
    IF c.state <> 'averaging' AND NOT (c.state = 'committed' AND m.included IS FALSE) THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s is %s, not averaging', p_version, c.state));
        RETURN;
    END IF;
    UPDATE round_member SET outcome = p_status, included_hosts = p_included,
                            params_sha256 = p_sha256, outcome_at = now()
     WHERE project_id = c.project_id AND version = p_version AND host_id = p_host;
    IF m.included IS FALSE THEN
        RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
        RETURN;
    END IF;
    IF p_status = 'failed' THEN
        PERFORM round_fail(c.project_id, p_version, format('host %s failed to average', p_host));
        RETURN QUERY SELECT 200, jsonb_build_object('version', p_version, 'host_id', p_host,
            'status', p_status,
            'round', (SELECT jsonb_build_object('state', r.state, 'version', p_version,
                                                'attempt', r.attempt, 'last_failure', r.last_failure)
                        FROM round r WHERE r.project_id = c.project_id AND r.version = p_version))::text;
        RETURN;
    END IF;
    PERFORM round_try_commit(c.project_id, p_version);
    RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
END
$$;

-- The plan of 0003, plus, once the mean gradient exists, "gradient"
-- {"sha256", "url", "samples"} and the server's "params_sha256".
CREATE OR REPLACE FUNCTION round_plan_get(p_token_hash bytea, p_project text, p_version integer,
                                          p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c  record;
    ro record;
    m  record;
    b  jsonb;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    IF c.state IN ('open', 'closing') THEN
        RETURN QUERY SELECT 204, jsonb_build_object('state', c.state, 'attempt', c.attempt)::text;
        RETURN;
    END IF;
    SELECT * INTO m FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('host %s is not in the plan of round %s', p_host, p_version),
            'Drop the gradients of this version, load the latest checkpoint and ask for new work.');
        RETURN;
    END IF;
    SELECT * INTO ro FROM round r WHERE r.project_id = c.project_id AND r.version = p_version;
    b := jsonb_build_object(
        'project', p_project, 'version', p_version, 'attempt', ro.attempt, 'state', ro.state,
        'host_id', p_host, 'group', m.group_id, 'n_groups', ro.n_groups,
        'round_samples', ro.samples, 'param_count', ro.param_count,
        'deadline', ro.plan_deadline,
        'compression', coalesce(c.config->'compression', '"none"'::jsonb),
        'members', (SELECT jsonb_agg(jsonb_build_object(
                        'host_id', g.host_id, 'endpoint', g.endpoint, 'samples', g.samples,
                        'can_aggregate', g.can_aggregate, 'lo', g.lo, 'hi', g.hi)
                        ORDER BY g.host_id)
                      FROM round_member g
                     WHERE g.project_id = c.project_id AND g.version = p_version
                       AND g.group_id = m.group_id));
    IF ro.gradient_sha256 IS NOT NULL THEN
        b := b || jsonb_build_object(
            'gradient', jsonb_build_object('sha256', ro.gradient_sha256,
                                           'url', '/files/' || ro.gradient_sha256,
                                           'samples', ro.gradient_samples),
            'params_sha256', ro.params_sha256);
    END IF;
    RETURN QUERY SELECT 200, b::text;
END
$$;

-- The answer to a group sum upload.
CREATE FUNCTION round_group_sum_body(p_project bigint, p_version integer, p_group integer)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    ro record;
    b  jsonb;
BEGIN
    SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version;
    b := jsonb_build_object('version', p_version, 'group', p_group,
        'group_sum_sha256', (SELECT s.sum_sha256 FROM round_group_sum s
                              WHERE s.project_id = p_project AND s.version = p_version
                                AND s.group_id = p_group),
        'groups_in', (SELECT count(*) FROM round_group_sum s
                       WHERE s.project_id = p_project AND s.version = p_version),
        'n_groups', ro.n_groups,
        'round', jsonb_build_object('state', ro.state, 'version', p_version,
                                    'attempt', ro.attempt));
    IF ro.gradient_sha256 IS NOT NULL THEN
        b := b || jsonb_build_object('gradient_sha256', ro.gradient_sha256,
                                     'params_sha256', ro.params_sha256);
    END IF;
    RETURN b::text;
END
$$;

-- Before a group sum's bytes are read: may host p_host upload the sum of
-- its group over the hosts p_included (a JSON array of ascending host ids)
-- with p_samples samples?  status NULL when it may, with the round's
-- attempt, the host's group and param_count; else the answer: 401/403/404
-- as round_lookup; 409 when the host is not in the plan, the round is not
-- averaging (a repeat of the group's kept sum is let through after the
-- commit, to be answered as before) or the group already kept a sum over
-- other hosts; 400 when an included host is not a member of the uploader's
-- group, the uploader is not included, or p_samples is not the sum of their
-- planned samples.
CREATE FUNCTION round_group_sum_begin(p_token_hash bytea, p_project text, p_version integer,
                                      p_host bigint, p_samples bigint, p_included jsonb,
                                      OUT status integer, OUT body text, OUT project_id bigint,
                                      OUT attempt integer, OUT group_id integer,
                                      OUT param_count bigint)
LANGUAGE plpgsql AS $$
DECLARE
    c     record;
    m     record;
    kept  record;
    v_n   integer;
    v_in  integer;
    v_sum bigint;
    v_bad bigint;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host);
    IF c.status IS NOT NULL THEN
        status := c.status;
        body := c.body;
        RETURN;
    END IF;
    project_id := c.project_id;
    attempt := c.attempt;
    SELECT * INTO m FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT FOUND THEN
        status := 409;
        body := api_error('conflict',
            format('host %s is not in the plan of round %s', p_host, p_version),
            'Only a peer of the round''s plan may upload its group''s sum.');
        RETURN;
    END IF;
    group_id := m.group_id;
    SELECT * INTO kept FROM round_group_sum s
     WHERE s.project_id = c.project_id AND s.version = p_version AND s.group_id = m.group_id;
    IF c.state <> 'averaging' AND NOT (c.state = 'committed' AND kept.sum_sha256 IS NOT NULL) THEN
        status := 409;
        body := api_error('conflict', format('round %s is %s, not averaging', p_version, c.state));
        RETURN;
    END IF;
    v_n := jsonb_array_length(p_included);
    SELECT count(*), coalesce(sum(g.samples), 0) INTO v_in, v_sum
      FROM round_member g
     WHERE g.project_id = c.project_id AND g.version = p_version AND g.group_id = m.group_id
       AND g.host_id IN (SELECT (e #>> '{}')::bigint FROM jsonb_array_elements(p_included) e);
    IF v_in <> v_n THEN
        SELECT (e #>> '{}')::bigint INTO v_bad FROM jsonb_array_elements(p_included) e
         WHERE (e #>> '{}')::bigint NOT IN (
                   SELECT g.host_id FROM round_member g
                    WHERE g.project_id = c.project_id AND g.version = p_version
                      AND g.group_id = m.group_id)
         LIMIT 1;
        status := 400;
        body := api_error('invalid',
            format('host %s is not a member of group %s of round %s', v_bad, m.group_id, p_version),
            'List only members of your group (the plan''s "members"), in ascending order.');
        RETURN;
    END IF;
    IF NOT p_included @> to_jsonb(p_host) THEN
        status := 400;
        body := api_error('invalid', format('host %s uploads a sum that does not include itself', p_host),
                          'Upload only a sum that holds your own contribution.');
        RETURN;
    END IF;
    IF p_samples <> v_sum THEN
        status := 400;
        body := api_error('invalid',
            format('the sum is over %s samples, the plan gives the included hosts %s', p_samples, v_sum),
            'Send the sum of the plan''s "samples" of the included hosts.');
        RETURN;
    END IF;
    IF kept.sum_sha256 IS NOT NULL AND kept.included <> p_included THEN
        status := 409;
        body := api_error('conflict',
            format('group %s of round %s already has a sum over other hosts', m.group_id, p_version),
            'Every member of a group must upload the same sum; this one was not kept.');
        RETURN;
    END IF;
    SELECT r.param_count INTO param_count FROM round r
     WHERE r.project_id = c.project_id AND r.version = p_version;
END
$$;

-- Keep a group's sum (stored in the file store as p_sha) unless attempt
-- p_attempt is over (409) or the group kept one already (the same bytes and
-- hosts: 200, others: 409).  Marks the group's members included or not.
-- Answers (status, body, compute): compute is true when every group of the
-- plan has a kept sum and the mean is not computed yet; then "sums" lists
-- them [{"group", "sha256", "samples"}, ...] in ascending group order, with
-- checkpoint v's name and the project's config, for the caller to compute
-- the mean and v+1 and record them with round_mean_store.
CREATE FUNCTION round_group_sum_store(p_project bigint, p_version integer, p_attempt integer,
                                      p_group integer, p_host bigint, p_samples bigint,
                                      p_included jsonb, p_sha text,
                                      OUT status integer, OUT body text, OUT compute boolean,
                                      OUT sums text, OUT checkpoint_sha256 text, OUT config text)
LANGUAGE plpgsql AS $$
DECLARE
    ro   record;
    kept record;
    v_in bigint;
BEGIN
    compute := false;
    SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
       FOR UPDATE;
    SELECT * INTO kept FROM round_group_sum s
     WHERE s.project_id = p_project AND s.version = p_version AND s.group_id = p_group;
    IF FOUND AND ro.attempt = p_attempt THEN
        IF kept.sum_sha256 <> p_sha OR kept.included <> p_included THEN
            status := 409;
            body := api_error('conflict',
                format('group %s of round %s already has a different sum (sha256 %s)', p_group,
                       p_version, kept.sum_sha256),
                'Every member of a group must hold the same sum after the all-reduce.');
            RETURN;
        END IF;
    ELSIF ro.state <> 'averaging' OR ro.attempt <> p_attempt THEN
        status := 409;
        body := api_error('conflict', format('round %s is no longer averaging this attempt', p_version));
        RETURN;
    ELSE
        INSERT INTO round_group_sum (project_id, version, group_id, host_id, samples, included,
                                     sum_sha256)
        VALUES (p_project, p_version, p_group, p_host, p_samples, p_included, p_sha);
        UPDATE round_member rm
           SET included = p_included @> to_jsonb(rm.host_id)
         WHERE rm.project_id = p_project AND rm.version = p_version AND rm.group_id = p_group;
    END IF;
    status := 200;
    body := round_group_sum_body(p_project, p_version, p_group);
    SELECT count(*) INTO v_in FROM round_group_sum s
     WHERE s.project_id = p_project AND s.version = p_version;
    IF ro.state = 'averaging' AND ro.gradient_sha256 IS NULL AND v_in = ro.n_groups THEN
        compute := true;
        sums := (SELECT jsonb_agg(jsonb_build_object('group', s.group_id, 'sha256', s.sum_sha256,
                                                     'samples', s.samples) ORDER BY s.group_id)
                   FROM round_group_sum s
                  WHERE s.project_id = p_project AND s.version = p_version)::text;
        SELECT mv.checkpoint_sha256 INTO checkpoint_sha256 FROM model_version mv
         WHERE mv.project_id = p_project AND mv.version = p_version;
        SELECT p.config::text INTO config FROM project p WHERE p.id = p_project;
    END IF;
END
$$;

-- Record the round's mean gradient (p_gradient, over p_total samples) and
-- the server's v+1 (checkpoint p_checkpoint of p_size bytes, parameters
-- hashing to p_params) unless attempt p_attempt is over or the mean was
-- recorded already (then nothing changes); drop the work units of the hosts
-- no group included; commit when every included peer already reported
-- (round_try_commit).  Returns the group sum answer for group p_group.
CREATE FUNCTION round_mean_store(p_project bigint, p_version integer, p_attempt integer,
                                 p_group integer, p_gradient text, p_total bigint,
                                 p_checkpoint text, p_size bigint, p_params text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    ro record;
BEGIN
    SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
       FOR UPDATE;
    IF ro.state = 'averaging' AND ro.attempt = p_attempt AND ro.gradient_sha256 IS NULL THEN
        INSERT INTO file (sha256, size, kind) VALUES (p_checkpoint, p_size, 'checkpoint')
        ON CONFLICT DO NOTHING;
        UPDATE round SET gradient_sha256 = p_gradient, gradient_samples = p_total,
                         checkpoint_sha256 = p_checkpoint, params_sha256 = p_params
         WHERE project_id = p_project AND version = p_version;
        PERFORM round_drop_excluded(p_project, p_version);
        PERFORM round_try_commit(p_project, p_version);
    END IF;
    RETURN round_group_sum_body(p_project, p_version, p_group);
END
$$;

-- The rounds of project p_project, newest first: at most p_limit, of
-- versions below p_before (NULL: all).  404 for an unknown project.
-- "samples" counts what the round holds: the mean's samples once it
-- exists, the plan's while averaging, the accumulated ones while open or
-- closing; "n_peers" likewise the included hosts, the plan's peers, or the
-- hosts holding work of the version.
CREATE FUNCTION round_list(p_project text, p_limit integer, p_before integer)
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
                   'target_batch', p.target_batch,
                   'samples', CASE
                        WHEN r.gradient_samples IS NOT NULL THEN r.gradient_samples
                        WHEN r.state IN ('open', 'closing')
                            THEN sched_accumulated(p.id, r.version, p.microbatch_size)
                        ELSE r.samples END,
                   'loss', r.loss,
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
