-- cotrain functions: the averaged bytes checked against the committed
-- sketches before a round commits (doc/credit.md, "Tied to the bytes").
--
-- Every peer's outcome carries the sketches (shared/common/sketch.h, under
-- the round's seed, spot_sketch_seed) of what it averaged, stored in
-- round_member.sketches:
--   {"k": k,
--    "received": [{"aggregator": id, "sketch": [k numbers]}, ...],
--    "aggregated": {"members": [{"host_id": id, "sketch": [k], "err": e}, ...],
--                   "result": [k], "result_err": e,       (aggregators only)
--                   "group_sum": [k], "group_sum_err": e}} (across groups between
--                                                          the peers: the group's
--                                                          sum before the stage)
-- "err" bounds the L2 norm of the wire encoding's error in that slice,
-- "result_err" that of the result's fp32 rounding and encoding
-- (comp_error_bound).  round_sketch_verify compares them.

-- Why p (an outcome's "sketches") is malformed, or NULL when it is fine.
CREATE OR REPLACE FUNCTION round_sketches_invalid(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k integer;
    e jsonb;
    a jsonb;
BEGIN
    IF jsonb_typeof(p) <> 'object' OR jsonb_typeof(p->'k') <> 'number'
       OR (p->>'k')::numeric NOT BETWEEN 1 AND 256 OR (p->>'k')::numeric % 1 <> 0 THEN
        RETURN 'field "sketches" must be an object with "k" from 1 to 256';
    END IF;
    k := (p->>'k')::integer;
    IF jsonb_typeof(p->'received') <> 'array' OR jsonb_array_length(p->'received') > 256 THEN
        RETURN 'field "sketches.received" must be an array of at most 256 sketches';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(p->'received') x LOOP
        IF coalesce(jsonb_typeof(e->'aggregator') <> 'number'
                    OR (e->>'aggregator')::numeric NOT BETWEEN 1 AND 4e18
                    OR (e->>'aggregator')::numeric % 1 <> 0 OR NOT round_sketch_valid(e->'sketch', k),
                    true) THEN
            RETURN format('field "sketches.received" must hold {"aggregator": host id, "sketch": %s numbers}', k);
        END IF;
    END LOOP;
    a := p->'aggregated';
    IF a IS NULL OR jsonb_typeof(a) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(a) <> 'object' OR jsonb_typeof(a->'members') <> 'array'
       OR jsonb_array_length(a->'members') > 256 OR NOT round_sketch_valid(a->'result', k)
       OR NOT round_sketch_err_valid(a->'result_err') THEN
        RETURN format('field "sketches.aggregated" must hold "members", "result" (%s numbers) and "result_err"', k);
    END IF;
    IF a->'group_sum' IS NOT NULL AND (NOT round_sketch_valid(a->'group_sum', k)
                                       OR NOT round_sketch_err_valid(a->'group_sum_err')) THEN
        RETURN format('field "sketches.aggregated.group_sum" must be %s numbers, with "group_sum_err"', k);
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(a->'members') x LOOP
        IF coalesce(jsonb_typeof(e->'host_id') <> 'number'
                    OR (e->>'host_id')::numeric NOT BETWEEN 1 AND 4e18
                    OR (e->>'host_id')::numeric % 1 <> 0 OR NOT round_sketch_valid(e->'sketch', k)
                    OR NOT round_sketch_err_valid(e->'err'), true) THEN
            RETURN format('field "sketches.aggregated.members" must hold {"host_id", "sketch": %s numbers, "err"}', k);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- True when s is an array of k numbers, each of magnitude below 1e300.
CREATE OR REPLACE FUNCTION round_sketch_valid(s jsonb, k integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_typeof(s) = 'array' AND jsonb_array_length(s) = k
           AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(s) x
                            WHERE jsonb_typeof(x) <> 'number' OR abs(x::text::numeric) >= 1e300), false)
$$;

CREATE OR REPLACE FUNCTION round_sketch_err_valid(e jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_typeof(e) = 'number' AND e::text::numeric >= 0
                    AND e::text::numeric < 1e300, false)
$$;

-- A sketch from its JSON array.
CREATE OR REPLACE FUNCTION round_sketch_vec(s jsonb) RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT x::text::double precision FROM jsonb_array_elements(s) WITH ORDINALITY a(x, i)
                  ORDER BY i)
