-- cotrain functions: averaging across groups and the server's step
-- (doc/api.md, "Rounds", "The server's step").
--
-- Every group of the plan averages on its own; each member that finished
-- the group's all-reduce uploads the group's gradient SUM with the hosts it
-- holds ("included", ascending host ids) and their samples.  The first valid
-- upload per group is kept (round_group_sum, the bytes in the file store).
-- When every group has a kept sum, the server computes the round's mean
-- gradient (sum of the group sums in ascending group order, in double,
-- divided by the total of their samples, rounded once to fp32), drops the
-- work units of every plan host that no group included (their ranges go back
-- to the pool), and takes its own optimizer step to v+1.  The round commits
-- once v+1 exists and every included host reported ok (round_try_commit);
-- hosts no group included are ignored (their outcome answers accepted: false
-- and reload).

-- The answer to a peer's outcome: its status and the round's state; once
-- the server computed v+1, its "params_sha256" and whether the peer is
-- "accepted" (it is included and its hash equals the server's; a peer no
-- group included never is).  A peer not accepted gets "reload" (checkpoint
-- v+1 to load instead of its own parameters); an accepted one gets
-- "checkpoint_sha256", the checkpoint its parameters are (a later attempt of
-- the round may commit another v+1, so the client compares it with the
-- checkpoint of its next work unit: client/daemon.c).
CREATE OR REPLACE FUNCTION round_outcome_body(p_project bigint, p_version integer, p_host bigint)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    ro record;
    m  record;
    b  jsonb;
    v_uploader bigint;
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
    ELSIF ro.checkpoint_sha256 IS NOT NULL AND b->'accepted' = 'true'::jsonb THEN
        b := b || jsonb_build_object('checkpoint_sha256', ro.checkpoint_sha256);
    END IF;
    -- Once committed, an included peer gets the second seed, drawn at the
    -- commit (round_sketch_seed2.sql): what it sketches what it kept under.
    IF ro.state = 'committed' AND ro.seed2 IS NOT NULL AND m.included THEN
        b := b || jsonb_build_object('seed2', ro.seed2::text);
    END IF;
    -- Across groups between the peers, v+1 comes from a peer
    -- (round_cross.sql): this one is to upload it.
    IF ro.cross_peers THEN
        v_uploader := round_checkpoint_uploader(p_project, p_version);
    END IF;
    IF ro.cross_peers AND m.outcome = 'ok' AND v_uploader = p_host THEN
        b := b || jsonb_build_object('checkpoint_upload', true);
    END IF;
    IF ro.cross_peers AND v_uploader IS NOT NULL THEN
        -- the server wakes that host's long poll (server/api_rounds.c)
        b := b || jsonb_build_object('checkpoint_uploader', v_uploader);
    END IF;
    RETURN b::text;
END
$$;

-- A held outcome poll's later look (server/api_rounds.c): the answer to the
-- outcome host p_host already posted for round p_version, read only (no
-- lock taken, nothing written: a thousand held polls look again at each
-- wake-up, and reposting took the round's row lock and rewrote the links
-- each time).  401/403/404 as round_lookup; 409 when the round holds no
-- outcome of the host (a rerun planned it again, or not).
CREATE OR REPLACE FUNCTION round_outcome_look(p_token_hash bytea, p_project text, p_version integer,
                                   p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host, false);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM round_member rm
                    WHERE rm.project_id = c.project_id AND rm.version = p_version
                      AND rm.host_id = p_host AND rm.outcome IS NOT NULL) THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s is %s (attempt %s) and holds no outcome of host %s',
                   p_version, c.state, c.attempt, p_host),
            'Drop the gradients of this version and ask for new work.');
        RETURN;
    END IF;
    RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
END
$$;

