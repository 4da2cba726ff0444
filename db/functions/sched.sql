-- cotrain functions: the scheduler (doc/api.md, "Work").  The server's hot
-- paths (work assignment, heartbeat, hand-back, finish, reaping) are
-- PL/pgSQL functions so each is ONE round trip; every one authenticates the
-- host by the sha256 of its token (host_auth), validates before it writes,
-- and answers (status, body).  A refused call changes nothing.
--
-- Invariant (see doc/api.md): every stream microbatch below project.frontier
-- is in exactly one of: a mb_pool row, a live work unit's [lo, hi), or the
-- finished part [lo, lo + mb_done) of a done, returned or expired work unit.
--
-- Microbatches done per model version are kept in version_progress by the
-- triggers work_unit_progress_* (db/migrations/0002_scheduler.sql), so the
-- accumulated samples of a round are a read of a few rows.

-- Helpers called on hot paths are PL/pgSQL, not LANGUAGE sql: a SQL function
-- that cannot be inlined is planned again on every call, while PL/pgSQL keeps
-- its plans for the session.
CREATE OR REPLACE FUNCTION sched_progress_add(p_project bigint, p_version integer, p_slot bigint, p_delta bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO version_progress AS vp (project_id, version, slot, mb_done)
    VALUES (p_project, p_version, (p_slot % 16)::smallint, p_delta)
    ON CONFLICT (project_id, version, slot) DO UPDATE SET mb_done = vp.mb_done + EXCLUDED.mb_done;
END
$$;

-- Triggers work_unit_progress_ins, _upd and _del: keep version_progress
-- equal to sum(mb_done) of each version's work units.
CREATE OR REPLACE FUNCTION sched_progress_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.project_id = OLD.project_id AND NEW.version = OLD.version THEN
        PERFORM sched_progress_add(NEW.project_id, NEW.version, NEW.id, NEW.mb_done - OLD.mb_done);
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.mb_done <> 0 THEN
        -- A plain UPDATE: when a project is deleted its counters may be gone
        -- already, and must not be re-created.
        UPDATE version_progress SET mb_done = mb_done - OLD.mb_done
         WHERE project_id = OLD.project_id AND version = OLD.version
           AND slot = (OLD.id % 16)::smallint;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.mb_done <> 0 THEN
        PERFORM sched_progress_add(NEW.project_id, NEW.version, NEW.id, NEW.mb_done);
    END IF;
    RETURN NULL;
END
$$;

-- Samples accumulated for one model version: sum(mb_done) * microbatch_size
-- over the version's work units, whatever their state.
CREATE OR REPLACE FUNCTION sched_accumulated(p_project bigint, p_version integer, p_microbatch_size integer)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(sum(mb_done), 0)::bigint * p_microbatch_size
              FROM version_progress WHERE project_id = p_project AND version = p_version);
END
$$;

-- The shards of a dataset that hold any token of [p_a, p_b), as a JSON array
-- (possibly empty), in index order.  Uses shard_tokens_idx for both bounds.
CREATE OR REPLACE FUNCTION sched_shards(p_dataset bigint, p_a bigint, p_b bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_a >= p_b THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'kind', 'shard', 'idx', s.idx, 'first_token', s.first_token,
                       'n_tokens', s.n_tokens, 'url', '/files/' || s.sha256,
                       'sha256', s.sha256, 'size', f.size) ORDER BY s.first_token), '[]'::jsonb)
              FROM shard s JOIN file f ON f.sha256 = s.sha256
             WHERE s.dataset_id = p_dataset
               AND s.first_token < p_b
               AND s.first_token >= coalesce((SELECT max(first_token) FROM shard
                                               WHERE dataset_id = p_dataset AND first_token <= p_a), 0));
END
$$;

