-- cotrain functions: the check of the averaged bytes under a second seed,
-- drawn when the round commits (doc/credit.md, "A second seed, drawn after
-- the bytes are pinned").
--
-- The check before the commit (round_sketch.sql) uses the work unit's
-- seed, which a member knows before it sends a byte: it can send g + p
-- with p orthogonal to that seed's k vectors and pass.  seed2 is drawn at
-- commit (round_seed2_draw, in round_try_commit), after every byte was
-- received, summed and stepped on.  Each included peer then sends
-- (POST .../rounds/{v}/seed2, round_seed2_report) the sketches under seed2
-- of what it kept, in round_member.seed2_sketches:
--   {"k": k,
--    "blocks": [{"first": g, "count": c, "sketch": [k]}, ...],  (members: the
--        gradient sum of each block of c consecutive stream microbatches
--        from g, which add up to the gradient it computed)
--    "received": [...], "aggregated": {...}}  (as in round_member.sketches)
-- and round_seed2_verify runs the three checks of round_sketch_verify on
-- them, with the blocks' sum in place of the committed sketch.

-- A seed nobody could predict: 64 bits of gen_random_uuid's (a strong
-- random source), hashed.
CREATE OR REPLACE FUNCTION round_seed2_draw() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(md5(gen_random_uuid()::text || gen_random_uuid()::text), 1, 16))::bit(64)::bigint
$$;