-- A peer's outcome of averaging ('ok', 'failed', or 'dropped': its group
-- left it out, and it reports the sketches of the range it aggregated,
-- which round_sketch_verify needs).  The round commits in round_try_commit,
-- once the server's own v+1 exists and every included peer said ok: after
-- this transaction, through round_outcome_settle (the server calls it next),
-- or where v+1 is stored.  Peers whose hash differs are not accepted, and do
-- not fail the round.  A peer that its group's kept sum does not include is
-- ignored (its outcome is stored and answered, never fails or holds up the
-- round, in 'averaging' or 'committed'); a 'failed' from any other peer
-- fails the round (round_fail), but for a pure sender's (it aggregates
-- nothing: lo = hi) before its group's sum is kept: its aggregators may
-- have dropped it and averaged on without it, so its failure waits for the
-- sum, which fails the round only when it includes the sender
-- (round_group_failed_member, from round_group_sum_store or, across groups
-- between the peers, round_group_sum_settle; a sum that never comes fails
-- the round at its averaging deadline).  An aggregator's failure fails its
-- group's all-reduce, so it fails the round at once.  The same outcome
-- again answers the same; a different one is 409.
--
-- An 'ok' or 'dropped' takes the round's row FOR SHARE, not FOR UPDATE: the
-- thousand outcomes of a round at 1,000 hosts write only their own member
-- rows and run side by side, where each used to hold the row while the
-- next queued (with the commit check and the answer, 1 to 2 ms each: two
-- seconds of outcomes in single file, and the groups' mean hashes behind
-- them).  The share still keeps out what changes the round (a failure, a
-- group's kept sum setting "included", the commit), which takes it FOR
-- UPDATE.  A 'failed' fails the round, so it takes FOR UPDATE from the
-- start (two outcomes raising a share lock each would deadlock).
DROP FUNCTION IF EXISTS round_outcome(bytea, text, integer, bigint, text, jsonb, text);
CREATE OR REPLACE FUNCTION round_outcome(p_token_hash bytea, p_project text, p_version integer,
                              p_host bigint, p_status text, p_included jsonb, p_sha256 text,
                              p_moments text DEFAULT NULL)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c       record;
    m       record;
    v_state text;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host, false);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    IF p_status = 'failed' THEN
        SELECT ro.state INTO v_state FROM round ro
         WHERE ro.project_id = c.project_id AND ro.version = p_version FOR UPDATE;
    ELSE
        SELECT ro.state INTO v_state FROM round ro
         WHERE ro.project_id = c.project_id AND ro.version = p_version FOR SHARE;
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
           AND m.included_hosts = p_included
           AND (p_moments IS NULL OR m.moments_sha256 IS NOT DISTINCT FROM p_moments) THEN
            RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('host %s already reported a different outcome for round %s', p_host, p_version));
        END IF;
        RETURN;
    END IF;
    IF v_state <> 'averaging' AND NOT (v_state = 'committed' AND m.included IS FALSE) THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s is %s, not averaging', p_version, v_state));
        RETURN;
    END IF;
    UPDATE round_member SET outcome = p_status, included_hosts = p_included,
                            params_sha256 = p_sha256, moments_sha256 = p_moments, outcome_at = now()
     WHERE project_id = c.project_id AND version = p_version AND host_id = p_host;
    -- 'dropped': its group left it out (or will: the group sum is
    -- authoritative; an included host that says dropped never says ok, and
    -- the round runs out its deadline).  Its sketches may be what a commit
    -- waits for (round_outcome_settle).
    IF p_status = 'dropped' OR m.included IS FALSE
       OR (p_status = 'failed' AND m.included IS NULL AND m.lo = m.hi) THEN
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
    RETURN QUERY SELECT 200, round_outcome_body(c.project_id, p_version, p_host);
END
$$;