-- The files a work unit needs: the checkpoint of its version (when the
-- version has one) and the dataset shards that cover the tokens of its
-- microbatches.  Stream microbatch g is microbatch m = g % mb_per_epoch of
-- its epoch, and microbatch m of an epoch is made of the samples whose tokens
-- lie in [m*T, (m+1)*T + 1) with T = microbatch_size * seq_len (one extra
-- token: the last target).  A range that wraps an epoch needs two spans; one
-- of a whole epoch or more needs every shard of the epoch.  p_n_tokens is the
-- training part of the dataset: no shard of its held-out part (tokens from
-- n_tokens - heldout_tokens on, in shards of their own) is ever listed.
-- A dataset encoded with a subword tokenizer lists its model too (kind
-- 'tokenizer'), fetched and checked by sha256 like the shards.
CREATE OR REPLACE FUNCTION sched_files(p_project bigint, p_version integer, p_dataset bigint,
                            p_n_tokens bigint, p_tokens_per_mb bigint, p_mb_per_epoch bigint,
                            p_lo bigint, p_hi bigint)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ckpt  jsonb;
    v_elo   bigint;
    v_ehi   bigint;
    v_files jsonb;
BEGIN
    SELECT jsonb_build_object('kind', 'checkpoint', 'version', p_version,
                              'url', '/files/' || f.sha256, 'sha256', f.sha256, 'size', f.size)
      INTO v_ckpt
      FROM model_version mv JOIN file f ON f.sha256 = mv.checkpoint_sha256
     WHERE mv.project_id = p_project AND mv.version = p_version;
    v_files := CASE WHEN v_ckpt IS NULL THEN '[]'::jsonb ELSE jsonb_build_array(v_ckpt) END;
    v_files := v_files || coalesce((SELECT jsonb_build_array(jsonb_build_object(
                                            'kind', 'tokenizer', 'url', '/files/' || f.sha256,
                                            'sha256', f.sha256, 'size', f.size))
                                      FROM dataset d JOIN file f ON f.sha256 = d.tokenizer_sha256
                                     WHERE d.id = p_dataset), '[]'::jsonb);
    IF p_hi - p_lo >= p_mb_per_epoch THEN
        RETURN v_files || sched_shards(p_dataset, 0, least(p_mb_per_epoch * p_tokens_per_mb + 1, p_n_tokens));
    END IF;
    v_elo := p_lo % p_mb_per_epoch;
    v_ehi := v_elo + (p_hi - p_lo);
    IF v_ehi <= p_mb_per_epoch THEN
        RETURN v_files || sched_shards(p_dataset, v_elo * p_tokens_per_mb,
                                       least(v_ehi * p_tokens_per_mb + 1, p_n_tokens));
    END IF;
    RETURN v_files
        || sched_shards(p_dataset, 0, least((v_ehi - p_mb_per_epoch) * p_tokens_per_mb + 1, p_n_tokens))
        || sched_shards(p_dataset, v_elo * p_tokens_per_mb,
                        least(p_mb_per_epoch * p_tokens_per_mb + 1, p_n_tokens));
END
$$;

-- The host's speed in samples per second: what its latest work unit of
-- the project's last three versions measured (heartbeat or finish), else
-- its benchmark.  (Versions bound the scan: work_unit_version_idx.)
CREATE OR REPLACE FUNCTION sched_host_rate(p_project bigint, p_version integer, p_host bigint,
                                           p_flops double precision, p_flops_per_sample double precision)
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_sps double precision;
BEGIN
    SELECT w.samples_per_sec INTO v_sps FROM work_unit w
     WHERE w.project_id = p_project AND w.version BETWEEN p_version - 2 AND p_version
       AND w.host_id = p_host AND w.samples_per_sec > 0
     ORDER BY w.id DESC LIMIT 1;
    RETURN coalesce(v_sps, greatest(p_flops, 1) / p_flops_per_sample);
END
$$;

-- How many microbatches a new work unit of version p_version may hold so
-- that the round keeps its promise of target_batch samples (doc/design.md,
-- "The round"): need = ceil(target / microbatch_size) - the microbatches
-- done - the rest of the live units, and of that the host's share by speed
-- among the hosts free to take it: its own rate over the rates of itself
-- and of the other hosts that worked on this version or the previous one
-- in the last 2 * wu_seconds and hold no live unit now (guided
-- self-scheduling: each asks for its part of what is left, so all finish
-- together and the tail shrinks geometrically).  Never more than p_n (the
-- speed cap), at least 1 while anything is needed; 0 when the round's
-- target is covered by what is done and in flight.
CREATE OR REPLACE FUNCTION sched_round_share(p_project bigint, p_version integer, p_host bigint,
                                             p_rate double precision, p_n bigint,
                                             p_target integer, p_microbatch_size integer,
                                             p_wu_seconds integer, p_flops_per_sample double precision)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_out  bigint;
    v_need bigint;
    v_free double precision;