$$;

-- The L2 norm of a - b (b NULL: of a).
CREATE OR REPLACE FUNCTION round_sketch_norm(a double precision[], b double precision[] DEFAULT NULL)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT sqrt(coalesce(sum((x - coalesce(y, 0)) ^ 2), 0))
      FROM unnest(a, coalesce(b, array_fill(0::double precision, ARRAY[cardinality(a)]))) t(x, y)
$$;

-- The elementwise sum of a and b (a NULL: b).
CREATE OR REPLACE FUNCTION round_sketch_sum(a double precision[], b double precision[])
RETURNS double precision[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN a IS NULL THEN b
                ELSE ARRAY(SELECT x + y FROM unnest(a, b) WITH ORDINALITY t(x, y, i) ORDER BY i) END
$$;

-- The sketch host p_host committed for version p_version (the sum of the
-- sketches of every microbatch of its counted work units), or NULL when
-- it cannot be told: a unit without sketches under k, or units whose
-- samples are not the p_samples it averaged.
CREATE OR REPLACE FUNCTION round_sketch_committed(p_project bigint, p_version integer, p_host bigint,
                                                  p_k integer, p_samples bigint)
RETURNS double precision[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_mb    bigint;
    v_units bigint;
    v_with  bigint;
    v_size  integer;
BEGIN
    SELECT microbatch_size INTO v_size FROM project WHERE id = p_project;
    SELECT coalesce(sum(w.mb_done), 0), count(*),
           count(*) FILTER (WHERE ws.k = p_k AND cardinality(ws.sketches) = w.mb_done * p_k)
      INTO v_mb, v_units, v_with
      FROM work_unit w LEFT JOIN work_unit_sketch ws ON ws.work_unit_id = w.id
     WHERE w.project_id = p_project AND w.version = p_version AND w.host_id = p_host
       AND w.mb_done > 0;
    IF v_units = 0 OR v_with <> v_units OR v_mb * v_size <> p_samples THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT sum(x) FROM work_unit w JOIN work_unit_sketch ws ON ws.work_unit_id = w.id,
                        unnest(ws.sketches) WITH ORDINALITY u(x, i)
                  WHERE w.project_id = p_project AND w.version = p_version AND w.host_id = p_host
                    AND w.mb_done > 0
                  GROUP BY (i - 1) % p_k ORDER BY (i - 1) % p_k);
END
$$;

-- Flag p_host for failing a check of round (p_project, p_version): a
-- round_sketch_flag row; its credit for the round denied (a denied grant
-- the commit cannot turn into another), every pending grant of it denied
-- and its spot check record back to 0, as a failed spot check does.
CREATE OR REPLACE FUNCTION round_sketch_flag_host(p_project bigint, p_version integer, p_attempt integer,
                                                  p_host bigint, p_role text, p_reason text,
                                                  p_distance double precision, p_tolerance double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_why text := format('round %s: %s', p_version, p_reason);
BEGIN
    INSERT INTO round_sketch_flag (project_id, version, attempt, host_id, role, reason, distance, tolerance)
    VALUES (p_project, p_version, p_attempt, p_host, p_role, p_reason, p_distance, p_tolerance);
    INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, team_id, samples,
                              flops, credit, status, reason, work_start, created_at)
    SELECT 'round', p_project, p_version, h.id, h.account_id, a.team_id, 0, 0, 0, 'denied', v_why,
           credit_now(), credit_now()
      FROM host h JOIN account a ON a.id = h.account_id WHERE h.id = p_host
    ON CONFLICT (project_id, version, host_id, kind) DO NOTHING;
    UPDATE credit_grant SET status = 'denied', reason = v_why
     WHERE host_id = p_host AND status = 'pending';
    PERFORM spot_record(p_host, false, credit_now());
END
$$;

-- Serialize, until the end of the transaction, what flags a host of
-- p_project for good (the check under a second seed, round_seed2_verify; a
-- spot check settled against it, spot_ban) with its commits and work
-- assignment: a commit that waited for a flag sees it (round_try_commit
-- reads round_banned_hosts after taking the lock), and a flag that waited
-- for a commit comes after it.
CREATE OR REPLACE FUNCTION round_flag_lock(p_project bigint) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext('cotrain round_flag ' || p_project))
$$;

