-- cotrain schema, version 4: the server's own optimizer step (doc/api.md,
-- "The server's step").  One peer of the plan uploads the round's averaged
-- gradient (raw fp32, the mean over the round's samples); the server loads
-- checkpoint v, applies the project's optimizer step, stores checkpoint v+1
-- (kind 'checkpoint') and the sha256 of its raw parameter buffer in
-- round.params_sha256.  The round commits only once that exists and every
-- peer of the plan reported ok; model_version v+1 gets the checkpoint.
-- Peers whose hash differs from the server's are not accepted
-- (round_member.accepted false): they must reload checkpoint v+1.  The
-- gradient itself is kept in the file store as a transient file, not indexed
-- in `file` (garbage once the round is over).

ALTER TABLE round ADD COLUMN gradient_sha256 text CHECK (gradient_sha256 ~ '^[0-9a-f]{64}$'),
                  ADD COLUMN checkpoint_sha256 text REFERENCES file(sha256);
ALTER TABLE round_member ADD COLUMN accepted boolean;

-- As in 0003, plus: the server's step of the failed attempt is forgotten.
CREATE OR REPLACE FUNCTION round_fail(p_project bigint, p_version integer, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM round WHERE project_id = p_project AND version = p_version FOR UPDATE;
    DELETE FROM round_report WHERE project_id = p_project AND version = p_version;
    PERFORM round_drop_units(p_project, p_version, false);
    DELETE FROM round_member WHERE project_id = p_project AND version = p_version;
    UPDATE round SET state = 'open', attempt = attempt + 1, last_failure = p_reason,
                     close_reason = NULL, samples = NULL, n_groups = NULL, param_count = NULL,
                     plan_deadline = NULL, params_sha256 = NULL, closed_at = NULL,
                     planned_at = NULL, opened_at = now(),
                     gradient_sha256 = NULL, checkpoint_sha256 = NULL
     WHERE project_id = p_project AND version = p_version;
END
$$;

-- Commit round p_version when it is averaging, the server's v+1 exists and
-- every peer of the plan reported ok: each peer is marked accepted when its
-- hash equals the server's; with none accepted the round fails (the
-- uploaded gradient matches nobody's parameters).  Otherwise nothing.
-- The caller holds the round's row lock.
CREATE FUNCTION round_try_commit(p_project bigint, p_version integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ro     record;
    v_left bigint;
    v_ok   bigint;
BEGIN
    SELECT state, params_sha256, checkpoint_sha256 INTO ro FROM round
     WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR ro.state <> 'averaging' OR ro.checkpoint_sha256 IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) FILTER (WHERE outcome IS DISTINCT FROM 'ok'),
           count(*) FILTER (WHERE params_sha256 = ro.params_sha256)
      INTO v_left, v_ok
      FROM round_member WHERE project_id = p_project AND version = p_version;
    IF v_left > 0 THEN
        RETURN;
    END IF;
    IF v_ok = 0 THEN
        PERFORM round_fail(p_project, p_version,
                           'no peer holds the parameters computed from the uploaded gradient');
        RETURN;
    END IF;
    UPDATE round_member SET accepted = (params_sha256 = ro.params_sha256)
     WHERE project_id = p_project AND version = p_version;
    UPDATE round SET state = 'committed', committed_at = now()
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

-- The answer to a peer's outcome: its status, the round's state, and, once
-- the server computed v+1, "accepted" (its hash equals the server's) and the
-- server's "params_sha256"; a peer not accepted gets "reload" (checkpoint
-- v+1 to load instead of its own parameters).
CREATE FUNCTION round_outcome_body(p_project bigint, p_version integer, p_host bigint)
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
    IF m.outcome = 'ok' AND ro.params_sha256 IS NOT NULL THEN
        b := b || jsonb_build_object('params_sha256', ro.params_sha256,
                                     'accepted', m.params_sha256 = ro.params_sha256);
        IF m.params_sha256 <> ro.params_sha256 THEN
            b := b || jsonb_build_object('reload', jsonb_build_object(
                'version', p_version + 1, 'checkpoint_sha256', ro.checkpoint_sha256,
                'url', '/files/' || ro.checkpoint_sha256));
        END IF;
    END IF;
    RETURN b::text;
END
$$;

-- A peer's outcome of averaging, as in 0003 except when the round commits:
-- no longer on the peers' agreement alone but in round_try_commit, once the
-- server's own v+1 exists; differing hashes no longer fail the round.
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
    IF c.state <> 'averaging' THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s is %s, not averaging', p_version, c.state));
        RETURN;
    END IF;
    UPDATE round_member SET outcome = p_status, included_hosts = p_included,
                            params_sha256 = p_sha256, outcome_at = now()
     WHERE project_id = c.project_id AND version = p_version AND host_id = p_host;
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

-- Before the server's step: may host p_host upload the gradient of round
-- p_version with p_samples samples?  status NULL when it may, with the
-- round's attempt, param_count, the gradient already stored (or NULL),
-- checkpoint v's name and the project's config; else the answer.  Refused:
-- 401/403/404 as round_lookup, 409 when the host is not in the plan, the
-- round is not averaging or version v has no checkpoint, 400 when p_samples
-- is not the plan's total.
CREATE FUNCTION round_gradient_begin(p_token_hash bytea, p_project text, p_version integer,
                                     p_host bigint, p_samples bigint,
                                     OUT status integer, OUT body text, OUT project_id bigint,
                                     OUT attempt integer, OUT param_count bigint,
                                     OUT gradient_sha256 text, OUT checkpoint_sha256 text,
                                     OUT config text)
LANGUAGE plpgsql AS $$
DECLARE
    c  record;
    ro record;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host);
    IF c.status IS NOT NULL THEN
        status := c.status;
        body := c.body;
        RETURN;
    END IF;
    project_id := c.project_id;
    attempt := c.attempt;
    config := c.config::text;
    PERFORM 1 FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT FOUND THEN
        status := 409;
        body := api_error('conflict',
            format('host %s is not in the plan of round %s', p_host, p_version),
            'Only a peer of the round''s plan may upload its gradient.');
        RETURN;
    END IF;
    SELECT * INTO ro FROM round r WHERE r.project_id = c.project_id AND r.version = p_version;
    IF ro.state <> 'averaging' THEN
        status := 409;
        body := api_error('conflict', format('round %s is %s, not averaging', p_version, ro.state));
        RETURN;
    END IF;
    IF p_samples <> ro.samples THEN
        status := 400;
        body := api_error('invalid',
            format('the gradient is over %s samples, the round''s plan has %s', p_samples, ro.samples),
            'Upload the mean over every sample of the round (round_samples in the plan).');
        RETURN;
    END IF;
    param_count := ro.param_count;
    gradient_sha256 := ro.gradient_sha256;
    SELECT mv.checkpoint_sha256 INTO checkpoint_sha256 FROM model_version mv
     WHERE mv.project_id = c.project_id AND mv.version = p_version;
    IF checkpoint_sha256 IS NULL THEN
        status := 409;
        body := api_error('conflict', format('version %s has no checkpoint', p_version));
    END IF;
END
$$;

-- The answer to a gradient upload.
CREATE FUNCTION round_gradient_body(p_project bigint, p_version integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('version', p_version, 'gradient_sha256', r.gradient_sha256,
        'params_sha256', r.params_sha256, 'checkpoint_sha256', r.checkpoint_sha256,
        'round', jsonb_build_object('state', r.state, 'version', p_version,
                                    'attempt', r.attempt))::text
      FROM round r WHERE r.project_id = p_project AND r.version = p_version;
$$;

-- After the server's step: record it (the gradient's name, checkpoint v+1,
-- the hash of its parameters) unless attempt p_attempt of the round is over
-- (409) or another gradient was stored first (the same bytes: 200; others:
-- 409); then commit when every peer already reported (round_try_commit).
CREATE FUNCTION round_gradient_store(p_project bigint, p_version integer, p_attempt integer,
                                     p_gradient text, p_checkpoint text, p_size bigint,
                                     p_params text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    ro record;
BEGIN
    SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
       FOR UPDATE;
    IF ro.gradient_sha256 IS NOT NULL AND ro.attempt = p_attempt THEN
        IF ro.gradient_sha256 = p_gradient THEN
            RETURN QUERY SELECT 200, round_gradient_body(p_project, p_version);
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('round %s already has a different gradient (sha256 %s)', p_version,
                       ro.gradient_sha256),
                'Every peer must hold the same averaged gradient; reload checkpoint v+1 once the round commits.');
        END IF;
        RETURN;
    END IF;
    IF ro.state <> 'averaging' OR ro.attempt <> p_attempt THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s is no longer averaging this attempt', p_version));
        RETURN;
    END IF;
    INSERT INTO file (sha256, size, kind) VALUES (p_checkpoint, p_size, 'checkpoint')
    ON CONFLICT DO NOTHING;
    UPDATE round SET gradient_sha256 = p_gradient, checkpoint_sha256 = p_checkpoint,
                     params_sha256 = p_params
     WHERE project_id = p_project AND version = p_version;
    PERFORM round_try_commit(p_project, p_version);
    RETURN QUERY SELECT 200, round_gradient_body(p_project, p_version);
END
$$;