BEGIN
    SELECT coalesce(sum(hi - lo - mb_done), 0) INTO v_out FROM work_unit
     WHERE project_id = p_project AND version = p_version AND state = 'live';
    v_need := (p_target::bigint + p_microbatch_size - 1) / p_microbatch_size
              - sched_accumulated(p_project, p_version, 1) - v_out;
    IF v_need <= 0 THEN
        RETURN 0;
    END IF;
    SELECT coalesce(sum(x.rate), 0) INTO v_free FROM (
        SELECT DISTINCT ON (w.host_id)
               CASE WHEN w.samples_per_sec > 0 THEN w.samples_per_sec
                    ELSE greatest(h.flops, 1) / p_flops_per_sample END AS rate
          FROM work_unit w JOIN host h ON h.id = w.host_id
         WHERE w.project_id = p_project AND w.version IN (p_version, p_version - 1)
           AND w.host_id <> p_host
           AND coalesce(w.finished_at, w.last_heartbeat) > now() - make_interval(secs => 2 * p_wu_seconds)
           -- The hosts holding live work of the round, read once (a hashed
           -- set), not looked up again for each unit: at a round's opening
           -- a thousand assignments each probing the live units' index a
           -- thousand times were a fifth of the database's CPU, most of it
           -- in marking the same dead index entries again (doc/scale.md,
           -- "Runs M").
           AND w.host_id NOT IN (SELECT l.host_id FROM work_unit l
                                  WHERE l.project_id = p_project AND l.version = p_version
                                    AND l.state = 'live')
         ORDER BY w.host_id, w.id DESC) x;
    RETURN least(p_n, v_need, greatest(1, ceil(v_need * p_rate / (p_rate + v_free))::bigint));
END
$$;