-- The hosts of p_project flagged for good (round_sketch_flag.lasting: under
-- a second seed, or by a spot check its checker and a third host settled
-- against it), in any round: left out of its later rounds.
CREATE OR REPLACE FUNCTION round_banned_hosts(p_project bigint) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT DISTINCT host_id FROM round_sketch_flag
                  WHERE project_id = p_project AND lasting ORDER BY host_id)
$$;

-- The flags that keep a host out of round p_version of p_project: a flag
-- of any attempt of that version (round_sketch_verify: its later attempts
-- run without the host) and a lasting flag of any round of the project
-- (round_seed2_verify, spot_ban: its later rounds).  The plan
-- (round_plan_begin) and work assignment (sched_assign) leave out the same
-- hosts.
CREATE OR REPLACE FUNCTION round_sketch_bars(p_project bigint, p_version integer)
RETURNS SETOF round_sketch_flag LANGUAGE sql STABLE AS $$
    SELECT * FROM round_sketch_flag
     WHERE project_id = p_project AND (version = p_version OR lasting)
$$;

-- The hosts round_sketch_bars keeps out (ascending, each once).
CREATE OR REPLACE FUNCTION round_sketch_barred(p_project bigint, p_version integer) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT DISTINCT host_id FROM round_sketch_bars(p_project, p_version) ORDER BY host_id)
$$;