-- After an 'ok' or 'dropped' outcome's transaction (round_outcome): commit
-- the round when that outcome was the last one it waited for
-- (round_try_commit, under the round's row FOR UPDATE).  Most outcomes are
-- not the last, and a look without a lock tells them so.  It runs after
-- the outcome committed, so of the last outcomes arriving together, the
-- last to commit sees them all: none is missed (inside the outcome's
-- transaction each saw the others' still uncommitted and none would
-- commit).  When this call moved the round (committed it, or failed it: the
-- check of the averaged bytes, no majority across peers), one row: host
-- p_host's answer as the round is now (200, round_outcome_body); else no
-- row, and the outcome's own answer stands.
CREATE OR REPLACE FUNCTION round_outcome_settle(p_project text, p_version integer, p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_project bigint;
    v_state   text;
BEGIN
    SELECT p.id INTO v_project FROM project p WHERE p.name = p_project;
    SELECT ro.state INTO v_state FROM round ro WHERE ro.project_id = v_project AND ro.version = p_version;
    IF v_state IS DISTINCT FROM 'averaging'
       OR EXISTS (SELECT 1 FROM round_member rm
                   WHERE rm.project_id = v_project AND rm.version = p_version AND rm.included
                     AND rm.outcome IS DISTINCT FROM 'ok') THEN
        RETURN;
    END IF;
    SELECT ro.state INTO v_state FROM round ro
     WHERE ro.project_id = v_project AND ro.version = p_version FOR UPDATE;
    IF v_state <> 'averaging' THEN
        RETURN;
    END IF;
    PERFORM round_try_commit(v_project, p_version);
    SELECT ro.state INTO v_state FROM round ro WHERE ro.project_id = v_project AND ro.version = p_version;
    IF v_state <> 'averaging' THEN
        RETURN QUERY SELECT 200, round_outcome_body(v_project, p_version, p_host);
    END IF;
END
$$;

-- The lowest host id of group p_group of round p_version that its kept sum
-- includes and that reported 'failed' (a pure sender whose failure waited
-- for the sum, round_outcome), or NULL.
CREATE OR REPLACE FUNCTION round_group_failed_member(p_project bigint, p_version integer, p_group integer)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT min(rm.host_id) FROM round_member rm
     WHERE rm.project_id = p_project AND rm.version = p_version AND rm.group_id = p_group
       AND rm.included AND rm.outcome = 'failed'
$$;

-- The answer to a group sum upload.
CREATE OR REPLACE FUNCTION round_group_sum_body(p_project bigint, p_version integer, p_group integer)
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
-- planned samples.  p_hash_only: the post of a round averaging across
-- groups between the peers (the mean's hash, round_cross.sql); each kind
-- is refused (409) for the other kind of round.
DROP FUNCTION IF EXISTS round_group_sum_begin(bytea, text, integer, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION round_group_sum_begin(p_token_hash bytea, p_project text, p_version integer,
                                      p_host bigint, p_samples bigint, p_included jsonb,
                                      p_hash_only boolean DEFAULT false,
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
    -- Checks only (round_group_sum_store checks the state and attempt again
    -- under the round's lock): no lock here, so that a group's members do
    -- not queue behind each other and the round's writers twice.
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host, false);
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
    IF (SELECT r.cross_peers FROM round r WHERE r.project_id = c.project_id AND r.version = p_version)
       IS DISTINCT FROM p_hash_only THEN
        status := 409;
        body := CASE WHEN p_hash_only
            THEN api_error('conflict', format('round %s averages across groups through the server', p_version),
                           'Upload the group''s sum (group_sum) instead.')
            ELSE api_error('conflict', format('round %s averages across groups between the peers', p_version),
                           'Post the hash of the round''s mean (mean_hash); the server takes no gradient.') END;
        RETURN;
    END IF;
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
--
-- Across groups between the peers (a mean's hash, not a sum) the round's
-- row is taken FOR SHARE: the hundred groups of a round at 1,000 hosts keep
-- their hashes side by side, where each first post of a group held the row
-- while the next queued (mean hashes of up to 1.5 s at the end of a burst,
-- doc/scale.md "Runs O").  Two members of one group meet at the group's
-- row instead (the primary key).  The last group's agreement is then
-- round_group_sum_settle's, after this transaction.
CREATE OR REPLACE FUNCTION round_group_sum_store(p_project bigint, p_version integer, p_attempt integer,
                                      p_group integer, p_host bigint, p_samples bigint,
                                      p_included jsonb, p_sha text,
                                      OUT status integer, OUT body text, OUT compute boolean,
                                      OUT sums text, OUT checkpoint_sha256 text, OUT config text)
LANGUAGE plpgsql AS $$
DECLARE
    ro       record;
    kept     record;
    v_in     bigint;
    v_cross  boolean;
    v_failed bigint;
BEGIN
    compute := false;
    -- A member after the first of its group posts what the group kept (the
    -- same bytes, the same hosts) while other groups' are still to come, or
    -- after the mean is settled: nothing to write or to start, and no lock
    -- to queue for behind the round's other writers (a thousand members
    -- post within a second).  Read in one statement, so that the kept sum
    -- and the attempt are of one moment (a rerun deletes the sums as it
    -- moves the attempt on).  Else, below, under the lock: the first of a
    -- group keeps its sum, and the last group's completes the round's mean.
    IF EXISTS (SELECT 1 FROM round r JOIN round_group_sum s USING (project_id, version)
                WHERE r.project_id = p_project AND r.version = p_version AND s.group_id = p_group
                  AND r.attempt = p_attempt AND s.sum_sha256 = p_sha AND s.included = p_included
                  AND (r.gradient_sha256 IS NOT NULL OR r.state <> 'averaging'
                       OR (SELECT count(*) FROM round_group_sum g
                            WHERE g.project_id = p_project AND g.version = p_version) < r.n_groups))
    THEN
        status := 200;
        body := round_group_sum_body(p_project, p_version, p_group);
        RETURN;
    END IF;
    -- (whether a round averages across peers is fixed at its plan)
    SELECT r.cross_peers INTO v_cross FROM round r WHERE r.project_id = p_project AND r.version = p_version;
    IF v_cross THEN
        SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
           FOR SHARE;
    ELSE
        SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
           FOR UPDATE;
    END IF;
    -- The first of a group keeps its sum; a member of the group who kept
    -- one first (also just now, under a share lock) is met at the group's
    -- row, and this one is then compared with it.
    IF ro.state = 'averaging' AND ro.attempt = p_attempt THEN
        INSERT INTO round_group_sum (project_id, version, group_id, host_id, samples, included,
                                     sum_sha256)
        VALUES (p_project, p_version, p_group, p_host, p_samples, p_included, p_sha)
        ON CONFLICT (project_id, version, group_id) DO NOTHING;
        IF FOUND THEN
            UPDATE round_member rm
               SET included = p_included @> to_jsonb(rm.host_id)
             WHERE rm.project_id = p_project AND rm.version = p_version AND rm.group_id = p_group;
            -- A pure sender that said 'failed' before the sum and that the
            -- sum includes fails the round (round_outcome); across groups
            -- between the peers the row is only shared here:
            -- round_group_sum_settle does it.
            IF NOT v_cross THEN
                v_failed := round_group_failed_member(p_project, p_version, p_group);
            END IF;
            IF v_failed IS NOT NULL THEN
                PERFORM round_fail(p_project, p_version, format('host %s failed to average', v_failed));
                status := 409;
                body := api_error('conflict', format('round %s failed: host %s of group %s failed to average',
                                                     p_version, v_failed, p_group),
                                  'Drop the gradients of this version and ask for new work.');
                RETURN;
            END IF;
        END IF;
    END IF;
    SELECT * INTO kept FROM round_group_sum s
     WHERE s.project_id = p_project AND s.version = p_version AND s.group_id = p_group;
    IF NOT FOUND OR ro.attempt <> p_attempt THEN
        status := 409;
        body := api_error('conflict', format('round %s is no longer averaging this attempt', p_version));
        RETURN;
    END IF;
    IF kept.sum_sha256 <> p_sha OR kept.included <> p_included THEN
        status := 409;
        body := api_error('conflict',
            format('group %s of round %s already has a different sum (sha256 %s)', p_group,
                   p_version, kept.sum_sha256),
            'Every member of a group must hold the same sum after the all-reduce.');
        RETURN;
    END IF;
    status := 200;
    body := round_group_sum_body(p_project, p_version, p_group);
    IF v_cross THEN
        RETURN; -- the agreement: round_group_sum_settle
    END IF;
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

-- After a mean's hash was kept (round_group_sum_store, across groups
-- between the peers): a pure sender of the group that said 'failed' and
-- that the hash's set includes fails the round (round_outcome); else, once
-- every group of the plan has one, their hashes must agree
-- (round_mean_agree, under the round's row FOR UPDATE).  A look
-- without a lock first: most groups are not the last.  It runs after the
-- store committed, so of the last groups arriving together, the last to
-- commit sees them all.  The group's answer again when this call moved the
-- round (the mean agreed, or the round failed), else NULL.
CREATE OR REPLACE FUNCTION round_group_sum_settle(p_project bigint, p_version integer, p_group integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    ro       record;
    v_failed bigint;
BEGIN
    SELECT r.state, r.gradient_sha256, r.n_groups, r.cross_peers INTO ro FROM round r
     WHERE r.project_id = p_project AND r.version = p_version;
    IF FOUND AND ro.cross_peers AND ro.state = 'averaging'
       AND round_group_failed_member(p_project, p_version, p_group) IS NOT NULL THEN
        SELECT r.state INTO ro FROM round r
         WHERE r.project_id = p_project AND r.version = p_version FOR UPDATE;
        v_failed := round_group_failed_member(p_project, p_version, p_group);
        IF ro.state = 'averaging' AND v_failed IS NOT NULL THEN
            PERFORM round_fail(p_project, p_version, format('host %s failed to average', v_failed));
            RETURN round_group_sum_body(p_project, p_version, p_group);
        END IF;
        RETURN NULL;
    END IF;
    IF NOT FOUND OR NOT ro.cross_peers OR ro.state <> 'averaging' OR ro.gradient_sha256 IS NOT NULL
       OR (SELECT count(*) FROM round_group_sum s
            WHERE s.project_id = p_project AND s.version = p_version) < ro.n_groups THEN
        RETURN NULL;
    END IF;
    SELECT r.state, r.gradient_sha256, r.n_groups INTO ro FROM round r
     WHERE r.project_id = p_project AND r.version = p_version FOR UPDATE;
    IF ro.state <> 'averaging' OR ro.gradient_sha256 IS NOT NULL
       OR (SELECT count(*) FROM round_group_sum s
            WHERE s.project_id = p_project AND s.version = p_version) < ro.n_groups THEN
        RETURN NULL;
    END IF;
    PERFORM round_mean_agree(p_project, p_version);
    RETURN round_group_sum_body(p_project, p_version, p_group);
END
$$;

-- Record the round's mean gradient (p_gradient, over p_total samples) and
-- the server's v+1 (checkpoint p_checkpoint of p_size bytes, parameters
-- hashing to p_params) unless attempt p_attempt is over or the mean was
-- recorded already (then nothing changes); drop the work units of the hosts
-- no group included; commit when every included peer already reported
-- (round_try_commit).  Returns the group sum answer for group p_group.
CREATE OR REPLACE FUNCTION round_mean_store(p_project bigint, p_version integer, p_attempt integer,
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
