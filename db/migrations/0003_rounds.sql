-- cotrain schema, version 3: training rounds.  A round trains version v of a
-- project into v+1 (doc/api.md, "Rounds"):
--
--   open       work units of v go out; heartbeats add up the samples
--   closing    the target was reached (or the stragglers are not worth
--              waiting for): no new work for v; every host holding gradients
--              for v reports the exact count of each of its work units and the
--              unprocessed rest goes back to the pool
--   averaging  the plan exists (groups, shares); peers average and report
--              their outcome
--   committed  every peer reported ok with the same parameters hash:
--              project.current_version = v + 1, round v + 1 is open
--
-- A round that fails (a peer reports failure, the hashes differ, the
-- averaging deadline passes, nobody reports) returns every range of its work
-- units to the pool and is open again, as its next attempt, in the same
-- transaction: no sample is lost and none is counted twice; the reason is
-- kept in last_failure.
--
-- Like 0002, the hot paths are PL/pgSQL functions answering (status, body).
-- The scheduler's functions of 0002 keep their names and signatures: they
-- are renamed *_v2 and wrapped here, so the server's statements do not
-- change.

CREATE TABLE round (
    project_id    bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version       integer NOT NULL CHECK (version >= 0),
    state         text NOT NULL DEFAULT 'open'
                  CHECK (state IN ('open', 'closing', 'averaging', 'committed')),
    attempt       integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    close_reason  text CHECK (close_reason IN ('target', 'stragglers')),
    samples       bigint,           -- exact samples of the plan's peers
    n_groups      integer,
    param_count   bigint,
    plan_deadline timestamptz,      -- outcomes are due by then
    params_sha256 text CHECK (params_sha256 ~ '^[0-9a-f]{64}$'),
    last_failure  text,
    opened_at     timestamptz NOT NULL DEFAULT now(),
    closed_at     timestamptz,
    planned_at    timestamptz,
    committed_at  timestamptz,
    PRIMARY KEY (project_id, version)
);
CREATE INDEX round_busy_idx ON round (state) WHERE state IN ('open', 'closing', 'averaging');

INSERT INTO round (project_id, version) SELECT id, current_version FROM project;

CREATE FUNCTION round_project_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO round (project_id, version) VALUES (NEW.id, NEW.current_version)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER project_round_ins AFTER INSERT ON project
    FOR EACH ROW EXECUTE FUNCTION round_project_insert();

