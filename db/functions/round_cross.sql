-- cotrain functions: averaging across groups peer to peer
-- (doc/averaging.md, "Across groups"; doc/api.md, "Rounds"), for rounds
-- planned with round.cross_peers (cotrain-server --round-cross-peers).
--
-- The plan partitions the vector into slices at every boundary of every
-- group's aggregator ranges (round_cross_slices); the aggregators holding
-- a slice in the different groups all-reduce it among themselves into the
-- round's mean, which every member of every group then holds.  The server
-- never sees a gradient: each member posts the sha256 of the mean it holds
-- with its group's included set (round_group_sum, sum_sha256 being the
-- mean's hash; every group must name the same, round_mean_agree), every
-- included peer reports its v+1 as today, and the peer with the lowest
-- host id among a strict majority of the included peers holding the same
-- parameters uploads its checkpoint of v+1 (round_checkpoint_uploader),
-- which the server checks (its parameters hash to the majority's, its step
-- is v+1) and commits as the round's v+1.

-- The slices of round p_version, ascending: every boundary of every
-- member's aggregator range cuts the vector, and each slice lies inside
-- exactly one member's range in every group, its holders.  holders is
-- [{"host_id", "endpoint", "group", "lo", "hi"}, ...], ascending host id,
-- each holder's part of the slice in proportion to the reported bandwidths,
-- as contiguous parts; a slice's index is its rank among the round's slices.
CREATE OR REPLACE FUNCTION round_cross_partition(p_project bigint, p_version integer)
RETURNS TABLE (idx bigint, lo bigint, hi bigint, holders jsonb) LANGUAGE sql STABLE AS $$
    -- Each step computed once (MATERIALIZED): the members were inserted by
    -- the plan's own transaction, so the table's statistics may still say
    -- it is nearly empty, and a nested loop that ran a step again for each
    -- member made one plan of 1,000 hosts take 20 s (doc/scale.md, "Runs M").
    WITH b AS MATERIALIZED (
        SELECT DISTINCT x FROM round_member rm, LATERAL (VALUES (rm.lo), (rm.hi)) v(x)
         WHERE rm.project_id = p_project AND rm.version = p_version AND rm.hi > rm.lo),
    s AS MATERIALIZED (
        SELECT (row_number() OVER (ORDER BY x)) - 1 AS idx, x AS lo,
               lead(x) OVER (ORDER BY x) AS hi FROM b),
    h AS MATERIALIZED (
        SELECT s.idx, s.lo AS slo, s.hi AS shi, rm.host_id, rm.endpoint, rm.group_id,
               greatest(rm.bandwidth, 1)::numeric AS bw,
               sum(greatest(rm.bandwidth, 1)::numeric) OVER w - greatest(rm.bandwidth, 1)::numeric AS before,
               sum(greatest(rm.bandwidth, 1)::numeric) OVER (PARTITION BY s.idx) AS total
          FROM s JOIN round_member rm
            ON rm.project_id = p_project AND rm.version = p_version AND rm.hi > rm.lo
           AND rm.lo <= s.lo AND rm.hi >= s.hi
         WHERE s.hi IS NOT NULL
        WINDOW w AS (PARTITION BY s.idx ORDER BY rm.host_id))
    SELECT idx, slo, shi,
           jsonb_agg(jsonb_build_object(
               'host_id', host_id, 'endpoint', endpoint, 'group', group_id,
               'lo', slo + floor((shi - slo) * before / total)::bigint,
               'hi', slo + floor((shi - slo) * (before + bw) / total)::bigint)
               ORDER BY host_id)
      FROM h GROUP BY idx, slo, shi
$$;

-- The slices of host p_host's range in round p_version (of
-- round_cross_partition): [{"index", "lo", "hi", "holders"}, ...]
-- ascending, or NULL when the round is not cross_peers, has one group, or
-- the host aggregates nothing.  Computed from the members' ranges: a plan's
-- answers take a kept partition instead (round.cross_partition,
-- round_plan_bodies), and this only for a round planned before it was kept.
CREATE OR REPLACE FUNCTION round_cross_slices(p_project bigint, p_version integer, p_host bigint)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    ro record;
    m  record;
BEGIN
    SELECT cross_peers, n_groups INTO ro FROM round WHERE project_id = p_project AND version = p_version;
    SELECT rm.lo, rm.hi INTO m FROM round_member rm
     WHERE rm.project_id = p_project AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT coalesce(ro.cross_peers, false) OR coalesce(ro.n_groups, 1) < 2 OR m.hi IS NULL
       OR m.hi <= m.lo THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT jsonb_agg(jsonb_build_object('index', x.idx, 'lo', x.lo, 'hi', x.hi,
                                                'holders', x.holders) ORDER BY x.idx)
              FROM round_cross_partition(p_project, p_version) x
             WHERE x.lo >= m.lo AND x.hi <= m.hi);
END
$$;