-- Flag p_host for failing a check of round (p_project, p_version): under
-- the work unit's seed (p_seed2 false) round_sketch_flag_host, at attempt
-- p_attempt; under seed2 round_seed2_flag_host (round_sketch_seed2.sql).
CREATE OR REPLACE FUNCTION round_sketch_flag_as(p_seed2 boolean, p_project bigint, p_version integer,
                                                p_attempt integer, p_host bigint, p_role text,
                                                p_reason text, p_distance double precision,
                                                p_tolerance double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_seed2 THEN
        PERFORM round_seed2_flag_host(p_project, p_version, p_host, p_role, p_reason, p_distance,
                                      p_tolerance);
    ELSE
        PERFORM round_sketch_flag_host(p_project, p_version, p_attempt, p_host, p_role, p_reason,
                                       p_distance, p_tolerance);
    END IF;
END
$$;

-- Every aggregator's partials of round (p_project, p_version) under one
-- seed, parsed once into the temporary table round_sketch_partial (agg,
-- member, group_id, sketch, err) of this transaction (created without a
-- notice when it is not there yet; emptied first): from the outcomes'
-- "sketches" (p_seed2 false: included aggregators and those their group
-- left out, outcome 'dropped') or the sketches under seed2 (p_seed2 true:
-- included aggregators), of aggregators of a non-empty range whose
-- sketches hold p_k values.
CREATE OR REPLACE FUNCTION round_sketch_partials_load(p_project bigint, p_version integer,
                                                      p_seed2 boolean, p_k integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('pg_temp.round_sketch_partial') IS NULL THEN
        CREATE TEMP TABLE round_sketch_partial (agg bigint, member bigint, group_id integer,
            sketch double precision[], err double precision) ON COMMIT DROP;
    END IF;
    DELETE FROM round_sketch_partial;
    INSERT INTO round_sketch_partial
    SELECT rm.host_id, (e->>'host_id')::bigint, rm.group_id, round_sketch_vec(e->'sketch'),
           (e->>'err')::double precision
      FROM round_member rm,
           LATERAL (SELECT CASE WHEN p_seed2 THEN rm.seed2_sketches ELSE rm.sketches END AS s) x,
           jsonb_array_elements(x.s->'aggregated'->'members') e
     WHERE rm.project_id = p_project AND rm.version = p_version AND rm.hi > rm.lo
       AND (rm.included OR (NOT p_seed2 AND rm.outcome = 'dropped'))
       AND (x.s->>'k')::integer = p_k;
END
$$;

-- Checks 2 and 3 of round_sketch_verify (p_seed2 false) and of
-- round_seed2_verify (p_seed2 true), on the aggregators whose partials
-- round_sketch_partials_load loaded (the same p_seed2 and p_k), with the
-- tolerance p_tol:
--   2. with the exact sum (not p_clip), each aggregator's result against
--      the sum of its members' partials (E: "result_err"); across groups
--      between the peers, where its result is the round's mean, its
--      "group_sum" with "group_sum_err" in its place (under the work
--      unit's seed where it sent one; under seed2 always: an aggregator of
--      such a round that sent none is flagged);
--   3. each included member's sketch of an aggregator's result against
--      that result (1e-9: the same bytes; both flagged on a mismatch).
-- Flags who fails (round_sketch_flag_as, p_attempt for the work unit's
-- seed) and returns them (in the order flagged, possibly twice).
CREATE OR REPLACE FUNCTION round_sketch_verify_results(p_project bigint, p_version integer,
                                                       p_seed2 boolean, p_k integer,
                                                       p_tol double precision, p_clip boolean,
                                                       p_attempt integer)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    g       record;
    m       record;
    v_sum   double precision[];
    v_d     double precision;
    v_scale double precision;
    v_bound double precision;
    v_bad   bigint[] := '{}';
    v_cross boolean;
BEGIN
    SELECT coalesce(cross_peers, false) INTO v_cross FROM round
     WHERE project_id = p_project AND version = p_version;
    FOR g IN SELECT rm.host_id, rm.group_id, round_sketch_vec(x.s->'aggregated'->'result') AS res,
                    round_sketch_vec(CASE WHEN NOT p_seed2
                                          THEN coalesce(x.s->'aggregated'->'group_sum',
                                                        x.s->'aggregated'->'result')
                                          WHEN v_cross THEN x.s->'aggregated'->'group_sum'
                                          ELSE x.s->'aggregated'->'result' END) AS gsum,
                    (CASE WHEN NOT p_seed2
                          THEN coalesce(x.s->'aggregated'->>'group_sum_err',
                                        x.s->'aggregated'->>'result_err')
                          WHEN v_cross THEN x.s->'aggregated'->>'group_sum_err'
                          ELSE x.s->'aggregated'->>'result_err' END)::double precision AS gerr
               FROM round_member rm,
                    LATERAL (SELECT CASE WHEN p_seed2 THEN rm.seed2_sketches ELSE rm.sketches END AS s) x
              WHERE rm.project_id = p_project AND rm.version = p_version
                AND (rm.included OR (NOT p_seed2 AND rm.outcome = 'dropped'))
                AND rm.hi > rm.lo AND (x.s->>'k')::integer = p_k
                AND x.s->'aggregated' IS NOT NULL
              ORDER BY rm.host_id LOOP
        IF g.gsum IS NULL AND NOT p_clip THEN
            -- (under seed2 across groups between the peers: the sum its
            -- partials add up to is not its result, the round's mean)
            PERFORM round_sketch_flag_as(p_seed2, p_project, p_version, p_attempt, g.host_id,
                'aggregator', 'it sent no sketch of its group''s sum before the stage across groups',
                1, p_tol);
            v_bad := v_bad || g.host_id;
        ELSIF NOT p_clip THEN
            v_sum := NULL;
            FOR m IN SELECT sketch FROM round_sketch_partial WHERE agg = g.host_id ORDER BY member LOOP
                v_sum := round_sketch_sum(v_sum, m.sketch);
            END LOOP;
            IF v_sum IS NOT NULL THEN
                v_d := round_sketch_norm(g.gsum, v_sum);
                v_scale := greatest(round_sketch_norm(g.gsum), round_sketch_norm(v_sum), 1e-300);
                v_bound := p_tol * v_scale + 3 * sqrt(p_k) * g.gerr;
                IF v_d > v_bound THEN
                    PERFORM round_sketch_flag_as(p_seed2, p_project, p_version, p_attempt, g.host_id,
                        'aggregator', 'the sum it returned is not the sum of the slices it received',
                        v_d / v_scale, v_bound / v_scale);
                    v_bad := v_bad || g.host_id;
                END IF;
            END IF;
        END IF;
        FOR m IN SELECT rm.host_id, round_sketch_vec(e->'sketch') AS got
                   FROM round_member rm,
                        LATERAL (SELECT CASE WHEN p_seed2 THEN rm.seed2_sketches ELSE rm.sketches END AS s) x,
                        jsonb_array_elements(x.s->'received') e
                  WHERE rm.project_id = p_project AND rm.version = p_version AND rm.included
                    AND rm.group_id = g.group_id AND (x.s->>'k')::integer = p_k
                    AND (e->>'aggregator')::bigint = g.host_id
                  ORDER BY rm.host_id LOOP
            v_d := round_sketch_norm(m.got, g.res);
            v_scale := greatest(round_sketch_norm(m.got), round_sketch_norm(g.res), 1e-300);
            IF v_d > 1e-9 * v_scale THEN
                PERFORM round_sketch_flag_as(p_seed2, p_project, p_version, p_attempt, m.host_id, 'member',
                    format('the result it says it received from host %s is not the one that host says it returned',
                           g.host_id), v_d / v_scale, 1e-9);
                PERFORM round_sketch_flag_as(p_seed2, p_project, p_version, p_attempt, g.host_id, 'aggregator',
                    format('host %s says it received another result than the one this host says it returned',
                           m.host_id), v_d / v_scale, 1e-9);
                v_bad := v_bad || m.host_id || g.host_id;
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_bad;
END
$$;

-- Check the sketches of round (p_project, p_version), once every included
-- peer reported ok, and flag who fails (round_sketch_flag_host).  Returns
-- the flagged hosts (ascending, each once).  With tol the project's spot
-- tolerance (fp32 sums in another order, thread count or BLAS) and E a
-- bound on the L2 norm of the wire encodings' error in the vectors
-- compared, a difference d of two sketches passes when
--     ||d|| <= tol max(||a||, ||b||) + 3 sqrt(k) E.
-- (Each of d's k values is a +-1 projection of an error vector of norm at
-- most E: a sub-Gaussian sum of variance at most E^2, so ||d||^2 is at
-- most about chi-square with k degrees times E^2, which exceeds 9 k E^2
-- with probability about 1e-22 at k = 16; rounding to nearest errs by
-- about E / sqrt(3), which makes it far smaller.)
--   1. Each included member: the sum of its partials over its group's
--      aggregators against the sketch it committed (round_sketch_committed);
--      E^2 = sum of the aggregators' "err"^2.
--   2. Each aggregator (with the exact sum, not CenteredClip): its result
--      against the sum of its members' partials; E = "result_err".  Across
--      groups between the peers its result is the round's mean: its
--      "group_sum" (the sum before that stage) is compared instead, with
--      E = "group_sum_err".
--   3. Each member's received sketch of an aggregator's result against
--      that result: the same bytes sketched the same way, so equal up to
--      the JSON round trip (1e-9).  One of the two lies: both are flagged
--      (as BTARD's accusations remove accuser and accused).
-- (2 and 3: round_sketch_verify_results, shared with the check under
-- seed2.)
--   4. A group of one peer on the server's path: the server's own sketch
--      of the sum it uploaded (round_group_sum.sketch, taken as it kept
--      the upload) against the sketch it committed: alone, no other peer
--      saw its bytes, and its own sketches of them are only its claim.
-- Aggregators their group left out report their sketches too (outcome
-- 'dropped'; round_try_commit waits for them).  A check whose inputs are
-- missing (a peer reported no sketches: an older client, local mode) is
-- skipped.
CREATE OR REPLACE FUNCTION round_sketch_verify(p_project bigint, p_version integer) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_attempt integer;
    v_tol     double precision;
    v_clip    boolean;
    v_k       integer;
    m         record;
    g         record;
    v_sum     double precision[];
    v_err2    double precision;
    v_n       integer;
    v_com     double precision[];
    v_d       double precision;
    v_scale   double precision;
    v_bound   double precision;
    v_bad     bigint[] := '{}';
BEGIN
    SELECT ro.attempt, coalesce((p.config->>'aggregation') = 'centered_clip', false)
      INTO v_attempt, v_clip
      FROM round ro JOIN project p ON p.id = ro.project_id
     WHERE ro.project_id = p_project AND ro.version = p_version;
    v_tol := coalesce((spot_policy_of(p_project)).tolerance, 1e-3);
    -- 4. (first: it needs no sketch from the peer) A group of one peer: the
    -- server's own sketch of the sum it uploaded against the sketch it
    -- committed; no wire encoding between them.
    FOR g IN SELECT (s.included->>0)::bigint AS host_id, s.sketch, rm.samples FROM round_group_sum s
               JOIN round_member rm ON rm.project_id = s.project_id AND rm.version = s.version
                                   AND rm.host_id = (s.included->>0)::bigint
              WHERE s.project_id = p_project AND s.version = p_version AND s.sketch IS NOT NULL
                AND jsonb_array_length(s.included) = 1 AND rm.included
                AND round_group_size(p_project, p_version, s.group_id) = 1
              ORDER BY 1 LOOP
        v_com := round_sketch_committed(p_project, p_version, g.host_id, cardinality(g.sketch), g.samples);
        CONTINUE WHEN v_com IS NULL;
        v_d := round_sketch_norm(g.sketch, v_com);
        v_scale := greatest(round_sketch_norm(g.sketch), round_sketch_norm(v_com), 1e-300);
        IF v_d > v_tol * v_scale THEN
            PERFORM round_sketch_flag_host(p_project, p_version, v_attempt, g.host_id, 'member',
                'the group sum it uploaded alone differs from the sketches it committed',
                v_d / v_scale, v_tol);
            v_bad := v_bad || g.host_id;
        END IF;
    END LOOP;
    SELECT min((sketches->>'k')::integer) INTO v_k FROM round_member
     WHERE project_id = p_project AND version = p_version AND included AND sketches IS NOT NULL;
    IF v_k IS NULL THEN
        RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_bad) x ORDER BY x);
    END IF;
    PERFORM round_sketch_partials_load(p_project, p_version, false, v_k);
    -- 1. Members against their commitments.
    FOR m IN SELECT rm.host_id, rm.group_id, rm.samples FROM round_member rm
              WHERE rm.project_id = p_project AND rm.version = p_version AND rm.included
              ORDER BY rm.host_id LOOP
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
        IF (SELECT count(*) FROM round_sketch_partial WHERE member = m.host_id
             AND group_id = m.group_id) <> v_n OR v_n = 0 THEN
            CONTINUE;
        END IF;
        v_com := round_sketch_committed(p_project, p_version, m.host_id, v_k, m.samples);
        IF v_com IS NULL THEN
            CONTINUE;
        END IF;
        v_d := round_sketch_norm(v_sum, v_com);
        v_scale := greatest(round_sketch_norm(v_sum), round_sketch_norm(v_com), 1e-300);
        v_bound := v_tol * v_scale + 3 * sqrt(v_k) * sqrt(v_err2);
        IF v_d > v_bound THEN
            PERFORM round_sketch_flag_host(p_project, p_version, v_attempt, m.host_id, 'member',
                'the bytes it sent into the all-reduce differ from the sketches it committed',
                v_d / v_scale, v_bound / v_scale);
            v_bad := v_bad || m.host_id;
        END IF;
    END LOOP;
    -- 2. and 3. Aggregators' results.
    v_bad := v_bad || round_sketch_verify_results(p_project, p_version, false, v_k, v_tol, v_clip,
                                                  v_attempt);
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_bad) x ORDER BY x);
END
$$;