-- One report per work unit, sent once the round is closing.
CREATE TABLE round_report (
    work_unit_id  bigint PRIMARY KEY REFERENCES work_unit(id) ON DELETE CASCADE,
    project_id    bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version       integer NOT NULL,
    host_id       bigint NOT NULL REFERENCES host(id),
    mb_done       bigint NOT NULL CHECK (mb_done >= 0),
    samples       bigint NOT NULL CHECK (samples >= 0),
    endpoint      text NOT NULL CHECK (length(endpoint) <= 64),
    bandwidth     double precision NOT NULL CHECK (bandwidth > 0),
    can_aggregate boolean NOT NULL,
    rtt           jsonb NOT NULL DEFAULT '{}',   -- {"<host id>": milliseconds}
    reported_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX round_report_version_idx ON round_report (project_id, version, host_id);

-- The plan: one row per peer (host) of the round, and its outcome.
CREATE TABLE round_member (
    project_id     bigint NOT NULL,
    version        integer NOT NULL,
    host_id        bigint NOT NULL REFERENCES host(id),
    group_id       integer NOT NULL CHECK (group_id >= 0),
    samples        bigint NOT NULL CHECK (samples > 0),
    endpoint       text NOT NULL,
    bandwidth      double precision NOT NULL,
    can_aggregate  boolean NOT NULL,
    lo             bigint NOT NULL CHECK (lo >= 0),     -- elements it aggregates
    hi             bigint NOT NULL CHECK (hi >= lo),
    outcome        text CHECK (outcome IN ('ok', 'failed')),
    included_hosts jsonb,
    params_sha256  text,
    outcome_at     timestamptz,
    PRIMARY KEY (project_id, version, host_id),
    FOREIGN KEY (project_id, version) REFERENCES round (project_id, version) ON DELETE CASCADE
);
CREATE INDEX round_member_group_idx ON round_member (project_id, version, group_id);

-- {"state", "version", "attempt"} of a round that is not open (what a client
-- must know to stop), or NULL while it is open or does not exist.
CREATE FUNCTION round_note(p_project bigint, p_version integer) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT state, attempt INTO r FROM round WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR r.state = 'open' THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('state', r.state, 'version', p_version, 'attempt', r.attempt);
END
$$;

-- After samples were added to version p_version: close its round when they
-- reach the target.  Returns round_note().
CREATE FUNCTION round_progress(p_project bigint, p_version integer, p_accumulated bigint,
                               p_target bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_accumulated >= p_target THEN
        UPDATE round SET state = 'closing', close_reason = 'target', closed_at = now()
         WHERE project_id = p_project AND version = p_version AND state = 'open';
    END IF;
    RETURN round_note(p_project, p_version);
END
$$;

-- Add "round" (when the round is not open) to a scheduler answer.
CREATE FUNCTION round_annotate(p_wu bigint, p_status integer, p_body text)
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

ALTER FUNCTION sched_heartbeat(bytea, bigint, bigint, real) RENAME TO sched_heartbeat_v2;
ALTER FUNCTION sched_handback(bytea, bigint, bigint) RENAME TO sched_handback_v2;
ALTER FUNCTION sched_finish(bytea, bigint) RENAME TO sched_finish_v2;
ALTER FUNCTION sched_assign(bytea, bigint, text, bigint, bigint) RENAME TO sched_assign_v2;

CREATE FUNCTION sched_heartbeat(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_sps real)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM sched_heartbeat_v2(p_token_hash, p_wu, p_mb_done, p_sps);
    RETURN QUERY SELECT * FROM round_annotate(p_wu, r.status, r.body);
END
$$;

CREATE FUNCTION sched_handback(p_token_hash bytea, p_wu bigint, p_mb_done bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM sched_handback_v2(p_token_hash, p_wu, p_mb_done);
    RETURN QUERY SELECT * FROM round_annotate(p_wu, r.status, r.body);
END
$$;

CREATE FUNCTION sched_finish(p_token_hash bytea, p_wu bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM sched_finish_v2(p_token_hash, p_wu);
    RETURN QUERY SELECT * FROM round_annotate(p_wu, r.status, r.body);
END
$$;

-- Work for a round that is not open is refused: 409 with the round's state
-- and a retry_after in seconds.  Peers stay out of the next version until it
-- exists (its parameters are the outcome of this round).
CREATE FUNCTION sched_assign(p_token_hash bytea, p_host_id bigint, p_project text,
                             p_wu_max bigint, p_chunk bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint;
    v      record;
BEGIN
    SELECT h.id INTO v_host
      FROM host h JOIN account a ON a.id = h.account_id
     WHERE h.token_hash = p_token_hash AND NOT h.revoked AND NOT a.disabled;
    IF FOUND AND v_host = p_host_id THEN
        SELECT p.id, p.current_version, r.state, r.attempt INTO v
          FROM project p JOIN round r ON r.project_id = p.id AND r.version = p.current_version
         WHERE p.name = p_project AND p.active;
        IF FOUND AND v.state <> 'open' THEN
            RETURN QUERY SELECT 409, jsonb_build_object(
                'error', jsonb_build_object(
                    'code', 'conflict',
                    'message', format('round %s of project "%s" is %s', v.current_version,
                                      p_project, v.state),
                    'hint', 'Report the work units of this version, then ask for work again once the next version is out.'),
                'round', jsonb_build_object('state', v.state, 'version', v.current_version,
                                            'attempt', v.attempt),
                'retry_after', 10)::text;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM sched_assign_v2(p_token_hash, p_host_id, p_project, p_wu_max, p_chunk);
END
$$;

-- The answer to a report, from its row.
CREATE FUNCTION round_report_answer(p_wu bigint) RETURNS text LANGUAGE plpgsql STABLE AS $$
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
-- done (samples = mb_done * microbatch_size), and what the plan needs of its
-- host (endpoint, bandwidth in bytes/s, whether it accepts connections,
-- round-trip times to other hosts).  A live unit becomes 'returned' and its
-- rest [lo + mb_done, hi) goes back to the pool; a finished one must report
-- all of its range.  The same report again answers the same; a different
-- one is 409.  Holds the round row FOR SHARE, so the plan (which takes it FOR
-- UPDATE) sees every report made before it, and none after.
CREATE FUNCTION round_report(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_samples bigint,
                             p_endpoint text, p_bandwidth double precision,
                             p_can_aggregate boolean, p_rtt jsonb)
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
           AND prev.rtt = p_rtt THEN
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
                                                p_bandwidth, p_can_aggregate, p_rtt);
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
                              endpoint, bandwidth, can_aggregate, rtt)
    VALUES (p_wu, w.project_id, w.version, v_host, p_mb_done, p_samples,
            p_endpoint, p_bandwidth, p_can_aggregate, p_rtt);
    RETURN QUERY SELECT 200, round_report_answer(p_wu);
END
$$;

-- Give up every work unit of version p_version that is not counted: return
-- its range to the pool (all of it for a live unit, the finished part
-- otherwise, the rest being there already), set mb_done to 0 (so the
-- version's progress forgets its samples) and mark it expired.  A unit
-- counts when p_keep_reported and it was reported, or finished by a host
-- that reported another.  Returns how many were dropped.
CREATE FUNCTION round_drop_units(p_project bigint, p_version integer, p_keep_reported boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH reporters AS (
        SELECT DISTINCT host_id FROM round_report
         WHERE project_id = p_project AND version = p_version
    ), doomed AS (
        SELECT w.id FROM work_unit w
         WHERE w.project_id = p_project AND w.version = p_version
           AND (w.mb_done > 0 OR w.state = 'live')
           AND NOT (p_keep_reported AND (
                    EXISTS (SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id)
                    OR (w.state = 'done' AND w.host_id IN (SELECT host_id FROM reporters))))
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

-- A round fails: every range of its work units goes back to the pool, its
-- reports and plan are forgotten, and it opens again as the next attempt.
CREATE FUNCTION round_fail(p_project bigint, p_version integer, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM round WHERE project_id = p_project AND version = p_version FOR UPDATE;
    DELETE FROM round_report WHERE project_id = p_project AND version = p_version;
    PERFORM round_drop_units(p_project, p_version, false);
    DELETE FROM round_member WHERE project_id = p_project AND version = p_version;
    UPDATE round SET state = 'open', attempt = attempt + 1, last_failure = p_reason,
                     close_reason = NULL, samples = NULL, n_groups = NULL, param_count = NULL,
                     plan_deadline = NULL, params_sha256 = NULL, closed_at = NULL,
                     planned_at = NULL, opened_at = now()
     WHERE project_id = p_project AND version = p_version;
END
$$;

-- The coordinator's pass over open rounds (the current version of active
-- projects): close those whose samples reached the target, and those that
-- reached p_fraction of it when the live work units of the version, at the
-- summed samples_per_sec of their last heartbeats (within wu_seconds), would
-- need more than p_budget_s seconds to fill the rest.  Returns how many
-- closed.
CREATE FUNCTION round_close_due(p_fraction double precision, p_budget_s double precision)
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
            SELECT coalesce(sum(samples_per_sec), 0) INTO v_sps FROM work_unit
             WHERE project_id = r.project_id AND version = r.version AND state = 'live'
               AND last_heartbeat > now() - make_interval(secs => r.wu_seconds);
            IF v_sps <= 0 OR (r.target_batch - v_acc) / v_sps > p_budget_s THEN
                v_why := 'stragglers';
            END IF;
        END IF;
        IF v_why IS NOT NULL THEN
            UPDATE round SET state = 'closing', close_reason = v_why, closed_at = now()
             WHERE project_id = r.project_id AND version = r.version AND state = 'open';
            IF FOUND THEN
                n := n + 1;
            END IF;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- The coordinator's pass over rounds in averaging whose deadline passed:
-- they fail.  Returns how many.
CREATE FUNCTION round_expire_averaging() RETURNS integer LANGUAGE plpgsql AS $$
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

-- Start planning a closing round: NULL while some host holding gradients has
-- not reported and the report deadline (closed_at + p_report_timeout_s) has
-- not passed: a live unit of the version, or a finished unit whose host
-- reported nothing.  Otherwise drops every unit that does not count
-- (round_drop_units) and returns {"param_count_config": the project's model,
-- "peers": [{"host_id", "samples", "endpoint", "bandwidth", "can_aggregate",
-- "rtt"}, ...] ordered by host id} from each host's reports (samples summed
-- over its counted units; the rest from its latest report).  With no peer
-- left the round fails (and reopens) and "peers" is empty.  After this no
-- report can change the peers: every unit left is reported or finished.
CREATE FUNCTION round_plan_begin(p_project bigint, p_version integer,
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
                    SELECT 1 FROM round_report rr
                     WHERE rr.project_id = p_project AND rr.version = p_version
                       AND rr.host_id = w.host_id)));
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

-- Store the plan computed from round_plan_begin's peers: p_members is
-- [{"host_id", "group", "samples", "endpoint", "bandwidth", "can_aggregate",
-- "lo", "hi"}, ...].  The round goes to 'averaging' with outcomes due
-- p_average_timeout_s from now.  False when the round is no longer closing.
CREATE FUNCTION round_plan_store(p_project bigint, p_version integer, p_param_count bigint,
                                 p_members jsonb, p_average_timeout_s double precision)
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
                     param_count = p_param_count,
                     samples = (SELECT sum(samples) FROM round_member
                                 WHERE project_id = p_project AND version = p_version),
                     n_groups = (SELECT count(DISTINCT group_id) FROM round_member
                                  WHERE project_id = p_project AND version = p_version)
     WHERE project_id = p_project AND version = p_version;
    RETURN true;
END
$$;

-- Authenticate a host token for host p_host and find project p_project and
-- its round p_version.  status NULL when all is well; else the answer.
CREATE FUNCTION round_lookup(p_token_hash bytea, p_project text, p_version integer, p_host bigint,
                             OUT status integer, OUT body text, OUT project_id bigint,
                             OUT state text, OUT attempt integer, OUT config jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint;
    r      record;
BEGIN
    SELECT h.id INTO v_host
      FROM host h JOIN account a ON a.id = h.account_id
     WHERE h.token_hash = p_token_hash AND NOT h.revoked AND NOT a.disabled;
    IF NOT FOUND THEN
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
    SELECT ro.state, ro.attempt INTO state, attempt FROM round ro
     WHERE ro.project_id = r.id AND ro.version = p_version FOR UPDATE;
    IF NOT FOUND THEN
        status := 404;
        body := api_error('not_found',
            format('project "%s" has no round for version %s', p_project, p_version));
    END IF;
END
$$;

-- The plan of round p_version for host p_host: 200 with its group, or 204
-- (body: {"retry_after"}) while there is none yet, 409 when the host is not
-- in it (it reported nothing, or too late).
CREATE FUNCTION round_plan_get(p_token_hash bytea, p_project text, p_version integer,
                               p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c  record;
    ro record;
    m  record;
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
    RETURN QUERY SELECT 200, jsonb_build_object(
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
                       AND g.group_id = m.group_id))::text;
END
$$;

-- A peer's outcome of averaging.  Once every peer of the plan said ok with
-- the same hash the round commits: model version v+1 (no checkpoint yet),
-- project.current_version = v+1, round v+1 opens.  A failure, or differing
-- hashes once all are in, fails the round (round_fail).  The same outcome
-- again answers the same; a different one is 409.
CREATE FUNCTION round_outcome(p_token_hash bytea, p_project text, p_version integer,
                              p_host bigint, p_status text, p_included jsonb, p_sha256 text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c       record;
    m       record;
    v_left  bigint;
    v_hashes bigint;
    v_state text;
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
            RETURN QUERY SELECT 200, jsonb_build_object('version', p_version, 'host_id', p_host,
                'status', p_status, 'round', jsonb_build_object('state', c.state,
                'version', p_version, 'attempt', c.attempt))::text;
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
    v_state := 'averaging';
    IF p_status = 'failed' THEN
        PERFORM round_fail(c.project_id, p_version, format('host %s failed to average', p_host));
        v_state := 'open';
    ELSE
        SELECT count(*) FILTER (WHERE outcome IS DISTINCT FROM 'ok'),
               count(DISTINCT params_sha256)
          INTO v_left, v_hashes
          FROM round_member WHERE project_id = c.project_id AND version = p_version;
        IF v_left = 0 AND v_hashes = 1 THEN
            UPDATE round SET state = 'committed', committed_at = now(), params_sha256 = p_sha256
             WHERE project_id = c.project_id AND version = p_version;
            INSERT INTO model_version (project_id, version) VALUES (c.project_id, p_version + 1)
            ON CONFLICT DO NOTHING;
            INSERT INTO round (project_id, version) VALUES (c.project_id, p_version + 1)
            ON CONFLICT DO NOTHING;
            UPDATE project SET current_version = p_version + 1
             WHERE id = c.project_id AND current_version = p_version;
            v_state := 'committed';
        ELSIF v_left = 0 THEN
            PERFORM round_fail(c.project_id, p_version, 'the peers hold different parameters');
            v_state := 'open';
        END IF;
    END IF;
    RETURN QUERY SELECT 200, jsonb_build_object('version', p_version, 'host_id', p_host,
        'status', p_status,
        'round', (SELECT jsonb_build_object('state', r.state, 'version', p_version,
                                            'attempt', r.attempt, 'last_failure', r.last_failure)
                    FROM round r WHERE r.project_id = c.project_id AND r.version = p_version))::text;
END
$$;