-- Hand host p_host_id (authenticated by p_token_hash) a work unit of project
-- p_project.  Its size n = clamp(round(flops * wu_seconds /
-- (flops_per_sample * microbatch_size)), 1, p_wu_max) microbatches, cut to
-- the host's share of what the round still needs (sched_round_share), taken
-- from the lowest free pool range that no other transaction holds (SKIP
-- LOCKED), or, when none is free, carved off the frontier as a chunk of
-- max(p_chunk, n), cut at the end of the epoch, whose rest goes to the pool (so the project row is locked
-- once per chunk, not once per work unit).  A range larger than n gives its
-- top n microbatches: only mb_pool.hi changes, which no index covers, so the
-- update is HOT and the (project_id, lo) index never fills with dead entries
-- at the very place every assignment starts its scan.  Deadline: now + 2 * wu_seconds;
-- heartbeats push it to at least now + wu_seconds.
--
-- Work for a round that is not open is refused: 409 with the round's state,
-- whether this host holds units of it still to report ("report": the host
-- must report them, not wait) and a retry_after in seconds.  Peers stay out of the next version until it
-- exists (its parameters are the outcome of this round).  So is work for an
-- open round whose target is covered by what is done and in flight: 409
-- with "round": {"state": "open", ..., "full": true}; a hand-back, an
-- expiry or the close moves it (the client's long poll looks again).
CREATE OR REPLACE FUNCTION sched_assign(p_token_hash bytea, p_host_id bigint, p_project text,
                                        p_wu_max bigint, p_chunk bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host     record;
    v_proj     record;
    v_free     record;
    v_n        bigint;
    v_lo       bigint;
    v_hi       bigint;
    v_wu       bigint;
    v_rate     double precision;
    v_deadline timestamptz;
    v_flag     record;
BEGIN
    SELECT h.id, h.flops, h.last_seen INTO v_host FROM host h WHERE h.id = host_auth(p_token_hash);
    IF NOT FOUND THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    IF v_host.id <> p_host_id THEN
        RETURN QUERY SELECT 403, api_error('forbidden',
            format('this token belongs to host %s, not to host %s', v_host.id, p_host_id));
        RETURN;
    END IF;

    SELECT p.id, p.active, p.current_version, p.wu_seconds, p.flops_per_sample,
           p.microbatch_size, p.seq_len, p.mb_per_epoch, p.seed, p.target_batch, p.config,
           p.dataset_id, d.n_tokens - d.heldout_tokens AS n_tokens, d.name AS dataset,
           r.state AS round_state,
           r.attempt AS round_attempt,
           r.report_spread_ms AS round_spread
      INTO v_proj
      FROM project p JOIN dataset d ON d.id = p.dataset_id
      LEFT JOIN round r ON r.project_id = p.id AND r.version = p.current_version
     WHERE p.name = p_project;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('project "%s" does not exist', p_project));
        RETURN;
    END IF;
    IF NOT v_proj.active THEN
        RETURN QUERY SELECT 409, api_error('conflict', format('project "%s" is not active', p_project),
                                           'Ask for work again later.');
        RETURN;
    END IF;
    -- One assignment at a time per round: the round's state and its need
    -- (sched_round_share) are read under the round's row lock, so two
    -- hosts never both take the last part of the target, and no work goes
    -- out for a round that closed meanwhile.  A round already past open
    -- when the project was read gives out nothing, so it is not locked:
    -- at a close every held work request looks again at once, and a
    -- thousand of them taking the row in turn held up the reports (which
    -- take it FOR SHARE) behind them (doc/scale.md, "Runs L").
    IF v_proj.round_state IS NULL OR v_proj.round_state = 'open' THEN
        SELECT r.state, r.attempt, r.report_spread_ms
          INTO v_proj.round_state, v_proj.round_attempt, v_proj.round_spread FROM round r
         WHERE r.project_id = v_proj.id AND r.version = v_proj.current_version FOR UPDATE;
        -- A host a check of the averaged bytes flagged gets no work where
        -- the plan would leave it out (round_sketch_bars): in the rest of
        -- the version, and in every later round after a lasting flag
        -- (under a second seed, or a spot check settled against it).  Read
        -- after any such flag under way (round_flag_lock, after the round's
        -- row as round_try_commit takes it), so that no unit goes out after
        -- a flag.
        PERFORM round_flag_lock(v_proj.id);
    END IF;
    SELECT f.version, f.role, f.reason, f.seed2, f.lasting INTO v_flag
      FROM round_sketch_bars(v_proj.id, v_proj.current_version) f
     WHERE f.host_id = v_host.id ORDER BY f.id DESC LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT 403, jsonb_build_object(
            'error', jsonb_build_object(
                'code', 'forbidden',
                'message', format('host %s may not take work of project "%s": flagged as %s in round %s: %s',
                                  v_host.id, p_project, v_flag.role, v_flag.version, v_flag.reason),
                'hint', CASE WHEN v_flag.seed2
                             THEN 'A host flagged by the check under the second seed takes no more part in this project.'
                             WHEN v_flag.lasting
                             THEN 'A host whose committed sketches a checker and a third host both disagreed with takes no more part in this project.'
                             ELSE format('It may take work again from version %s.', v_proj.current_version + 1)
                        END))::text;
        RETURN;
    END IF;
    IF v_proj.round_state <> 'open' THEN
        RETURN QUERY SELECT 409, jsonb_build_object(
            'error', jsonb_build_object(
                'code', 'conflict',
                'message', format('round %s of project "%s" is %s', v_proj.current_version,
                                  p_project, v_proj.round_state),
                'hint', 'Report the work units of this version, then ask for work again once the next version is out.'),
            'round', jsonb_build_object('state', v_proj.round_state, 'version', v_proj.current_version,
                                        'attempt', v_proj.round_attempt,
                                        'report', EXISTS (
                SELECT 1 FROM work_unit w
                 WHERE w.project_id = v_proj.id AND w.version = v_proj.current_version
                   AND w.host_id = v_host.id AND (w.state = 'live' OR w.mb_done > 0)
                   AND NOT EXISTS (SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id)))
                || CASE WHEN v_proj.round_state = 'closing'
                        THEN jsonb_build_object('report_spread_ms', coalesce(v_proj.round_spread, 0))
                        ELSE '{}' END,
            'retry_after', 10)::text;
        RETURN;
    END IF;

    v_rate := sched_host_rate(v_proj.id, v_proj.current_version, v_host.id, v_host.flops,
                              v_proj.flops_per_sample);
    v_n := least(greatest(round(v_rate * v_proj.wu_seconds / v_proj.microbatch_size), 1),
                 p_wu_max)::bigint;
    v_n := sched_round_share(v_proj.id, v_proj.current_version, v_host.id, v_rate, v_n,
                             v_proj.target_batch, v_proj.microbatch_size, v_proj.wu_seconds,
                             v_proj.flops_per_sample);
    IF v_n = 0 THEN
        RETURN QUERY SELECT 409, jsonb_build_object(
            'error', jsonb_build_object(
                'code', 'conflict',
                'message', format('round %s of project "%s" has work out for all of its %s samples',
                                  v_proj.current_version, p_project, v_proj.target_batch),
                'hint', 'Ask again in a moment: the round closes when that work is done, or hands out what comes back.'),
            'round', jsonb_build_object('state', 'open', 'version', v_proj.current_version,
                                        'attempt', v_proj.round_attempt, 'full', true),
            'retry_after', 1)::text;
        RETURN;
    END IF;

    SELECT id, lo, hi INTO v_free
      FROM mb_pool WHERE project_id = v_proj.id
     ORDER BY lo LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        v_hi := v_free.hi;
        IF v_free.hi - v_free.lo <= v_n THEN
            v_lo := v_free.lo;
            DELETE FROM mb_pool WHERE id = v_free.id;
        ELSE
            v_lo := v_free.hi - v_n;
            UPDATE mb_pool SET hi = v_lo WHERE id = v_free.id;
        END IF;
    ELSE
        -- A chunk never crosses the end of an epoch, so the stream is used
        -- epoch by epoch: no microbatch of epoch e+1 before all of epoch e
        -- has been handed out.
        SELECT frontier INTO v_lo FROM project WHERE id = v_proj.id FOR UPDATE;
        v_hi := least(v_lo + greatest(p_chunk, v_n),
                      (v_lo / v_proj.mb_per_epoch + 1) * v_proj.mb_per_epoch);
        UPDATE project SET frontier = v_hi WHERE id = v_proj.id;
        IF v_hi - v_lo > v_n THEN
            INSERT INTO mb_pool (project_id, lo, hi) VALUES (v_proj.id, v_lo + v_n, v_hi);
            v_hi := v_lo + v_n;
        END IF;
    END IF;

    v_deadline := now() + make_interval(secs => 2 * v_proj.wu_seconds);
    INSERT INTO work_unit (project_id, host_id, version, lo, hi, deadline)
    VALUES (v_proj.id, v_host.id, v_proj.current_version, v_lo, v_hi, v_deadline)
    RETURNING id INTO v_wu;
    IF v_host.last_seen < now() - interval '1 minute' THEN
        UPDATE host SET last_seen = now() WHERE id = v_host.id;
    END IF;

    RETURN QUERY SELECT 200, jsonb_build_object(
        'work_unit_id', v_wu,
        'project', p_project,
        'version', v_proj.current_version,
        'lo', v_lo,
        'hi', v_hi,
        'microbatch_size', v_proj.microbatch_size,
        'seq_len', v_proj.seq_len,
        'mb_per_epoch', v_proj.mb_per_epoch,
        'seed', v_proj.seed,
        'dataset', v_proj.dataset,
        'deadline', v_deadline,
        'heartbeat_interval', greatest(1, v_proj.wu_seconds / 4),
        'target_batch', v_proj.target_batch,
        'sketch', spot_sketch_params(v_proj.id, v_proj.current_version),
        -- The optimizer in force at the unit's version (project_settings.sql):
        -- a local-mode peer's inner steps take it.
        'optimizer', project_config_at(v_proj.config, v_proj.current_version)->'optimizer',
        'files', sched_files(v_proj.id, v_proj.current_version, v_proj.dataset_id, v_proj.n_tokens,
                             v_proj.microbatch_size::bigint * v_proj.seq_len, v_proj.mb_per_epoch,
                             v_lo, v_hi))::text;
END
$$;

-- The checks shared by heartbeat, hand-back and finish: the token is valid,
-- the work unit exists, is the host's and is live, and p_mb_done (when not
-- NULL) is within it and not below what was reported.  Locks the work unit
-- row.  Returns NULL when all pass, else (status, body) to answer with; w
-- receives the work unit and its project's settings.
CREATE OR REPLACE FUNCTION sched_check(p_token_hash bytea, p_wu bigint, p_mb_done bigint,
                            OUT status integer, OUT body text,
                            OUT w_project bigint, OUT w_version integer, OUT w_lo bigint,
                            OUT w_hi bigint, OUT w_mb_done bigint, OUT w_deadline timestamptz,
                            OUT pr_wu_seconds integer, OUT pr_microbatch_size integer,
                            OUT pr_target_batch integer, OUT pr_current_version integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_host  bigint;
    w       record;
BEGIN
    v_host := host_auth(p_token_hash);
    IF v_host IS NULL THEN
        status := 401;
        body := api_error('unauthorized', 'host token is not valid',
                          'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT wu.host_id, wu.project_id, wu.version, wu.lo, wu.hi, wu.mb_done, wu.state, wu.deadline,
           p.wu_seconds, p.microbatch_size, p.target_batch, p.current_version
      INTO w
      FROM work_unit wu JOIN project p ON p.id = wu.project_id
     WHERE wu.id = p_wu
       FOR UPDATE OF wu;
    IF NOT FOUND THEN
        status := 404;
        body := api_error('not_found', format('work unit %s does not exist', p_wu));
        RETURN;
    END IF;
    IF w.host_id <> v_host THEN
        status := 403;
        body := api_error('forbidden', format('work unit %s belongs to another host', p_wu));
        RETURN;
    END IF;
    IF w.state <> 'live' THEN
        status := 409;
        body := api_error('conflict',
            format('work unit %s is %s', p_wu,
                   CASE w.state WHEN 'returned' THEN 'already handed back'
                                WHEN 'done' THEN 'already finished'
                                ELSE 'expired' END),
            'Drop it and ask for new work.');
        RETURN;
    END IF;
    IF p_mb_done IS NOT NULL AND p_mb_done > w.hi - w.lo THEN
        status := 400;
        body := api_error('invalid',
            format('mb_done %s is more than the %s microbatches of work unit %s',
                   p_mb_done, w.hi - w.lo, p_wu));
        RETURN;
    END IF;
    IF p_mb_done IS NOT NULL AND p_mb_done < w.mb_done THEN
        status := 400;
        body := api_error('invalid',
            format('mb_done cannot decrease: work unit %s already reported %s', p_wu, w.mb_done));
        RETURN;
    END IF;
    w_project := w.project_id; w_version := w.version; w_lo := w.lo; w_hi := w.hi;
    w_mb_done := w.mb_done; w_deadline := w.deadline;
    pr_wu_seconds := w.wu_seconds; pr_microbatch_size := w.microbatch_size;
    pr_target_batch := w.target_batch; pr_current_version := w.current_version;
END
$$;

-- Heartbeat, hand-back and finish answer (status, body); each 200 answer
-- goes through round_annotate, which closes the unit's round once its
-- samples reach the target and adds "round" when that round is not open.

-- A heartbeat: microbatches done so far (from lo, in order) and the host's
-- speed.  Extends the deadline to at least now + wu_seconds.
CREATE OR REPLACE FUNCTION sched_heartbeat(p_token_hash bytea, p_wu bigint, p_mb_done bigint, p_sps real)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c          record;
    v_deadline timestamptz;
BEGIN
    SELECT * INTO c FROM sched_check(p_token_hash, p_wu, p_mb_done);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    v_deadline := greatest(c.w_deadline, now() + make_interval(secs => c.pr_wu_seconds));
    UPDATE work_unit SET mb_done = p_mb_done, samples_per_sec = p_sps,
                         last_heartbeat = now(), deadline = v_deadline
     WHERE id = p_wu;
    RETURN QUERY SELECT * FROM round_annotate(p_wu, 200, json_build_object(
        'work_unit_id', p_wu, 'state', 'live', 'mb_done', p_mb_done,
        'deadline', v_deadline, 'version', c.w_version,
        'current_version', c.pr_current_version,
        'accumulated_samples', sched_accumulated(c.w_project, c.w_version, c.pr_microbatch_size),
        'target_batch', c.pr_target_batch)::text);
END
$$;

-- The close notice of work unit p_wu: what its host needs to know to stop
-- and report, read without changing anything (GET /v1/workunits/{id}/round,
-- which holds it while the round is open).  200 {"work_unit_id", "state",
-- "version", "round"?}: the unit's state ('live', 'done', 'returned',
-- 'expired') and "round" (round_note) once its round is not open; 401, 403
-- and 404 as a heartbeat's.
CREATE OR REPLACE FUNCTION sched_round_watch(p_token_hash bytea, p_wu bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_host bigint;
    w      record;
    b      jsonb;
    n      jsonb;
BEGIN
    v_host := host_auth(p_token_hash);
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                          'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT wu.host_id, wu.project_id, wu.version, wu.state INTO w FROM work_unit wu WHERE wu.id = p_wu;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('work unit %s does not exist', p_wu));
        RETURN;
    END IF;
    IF w.host_id <> v_host THEN
        RETURN QUERY SELECT 403, api_error('forbidden', format('work unit %s belongs to another host', p_wu));
        RETURN;
    END IF;
    b := jsonb_build_object('work_unit_id', p_wu, 'state', w.state, 'version', w.version);
    n := round_note(w.project_id, w.version);
    IF n IS NOT NULL THEN
        b := b || jsonb_build_object('round', n);
    END IF;
    RETURN QUERY SELECT 200, b::text;
END
$$;

-- Hand back the unprocessed rest [lo + mb_done, hi) to the pool; the work
-- unit becomes 'returned'.  A repeat of the same hand-back (same host, same
-- mb_done: a client that died before it recorded our answer sends it again)
-- is answered 200 with the same body and changes nothing; any other report
-- on a work unit that is no longer live is 409.
CREATE OR REPLACE FUNCTION sched_handback(p_token_hash bytea, p_wu bigint, p_mb_done bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c record;
    r record;
BEGIN
    SELECT * INTO c FROM sched_check(p_token_hash, p_wu, p_mb_done);
    IF c.status = 409 THEN
        -- sched_check has checked the token and that the work unit is this
        -- host's before it answers 409.
        SELECT wu.project_id, wu.version, wu.lo, wu.hi, wu.mb_done,
               p.microbatch_size, p.target_batch, p.current_version
          INTO r
          FROM work_unit wu JOIN project p ON p.id = wu.project_id
         WHERE wu.id = p_wu AND wu.state = 'returned' AND wu.mb_done = p_mb_done;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM round_annotate(p_wu, 200, json_build_object(
                'work_unit_id', p_wu, 'state', 'returned', 'mb_done', r.mb_done,
                'returned_lo', r.lo + r.mb_done, 'returned_hi', r.hi,
                'version', r.version, 'current_version', r.current_version,
                'accumulated_samples', sched_accumulated(r.project_id, r.version, r.microbatch_size),
                'target_batch', r.target_batch)::text);
            RETURN;
        END IF;
    END IF;
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    UPDATE work_unit SET mb_done = p_mb_done, state = 'returned',
                         last_heartbeat = now(), finished_at = now()
     WHERE id = p_wu;
    IF c.w_lo + p_mb_done < c.w_hi THEN
        INSERT INTO mb_pool (project_id, lo, hi) VALUES (c.w_project, c.w_lo + p_mb_done, c.w_hi);
    END IF;
    RETURN QUERY SELECT * FROM round_annotate(p_wu, 200, json_build_object(
        'work_unit_id', p_wu, 'state', 'returned', 'mb_done', p_mb_done,
        'returned_lo', c.w_lo + p_mb_done, 'returned_hi', c.w_hi,
        'version', c.w_version, 'current_version', c.pr_current_version,
        'accumulated_samples', sched_accumulated(c.w_project, c.w_version, c.pr_microbatch_size),
        'target_batch', c.pr_target_batch)::text);
END
$$;

-- The whole range is done; the work unit becomes 'done' and keeps the
-- host's speed p_sps (when above 0) for sizing its next unit.  A repeated
-- finish from the same host is answered 200 with the same body and changes
-- nothing; a finish of a work unit handed back or expired is 409.
DROP FUNCTION IF EXISTS sched_finish(bytea, bigint);
CREATE OR REPLACE FUNCTION sched_finish(p_token_hash bytea, p_wu bigint, p_sps real)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c record;
    r record;
BEGIN
    SELECT * INTO c FROM sched_check(p_token_hash, p_wu, NULL);
    IF c.status = 409 THEN
        -- sched_check has checked the token and that the work unit is this
        -- host's before it answers 409.
        SELECT wu.project_id, wu.version, wu.lo, wu.hi,
               p.microbatch_size, p.target_batch, p.current_version
          INTO r
          FROM work_unit wu JOIN project p ON p.id = wu.project_id
         WHERE wu.id = p_wu AND wu.state = 'done';
        IF FOUND THEN
            RETURN QUERY SELECT * FROM round_annotate(p_wu, 200, json_build_object(
                'work_unit_id', p_wu, 'state', 'done', 'mb_done', r.hi - r.lo,
                'version', r.version, 'current_version', r.current_version,
                'accumulated_samples', sched_accumulated(r.project_id, r.version, r.microbatch_size),
                'target_batch', r.target_batch)::text);
            RETURN;
        END IF;
    END IF;
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    UPDATE work_unit SET mb_done = hi - lo, state = 'done',
                         samples_per_sec = CASE WHEN p_sps > 0 THEN p_sps ELSE samples_per_sec END,
                         last_heartbeat = now(), finished_at = now()
     WHERE id = p_wu;
    RETURN QUERY SELECT * FROM round_annotate(p_wu, 200, json_build_object(
        'work_unit_id', p_wu, 'state', 'done', 'mb_done', c.w_hi - c.w_lo,
        'version', c.w_version, 'current_version', c.pr_current_version,
        'accumulated_samples', sched_accumulated(c.w_project, c.w_version, c.pr_microbatch_size),
        'target_batch', c.pr_target_batch)::text);
END
$$;

-- Expire up to p_limit live work units whose deadline has passed, oldest
-- first, skipping any that a heartbeat holds right now.  An expired unit
-- counts for nothing: its whole range goes back to the pool and its
-- samples leave the version's progress, and so do the host's other units
-- of that version that are finished but not reported, because the host
-- drops the gradient that sums them when it hears of the expiry (and a
-- silent host can report none of them).  So the close test never counts
-- samples no gradient holds (round_give_back).  Returns how many units
-- expired past their deadline; the reaper calls again while that equals
-- p_limit.
CREATE OR REPLACE FUNCTION sched_reap(p_limit integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_due bigint[];
BEGIN
    v_due := ARRAY(SELECT id FROM work_unit
                    WHERE state = 'live' AND deadline < now()
                    ORDER BY deadline LIMIT p_limit
                      FOR UPDATE SKIP LOCKED);
    IF cardinality(v_due) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM round_give_back(ARRAY(
        SELECT w.id FROM work_unit w
         WHERE w.id = ANY (v_due)
            OR (w.state = 'done' AND w.mb_done > 0
                AND (w.project_id, w.version, w.host_id) IN
                    (SELECT e.project_id, e.version, e.host_id FROM work_unit e WHERE e.id = ANY (v_due))
                AND NOT EXISTS (SELECT 1 FROM round_report rr WHERE rr.work_unit_id = w.id))
           FOR UPDATE));
    RETURN cardinality(v_due);
END
$$;

-- What project p_project computes right now: the hosts holding a live work
-- unit (heard from within 2 * wu_seconds) and their summed speed in samples
-- per second, each host's speed being its live unit's last heartbeat or,
-- before the first one, the measure of its previous unit (finish) of the
-- last three versions.  Units are short near a round's end and finish
-- without a heartbeat, so the live units' own figures alone read 0 most of
-- the time.
CREATE OR REPLACE FUNCTION project_speed(p_project bigint, OUT hosts bigint, OUT samples_per_sec double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT count(DISTINCT w.host_id),
           coalesce(sum(CASE WHEN w.samples_per_sec > 0 THEN w.samples_per_sec
                             ELSE (SELECT x.samples_per_sec FROM work_unit x
                                    WHERE x.project_id = p_project
                                      AND x.version BETWEEN w.version - 2 AND w.version
                                      AND x.host_id = w.host_id AND x.samples_per_sec > 0
                                    ORDER BY x.id DESC LIMIT 1) END), 0)
      INTO hosts, samples_per_sec
      FROM work_unit w JOIN project p ON p.id = w.project_id
     WHERE w.project_id = p_project AND w.state = 'live'
       AND w.last_heartbeat > now() - make_interval(secs => 2 * p.wu_seconds);
END
$$;