-- Why p (a report's "sketches" under seed2) is malformed for a round whose
-- sketches have k values, or NULL when it is fine.
CREATE OR REPLACE FUNCTION round_seed2_invalid(p jsonb, p_k integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_why text;
    e     jsonb;
BEGIN
    v_why := round_sketches_invalid(p);
    IF v_why IS NOT NULL THEN
        RETURN v_why;
    END IF;
    IF (p->>'k')::integer <> p_k THEN
        RETURN format('field "sketches.k" must be %s, the k of the round''s sketches', p_k);
    END IF;
    IF p->'blocks' IS NULL OR jsonb_typeof(p->'blocks') = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p->'blocks') <> 'array' OR jsonb_array_length(p->'blocks') > 65536 THEN
        RETURN 'field "sketches.blocks" must be an array of at most 65536 blocks';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(p->'blocks') x LOOP
        -- (coalesce: a missing field makes the test NULL, which is bad too)
        IF coalesce(jsonb_typeof(e->'first') <> 'number'
                    OR (e->>'first')::numeric NOT BETWEEN 0 AND 4e18 OR (e->>'first')::numeric % 1 <> 0
                    OR jsonb_typeof(e->'count') <> 'number'
                    OR (e->>'count')::numeric NOT BETWEEN 1 AND 65536 OR (e->>'count')::numeric % 1 <> 0
                    OR NOT round_sketch_valid(e->'sketch', p_k), true) THEN
            RETURN format('field "sketches.blocks" must hold {"first": microbatch, "count": 1 to 65536, '
                          '"sketch": %s numbers}', p_k);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The k of round (p_project, p_version)'s sketches of what was averaged
-- (its included peers'), or NULL when none sketched.
CREATE OR REPLACE FUNCTION round_seed2_k(p_project bigint, p_version integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT min((sketches->>'k')::integer) FROM round_member
     WHERE project_id = p_project AND version = p_version AND included AND sketches IS NOT NULL
$$;

-- The upload of a peer alone in its group that the server sketches under
-- the second seed before it stores the peer's sketches under it
-- (api_round_seed2, check 4 of round_seed2_verify): the group sum host
-- p_host uploaded alone in committed round p_version, with the round's
-- seed2 and k, when p_token_hash is the host's, the server sketched that
-- sum under the work unit's seed (round_group_sum_sketch: the round is
-- checked) and not yet under seed2, and the check under seed2 has not run.
-- No row otherwise; the report that follows answers any error.
CREATE OR REPLACE FUNCTION round_group_sum_seed2_todo(p_token_hash bytea, p_project text, p_version integer,
                                                      p_host bigint)
RETURNS TABLE (project_id bigint, group_id integer, sum_sha256 text, seed2 bigint, k integer)
LANGUAGE sql AS $$
    SELECT s.project_id, s.group_id, s.sum_sha256, ro.seed2, round_seed2_k(s.project_id, s.version)
      FROM round_lookup(p_token_hash, p_project, p_version, p_host, false) c
      JOIN round_group_sum s ON s.project_id = c.project_id AND s.version = p_version
      JOIN round ro ON ro.project_id = s.project_id AND ro.version = s.version
     WHERE c.status IS NULL AND c.state = 'committed' AND ro.seed2 IS NOT NULL
       AND ro.seed2_checked_at IS NULL AND s.included = jsonb_build_array(p_host)
       AND s.sketch IS NOT NULL AND s.sketch2 IS NULL
       AND round_group_size(s.project_id, s.version, s.group_id) = 1
$$;

-- Keep the server's sketch p_sketch under seed2 of the group sum p_sha that
-- a peer alone in group p_group uploaded (round_group_sum_seed2_todo).
CREATE OR REPLACE FUNCTION round_group_sum_sketch2(p_project bigint, p_version integer, p_group integer,
                                                   p_sha text, p_sketch double precision[])
RETURNS void LANGUAGE sql AS $$
    UPDATE round_group_sum SET sketch2 = p_sketch
     WHERE project_id = p_project AND version = p_version AND group_id = p_group
       AND sum_sha256 = p_sha AND sketch2 IS NULL
$$;

-- True when host p_host owes round (p_project, p_version) its sketches
-- under seed2: the round drew one, the host was included (in a group of
-- one too: it sketches as its own aggregator, allreduce_alone), the
-- round's peers sketched what they averaged, and it
-- committed the sketches of all its microbatches (round_sketch_committed)
-- under that k: whether it sent sketches with its own outcome does not
-- matter.  Its round grant stays pending until they are checked.  p_k:
-- the round's round_seed2_k (NULL: none, nothing owed), which the callers,
-- looping over the members, find once (it reads every member).
DROP FUNCTION IF EXISTS round_seed2_owed(bigint, integer, bigint);
CREATE OR REPLACE FUNCTION round_seed2_owed(p_project bigint, p_version integer, p_host bigint,
                                            p_k integer)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    m   record;
BEGIN
    IF p_k IS NULL THEN
        RETURN false;
    END IF;
    SELECT rm.group_id, rm.samples INTO m
      FROM round_member rm JOIN round ro USING (project_id, version)
     WHERE rm.project_id = p_project AND rm.version = p_version AND rm.host_id = p_host
       AND rm.included AND ro.seed2 IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN round_sketch_committed(p_project, p_version, p_host, p_k, m.samples) IS NOT NULL;
END
$$;

-- Flag p_host for failing a check under seed2 of committed round
-- (p_project, p_version): round_sketch_flag_host (its pending grants
-- denied, its spot check record back to 0), the flag marked seed2, and its
-- round grant of the version denied (it waited for this check,
-- credit_grant_round).  round_plan_begin leaves it out of the project's
-- later rounds.
CREATE OR REPLACE FUNCTION round_seed2_flag_host(p_project bigint, p_version integer, p_host bigint,
                                                 p_role text, p_reason text,
                                                 p_distance double precision, p_tolerance double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM round_sketch_flag_host(p_project, p_version,
                                   (SELECT attempt FROM round WHERE project_id = p_project AND version = p_version),
                                   p_host, p_role, 'under the second seed: ' || p_reason, p_distance,
                                   p_tolerance);
    SELECT max(id) INTO v_id FROM round_sketch_flag WHERE host_id = p_host AND project_id = p_project;
    -- Its time: once round_flag_lock is held, so that a commit after it
    -- sees the flag (round_try_commit refuses the host).
    UPDATE round_sketch_flag SET seed2 = true, lasting = true, created_at = clock_timestamp()
     WHERE id = v_id;
END
$$;

-- True when p_blocks (a member's, as round_seed2_invalid checked them)
-- tile its reported microbatches of the version: disjoint, each of at most
-- p_b microbatches within one of its work units (the caller compares the
-- total with what it reported).
CREATE OR REPLACE FUNCTION round_seed2_blocks_tile(p_project bigint, p_version integer, p_host bigint,
                                                   p_blocks jsonb, p_b integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce(bool_and(b.c <= p_b AND (b.prev_end IS NULL OR b.f >= b.prev_end)
                             AND EXISTS (SELECT 1 FROM work_unit w
                                          WHERE w.project_id = p_project AND w.version = p_version
                                            AND w.host_id = p_host AND w.mb_done > 0
                                            AND b.f >= w.lo AND b.f + b.c <= w.lo + w.mb_done)), true)
      FROM (SELECT (e->>'first')::bigint AS f, (e->>'count')::bigint AS c,
                   lag((e->>'first')::bigint + (e->>'count')::bigint)
                       OVER (ORDER BY (e->>'first')::bigint) AS prev_end
              FROM jsonb_array_elements(p_blocks) e) b
$$;

-- Draw, at the host's spot rate (spot_rate of its record), a spot check
-- of one of its blocks of round (p_project, p_version), picked with a
-- probability proportional to its microbatches (the exponential race): a
-- checker recomputes its microbatches, whose sketches under the work
-- unit's seed it compares with the committed ones (skipping) and the
-- sketch under seed2 of their sum with the block's (the bytes).  The
-- host's round grant waits for it.  Returns the check's id, or NULL.
CREATE OR REPLACE FUNCTION round_seed2_spot_block(p_project bigint, p_version integer, p_host bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    pol     spot_policy := spot_policy_of(p_project);
    v_rec   integer;
    v_size  integer;
    v_seed2 bigint;
    b       record;
    v_check bigint;
BEGIN
    SELECT coalesce((SELECT consecutive FROM host_check_record WHERE host_id = p_host), 0) INTO v_rec;
    IF random() >= spot_rate(pol, v_rec) THEN
        RETURN NULL;
    END IF;
    SELECT microbatch_size INTO v_size FROM project WHERE id = p_project;
    SELECT seed2 INTO v_seed2 FROM round WHERE project_id = p_project AND version = p_version;
    SELECT (e->>'first')::bigint AS f, (e->>'count')::bigint AS c, e->'sketch' AS s2,
           w.id AS wu, w.lo, w.mb_done, ws.k, ws.sketches
      INTO b
      FROM round_member rm, jsonb_array_elements(rm.seed2_sketches->'blocks') e,
           work_unit w JOIN work_unit_sketch ws ON ws.work_unit_id = w.id
     WHERE rm.project_id = p_project AND rm.version = p_version AND rm.host_id = p_host
       AND w.project_id = p_project AND w.version = p_version AND w.host_id = p_host
       AND w.mb_done > 0 AND (e->>'first')::bigint >= w.lo
       AND (e->>'first')::bigint + (e->>'count')::bigint <= w.lo + w.mb_done
     ORDER BY -ln(1 - random()) / (e->>'count')::bigint LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi, samples, seed, k,
                            tolerance, created_at, deadline, microbatches, fp_host, seed2)
    VALUES (p_project, p_version, b.wu, p_host, b.lo, b.lo + b.mb_done, b.c * v_size,
            spot_sketch_seed(p_project, p_version), b.k,
            greatest(pol.tolerance, spot_precision_floor(p_project)), credit_now(),
            credit_now() + make_interval(secs => pol.deadline_s),
            ARRAY(SELECT g FROM generate_series(b.f, b.f + b.c - 1) g),
            ARRAY(SELECT b.sketches[(g - b.lo) * b.k + j]
                    FROM generate_series(b.f, b.f + b.c - 1) g, generate_series(1, b.k) j
                   ORDER BY g, j)
              || round_sketch_vec(b.s2),
            v_seed2)
    RETURNING id INTO v_check;
    UPDATE credit_grant SET spot_check_id = v_check
     WHERE project_id = p_project AND version = p_version AND host_id = p_host AND kind = 'round'
       AND status = 'pending';
    RETURN v_check;
END
$$;

-- Check the sketches under seed2 of committed round (p_project, p_version)
-- and flag who fails (round_seed2_flag_host), with the tolerance and the
-- encoding bounds of round_sketch_verify (the "err" and "result_err" each
-- peer reports are the bounds of the same decoded values):
--   1. each included member that owes them (round_seed2_owed): the sum of
--      its group's aggregators' partials of its slice against the sum of
--      its blocks, whose microbatches must be all it reported; p_final: a
--      member that sent none is flagged too (its deadline passed);
--   2. each aggregator: its result against the sum of its partials (with
--      the exact sum only);
--   3. each member's sketch of an aggregator's result against that result
--      (1e-9: the same bytes; both flagged on a mismatch);
-- 2 and 3 as round_sketch_verify's (round_sketch_verify_results).
-- A check whose aggregators' partials are not all in is skipped.  Then the
-- round grants that waited for this check are released where no spot
-- check holds them.  Returns the hosts flagged (ascending, each once).
CREATE OR REPLACE FUNCTION round_seed2_verify(p_project bigint, p_version integer, p_final boolean)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    v_tol     double precision;
    v_clip    boolean;
    v_k       integer;
    v_mb      bigint;
    m         record;
    g         record;
    v_sum     double precision[];
    v_blk     double precision[];
    v_srv     double precision[];
    v_err2    double precision;
    v_n       integer;
    v_d       double precision;
    v_scale   double precision;
    v_bound   double precision;
    v_bad     bigint[] := '{}';
    v_b       integer;
BEGIN
    SELECT coalesce((p.config->>'aggregation') = 'centered_clip', false) INTO v_clip
      FROM project p WHERE p.id = p_project;
    PERFORM round_flag_lock(p_project);
    v_tol := coalesce((spot_policy_of(p_project)).tolerance, 1e-3);
    -- Blocks of at most the protocol's 1,024 microbatches (the client's
    -- CL_BLOCK_MAX), not today's round_seed2_block: a target or check size
    -- changed mid-version changes the size a member was told.
    v_b := 1024;
    v_k := round_seed2_k(p_project, p_version);
    UPDATE round SET seed2_checked_at = now() WHERE project_id = p_project AND version = p_version;
    IF v_k IS NULL THEN
        RETURN v_bad;
    END IF;
    PERFORM round_sketch_partials_load(p_project, p_version, true, v_k);
    -- 1. Members: their blocks against what their aggregators received.
    FOR m IN SELECT rm.host_id, rm.group_id, rm.seed2_sketches AS s FROM round_member rm
              WHERE rm.project_id = p_project AND rm.version = p_version AND rm.included
              ORDER BY rm.host_id LOOP
        IF NOT round_seed2_owed(p_project, p_version, m.host_id, v_k) THEN
            CONTINUE;
        END IF;
        IF m.s IS NULL OR m.s->'blocks' IS NULL OR jsonb_typeof(m.s->'blocks') <> 'array' THEN
            IF p_final OR m.s IS NOT NULL THEN
                PERFORM round_seed2_flag_host(p_project, p_version, m.host_id, 'member',
                    'it sent no sketches of its blocks', 1, v_tol);
                v_bad := v_bad || m.host_id;
            END IF;
            CONTINUE;
        END IF;
        SELECT coalesce(sum(mb_done), 0) INTO v_mb FROM work_unit
         WHERE project_id = p_project AND version = p_version AND host_id = m.host_id AND mb_done > 0;
        v_blk := NULL;
        FOR g IN SELECT round_sketch_vec(e->'sketch') AS sk FROM jsonb_array_elements(m.s->'blocks') e LOOP
            v_blk := round_sketch_sum(v_blk, g.sk);
        END LOOP;
        IF (SELECT coalesce(sum((e->>'count')::bigint), 0) FROM jsonb_array_elements(m.s->'blocks') e)
           <> v_mb OR v_blk IS NULL OR NOT round_seed2_blocks_tile(p_project, p_version, m.host_id,
                                                                   m.s->'blocks', v_b) THEN
            PERFORM round_seed2_flag_host(p_project, p_version, m.host_id, 'member',
                format('its blocks do not tile the %s microbatches it reported in blocks of at most %s',
                       v_mb, v_b), 1, v_tol);
            v_bad := v_bad || m.host_id;
            CONTINUE;
        END IF;
        -- 4. Alone in its group on the server's path: the server's own
        -- sketch of the sum it uploaded (round_group_sum.sketch2) against its
        -- blocks; no wire encoding between them.
        SELECT s.sketch2 INTO v_srv FROM round_group_sum s
         WHERE s.project_id = p_project AND s.version = p_version AND s.group_id = m.group_id
           AND s.included = jsonb_build_array(m.host_id) AND cardinality(s.sketch2) = v_k;
        IF FOUND THEN
            v_d := round_sketch_norm(v_srv, v_blk);
            v_scale := greatest(round_sketch_norm(v_srv), round_sketch_norm(v_blk), 1e-300);
            IF v_d > v_tol * v_scale THEN
                PERFORM round_seed2_flag_host(p_project, p_version, m.host_id, 'member',
                    'the group sum it uploaded alone is not the gradient of its blocks',
                    v_d / v_scale, v_tol);
                v_bad := v_bad || m.host_id;
                CONTINUE;
            END IF;
        END IF;
        SELECT count(*) INTO v_n FROM round_member a
         WHERE a.project_id = p_project AND a.version = p_version AND a.group_id = m.group_id
           AND a.hi > a.lo;
        v_sum := NULL;
        v_err2 := 0;
        FOR g IN SELECT sketch, err FROM round_sketch_partial WHERE member = m.host_id
                  AND group_id = m.group_id ORDER BY agg LOOP
            v_sum := round_sketch_sum(v_sum, g.sketch);
            v_err2 := v_err2 + g.err ^ 2;
        END LOOP;
        IF v_n = 0 OR (SELECT count(*) FROM round_sketch_partial WHERE member = m.host_id
                        AND group_id = m.group_id) <> v_n THEN
            CONTINUE;
        END IF;
        v_d := round_sketch_norm(v_sum, v_blk);
        v_scale := greatest(round_sketch_norm(v_sum), round_sketch_norm(v_blk), 1e-300);
        v_bound := v_tol * v_scale + 3 * sqrt(v_k) * sqrt(v_err2);
        IF v_d > v_bound THEN
            PERFORM round_seed2_flag_host(p_project, p_version, m.host_id, 'member',
                'the bytes it sent into the all-reduce are not the gradient of its blocks',
                v_d / v_scale, v_bound / v_scale);
            v_bad := v_bad || m.host_id;
        END IF;
    END LOOP;
    -- 2. and 3. Aggregators' results.
    v_bad := v_bad || round_sketch_verify_results(p_project, p_version, true, v_k, v_tol, v_clip, NULL);
    -- Spot checks of the members that passed, at the policy's rate: one
    -- block each (round_seed2_spot_block).
    FOR m IN SELECT rm.host_id FROM round_member rm
              WHERE rm.project_id = p_project AND rm.version = p_version AND rm.included
                AND rm.seed2_sketches ? 'blocks' AND NOT rm.host_id = ANY (v_bad)
              ORDER BY rm.host_id LOOP
        IF round_seed2_owed(p_project, p_version, m.host_id, v_k) THEN
            PERFORM round_seed2_spot_block(p_project, p_version, m.host_id);
        END IF;
    END LOOP;
    -- The round grants that waited for this check: released unless a spot
    -- check holds them (a flagged host's were denied above).
    PERFORM credit_release_all(ARRAY(
        SELECT cg.id FROM credit_grant cg
         WHERE cg.project_id = p_project AND cg.version = p_version AND cg.kind = 'round'
           AND cg.status = 'pending' AND cg.spot_check_id IS NULL), credit_now());
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_bad) x ORDER BY x);
END
$$;

-- A peer's sketches under seed2 of committed round p_version (POST
-- .../rounds/{v}/seed2): 200 once stored (the same again answers the
-- same, other sketches 409); 409 when the round has not committed with a
-- seed2 or the host was not included; 400 when malformed.  Once every
-- included peer of the round sent them, round_seed2_verify runs.
CREATE OR REPLACE FUNCTION round_seed2_report(p_token_hash bytea, p_project text, p_version integer,
                                              p_host bigint, p_sketches jsonb)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    c       record;
    m       record;
    v_k     integer;
    v_why   text;
BEGIN
    SELECT * INTO c FROM round_lookup(p_token_hash, p_project, p_version, p_host);
    IF c.status IS NOT NULL THEN
        RETURN QUERY SELECT c.status, c.body;
        RETURN;
    END IF;
    IF c.state <> 'committed' OR (SELECT seed2 FROM round WHERE project_id = c.project_id
                                     AND version = p_version) IS NULL THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s has not committed with a second seed', p_version),
            'Send the sketches under the second seed once the outcome names it.');
        RETURN;
    END IF;
    SELECT * INTO m FROM round_member rm
     WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.host_id = p_host;
    IF NOT FOUND OR m.included IS NOT TRUE THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('host %s is not among the included peers of round %s', p_host, p_version));
        RETURN;
    END IF;
    v_k := round_seed2_k(c.project_id, p_version);
    IF v_k IS NULL THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('round %s has no sketches of what was averaged', p_version));
        RETURN;
    END IF;
    v_why := round_seed2_invalid(p_sketches, v_k);
    IF v_why IS NOT NULL THEN
        RETURN QUERY SELECT 400, api_error('invalid', v_why);
        RETURN;
    END IF;
    IF m.seed2_sketches IS NOT NULL THEN
        IF m.seed2_sketches = p_sketches THEN
            RETURN QUERY SELECT 200, jsonb_build_object('version', p_version, 'host_id', p_host,
                                                        'stored', true)::text;
        ELSE
            RETURN QUERY SELECT 409, api_error('conflict',
                format('host %s already sent other sketches under the second seed of round %s',
                       p_host, p_version));
        END IF;
        RETURN;
    END IF;
    IF (SELECT seed2_checked_at FROM round WHERE project_id = c.project_id AND version = p_version)
       IS NOT NULL THEN
        RETURN QUERY SELECT 409, api_error('conflict',
            format('the sketches under the second seed of round %s were checked already', p_version),
            'They are due soon after the commit.');
        RETURN;
    END IF;
    UPDATE round_member SET seed2_sketches = p_sketches
     WHERE project_id = c.project_id AND version = p_version AND host_id = p_host;
    -- Is any sketch still due?  The first member found ends the look (a
    -- count, each member's round_seed2_owed, at every one of a thousand
    -- members' posts was cubic in the members).
    IF NOT EXISTS (SELECT 1 FROM round_member rm
                    WHERE rm.project_id = c.project_id AND rm.version = p_version AND rm.included
                      AND rm.seed2_sketches IS NULL
                      AND ((rm.hi > rm.lo AND rm.sketches IS NOT NULL)
                           OR round_seed2_owed(c.project_id, p_version, rm.host_id, v_k))) THEN
        PERFORM round_seed2_verify(c.project_id, p_version, false);
    END IF;
    RETURN QUERY SELECT 200, jsonb_build_object('version', p_version, 'host_id', p_host,
                                                'stored', true)::text;
END
$$;

-- The coordinator's timer: committed rounds whose sketches under seed2 are
-- not all in after the project's spot-check deadline are checked with what
-- came, and a peer that owed its blocks and sent none is flagged.  Returns
-- the rounds checked.
CREATE OR REPLACE FUNCTION round_seed2_expire() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT ro.project_id, ro.version FROM round ro
              WHERE ro.state = 'committed' AND ro.seed2 IS NOT NULL AND ro.seed2_checked_at IS NULL
                AND ro.committed_at + make_interval(secs => coalesce(
                        (spot_policy_of(ro.project_id)).deadline_s, 86400)) < now()
                FOR UPDATE SKIP LOCKED LOOP
        PERFORM round_seed2_verify(r.project_id, r.version, true);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