-- The peers the plan put in group p_group of round (p_project, p_version).
CREATE OR REPLACE FUNCTION round_group_size(p_project bigint, p_version integer, p_group integer)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM round_member
     WHERE project_id = p_project AND version = p_version AND group_id = p_group
$$;

-- Keep the server's sketch p_sketch of the group sum p_sha that group
-- p_group of round (p_project, p_version) kept, when the group is one peer
-- (check 4 of round_sketch_verify); nothing for a group of several, even
-- when it included one of them: that sum crossed the wire encodings.
CREATE OR REPLACE FUNCTION round_group_sum_sketch(p_project bigint, p_version integer, p_group integer,
                                                  p_sha text, p_sketch double precision[])
RETURNS void LANGUAGE sql AS $$
    UPDATE round_group_sum SET sketch = p_sketch
     WHERE project_id = p_project AND version = p_version AND group_id = p_group
       AND sum_sha256 = p_sha AND jsonb_array_length(included) = 1
       AND round_group_size(p_project, p_version, p_group) = 1
$$;

-- The included hosts of round (p_project, p_version) whose bytes cannot be
-- checked although their group sketches: an aggregator of their group
-- (a.hi > a.lo) gave no partial sketch of their slice, having reported
-- 'failed' (which a peer its group left out may do after the group's sum
-- was kept) or no sketches.  Check 1 of round_sketch_verify skips such a
-- host; committed, its bytes would be unchecked (a 100x gradient in a group
-- of two, whose other aggregator was left out, went through this way), so
-- round_try_commit reruns the round instead.  Empty when no included host
-- sketched (local mode, an older client): nothing is checked then; a group
-- of one peer has no aggregator but itself and is not counted here.
CREATE OR REPLACE FUNCTION round_sketch_unverifiable(p_project bigint, p_version integer) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(
        SELECT m.host_id FROM round_member m
         WHERE m.project_id = p_project AND m.version = p_version AND m.included
           AND EXISTS (SELECT 1 FROM round_member s
                        WHERE s.project_id = p_project AND s.version = p_version
                          AND s.group_id = m.group_id AND s.included AND s.sketches IS NOT NULL)
           AND round_group_size(p_project, p_version, m.group_id) > 1
           AND EXISTS (SELECT 1 FROM round_member a
                        WHERE a.project_id = p_project AND a.version = p_version
                          AND a.group_id = m.group_id AND a.hi > a.lo
                          AND NOT coalesce((a.included OR a.outcome = 'dropped')
                                  AND jsonb_typeof(a.sketches->'aggregated'->'members') = 'array'
                                  AND EXISTS (SELECT 1 FROM jsonb_array_elements(a.sketches->'aggregated'->'members') e
                                               WHERE e->>'host_id' = m.host_id::text), false))
         ORDER BY m.host_id)
$$;

-- The hosts flagged in version p_version of p_project (they take no part in
-- its later attempts: round_plan_begin).
CREATE OR REPLACE FUNCTION round_sketch_flagged(p_project bigint, p_version integer) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT DISTINCT host_id FROM round_sketch_flag
                  WHERE project_id = p_project AND version = p_version ORDER BY host_id)
$$;

-- A host's flags for the host page and API: the count and the latest 20.
CREATE OR REPLACE FUNCTION round_sketch_flags_json(p_host bigint) RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT json_build_object('count', (SELECT count(*) FROM round_sketch_flag WHERE host_id = p_host),
        'latest', coalesce((SELECT json_agg(json_build_object('project', pr.name, 'version', f.version,
                                'attempt', f.attempt, 'role', f.role, 'reason', f.reason,
                                'distance', f.distance, 'tolerance', f.tolerance,
                                'created_at', f.created_at) ORDER BY f.id DESC)
                              FROM (SELECT * FROM round_sketch_flag WHERE host_id = p_host
                                     ORDER BY id DESC LIMIT 20) f
                              JOIN project pr ON pr.id = f.project_id), '[]'))
$$;