-- Keep round p_version's partition (round_cross_partition) on the round, as
-- [{"index", "lo", "hi", "holders"}, ...] ascending, for its plan's answers
-- to take each aggregator's slices from (round_plan_bodies): once per plan,
-- about 30 slices and 160 KB at 1,000 hosts.  (Each aggregator's slices
-- kept on its member row were 10 MB at 1,000 hosts, a third of a second to
-- write; doc/scale.md, "Runs N".)  Called by round_plan_store once the
-- members are in; nothing for a round that is not cross_peers or has one
-- group.
DROP FUNCTION IF EXISTS round_cross_slices_store(bigint, integer);
CREATE OR REPLACE FUNCTION round_cross_partition_store(p_project bigint, p_version integer)
RETURNS void LANGUAGE sql AS $$
    UPDATE round r
       SET cross_partition = (SELECT jsonb_agg(jsonb_build_object('index', x.idx, 'lo', x.lo,
                                                                  'hi', x.hi, 'holders', x.holders)
                                               ORDER BY x.idx)
                                FROM round_cross_partition(p_project, p_version) x)
     WHERE r.project_id = p_project AND r.version = p_version AND r.cross_peers
       AND r.n_groups >= 2
$$;

-- Every group of round p_version posted its mean's hash: when they all
-- name the same, it is the round's mean (gradient_sha256, a hash of bytes
-- the server does not hold) over the included hosts' samples, and the work
-- units of the hosts no group included are dropped; when they differ the
-- round fails.  The caller holds the round's row lock (round_group_sum_settle).
CREATE OR REPLACE FUNCTION round_mean_agree(p_project bigint, p_version integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_n     integer;
    v_sha   text;
    v_total bigint;
BEGIN
    SELECT count(DISTINCT sum_sha256), min(sum_sha256), sum(samples) INTO v_n, v_sha, v_total
      FROM round_group_sum WHERE project_id = p_project AND version = p_version;
    IF v_n <> 1 THEN
        PERFORM round_fail(p_project, p_version,
            format('the groups hold %s different means after averaging across groups', v_n));
        RETURN;
    END IF;
    UPDATE round SET gradient_sha256 = v_sha, gradient_samples = v_total
     WHERE project_id = p_project AND version = p_version;
    PERFORM round_drop_excluded(p_project, p_version);
END
$$;

-- The parameters of v+1 that a strict majority of round p_version's
-- included peers reported, once every included peer reported ok ("sha";
-- NULL before, or when there is no such majority), and the lowest host id
-- of that majority whose checkpoint upload was not refused ("uploader").
-- One pass over the members, and none while an included peer has still
-- to say ok (the first such member ends the look): every outcome, under
-- the round's lock, and every held outcome poll of a thousand at each
-- wake-up look at it (round_try_commit, round_checkpoint_uploader): at
-- 1,000 hosts a full pass each was about a millisecond, thousands of times
-- a round (doc/scale.md, "Runs M").
CREATE OR REPLACE FUNCTION round_cross_tally(p_project bigint, p_version integer,
                                             OUT sha text, OUT uploader bigint)
LANGUAGE sql STABLE AS $$
    WITH w AS (
        SELECT 1 FROM round_member
         WHERE project_id = p_project AND version = p_version AND included
           AND outcome IS DISTINCT FROM 'ok' LIMIT 1),
    g AS MATERIALIZED (
        SELECT params_sha256 AS sha, count(*) AS n,
               bool_and(outcome IS NOT DISTINCT FROM 'ok') AS ok,
               min(host_id) FILTER (WHERE NOT checkpoint_refused) AS uploader
          FROM round_member
         WHERE project_id = p_project AND version = p_version AND included
         GROUP BY params_sha256)
    SELECT g.sha, g.uploader FROM g
     WHERE NOT EXISTS (SELECT 1 FROM w)
       AND g.sha IS NOT NULL AND 2 * g.n > (SELECT sum(n) FROM g)
       AND (SELECT bool_and(ok) FROM g)
$$;

-- The parameters of v+1 that a strict majority of round p_version's
-- included peers reported, once every included peer reported ok; NULL
-- before, or when there is no such majority (round_cross_tally).
CREATE OR REPLACE FUNCTION round_cross_majority(p_project bigint, p_version integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT sha FROM round_cross_tally(p_project, p_version)
$$;

-- The optimizer moments of v+1 (round_member.moments_sha256) that a strict
-- majority of round p_version's included peers reported; NULL when there is
-- no such majority (peers that do not report them).
CREATE OR REPLACE FUNCTION round_cross_moments(p_project bigint, p_version integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT x.moments_sha256
      FROM (SELECT moments_sha256, count(*) AS n FROM round_member
             WHERE project_id = p_project AND version = p_version AND included
               AND moments_sha256 IS NOT NULL
             GROUP BY moments_sha256) x
     WHERE 2 * x.n > (SELECT count(*) FROM round_member
                       WHERE project_id = p_project AND version = p_version AND included)
$$;

-- The host that is to upload the checkpoint of v+1 of round p_version: in
-- a cross_peers round averaging, whose groups agreed on the mean and whose
-- v+1 is not in yet, the lowest host id holding the majority's parameters
-- whose upload was not refused (checkpoint_refused: the next one is asked
-- then; round_cross_tally); else NULL.
CREATE OR REPLACE FUNCTION round_checkpoint_uploader(p_project bigint, p_version integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT t.uploader FROM round_cross_tally(p_project, p_version) t) FROM round r
     WHERE r.project_id = p_project AND r.version = p_version AND r.cross_peers
       AND r.state = 'averaging' AND r.gradient_sha256 IS NOT NULL AND r.checkpoint_sha256 IS NULL
$$;

-- Before a checkpoint upload's bytes are read: may host p_host upload v+1
-- of round p_version?  status NULL when it may (it is the uploader), with
-- the round's attempt, param_count, the parameters' hash the checkpoint
-- must have and the moments' (round_cross_moments; NULL: not checked);
-- 200 with the outcome answer when v+1 is in already (an upload again);
-- else 401/403/404 as round_lookup, 409 when the round wants no checkpoint
-- from this host.
DROP FUNCTION IF EXISTS round_checkpoint_begin(bytea, text, integer, bigint);
CREATE OR REPLACE FUNCTION round_checkpoint_begin(p_token_hash bytea, p_project text, p_version integer,
                                       p_host bigint, OUT status integer, OUT body text,
                                       OUT project_id bigint, OUT attempt integer,
                                       OUT param_count bigint, OUT params_sha256 text,
                                       OUT moments_sha256 text)
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
    SELECT * INTO ro FROM round r WHERE r.project_id = c.project_id AND r.version = p_version;
    IF ro.cross_peers AND ro.checkpoint_sha256 IS NOT NULL AND EXISTS (
           SELECT 1 FROM round_member rm WHERE rm.project_id = c.project_id
              AND rm.version = p_version AND rm.host_id = p_host AND rm.included) THEN
        status := 200;
        body := round_outcome_body(c.project_id, p_version, p_host);
        RETURN;
    END IF;
    IF round_checkpoint_uploader(c.project_id, p_version) IS DISTINCT FROM p_host THEN
        status := 409;
        body := api_error('conflict',
            format('round %s wants no checkpoint from host %s', p_version, p_host),
            'Upload v+1 only when the answer to your outcome says "checkpoint_upload": true.');
        RETURN;
    END IF;
    attempt := ro.attempt;
    param_count := ro.param_count;
    SELECT rm.params_sha256 INTO params_sha256 FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    moments_sha256 := round_cross_moments(c.project_id, p_version);
END
$$;

-- The checkpoint of v+1 that p_host uploaded for round p_version was
-- refused (it does not load, or its parameters or moments are not the
-- majority's): ask the next peer of the majority.  Returns that peer
-- (round_checkpoint_uploader; NULL: none), whose held outcome poll the
-- caller wakes.
DROP FUNCTION IF EXISTS round_checkpoint_refuse(bigint, integer, bigint);
CREATE FUNCTION round_checkpoint_refuse(p_project bigint, p_version integer, p_host bigint)
RETURNS bigint LANGUAGE sql AS $$
    UPDATE round_member SET checkpoint_refused = true
     WHERE project_id = p_project AND version = p_version AND host_id = p_host;
    SELECT round_checkpoint_uploader(p_project, p_version);
$$;

-- Keep the checkpoint of v+1 (p_checkpoint in the file store, p_size
-- bytes, parameters hashing to p_params) uploaded by p_host for attempt
-- p_attempt of round p_version, unless the attempt is over or v+1 is in
-- already (then nothing changes); commit when the round can
-- (round_try_commit).  Returns the host's outcome answer.
CREATE OR REPLACE FUNCTION round_checkpoint_store(p_project bigint, p_version integer, p_attempt integer,
                                       p_host bigint, p_checkpoint text, p_size bigint, p_params text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    ro record;
BEGIN
    SELECT * INTO ro FROM round r WHERE r.project_id = p_project AND r.version = p_version
       FOR UPDATE;
    IF ro.state = 'averaging' AND ro.attempt = p_attempt AND ro.cross_peers
       AND ro.checkpoint_sha256 IS NULL AND ro.gradient_sha256 IS NOT NULL
       AND round_cross_majority(p_project, p_version) = p_params THEN
        INSERT INTO file (sha256, size, kind) VALUES (p_checkpoint, p_size, 'checkpoint')
        ON CONFLICT DO NOTHING;
        UPDATE round SET checkpoint_sha256 = p_checkpoint, params_sha256 = p_params
         WHERE project_id = p_project AND version = p_version;
        PERFORM round_try_commit(p_project, p_version);
    END IF;
    RETURN round_outcome_body(p_project, p_version, p_host);
END
$$;
