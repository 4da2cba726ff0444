-- cotrain functions: spot checks (doc/credit.md), BOINC's adaptive
-- replication.  When a round commits, each accepted host is checked with a
-- probability that falls geometrically as its record of consecutive
-- agreeing checks grows (spot_rate).
-- A host that reported the sketch of each microbatch's gradient
-- (shared/common/sketch.h, under the round's sketch seed) is checked on a
-- few of them (the policy's microbatches): a second host recomputes those
-- and the server compares its sketches with the committed ones; a
-- disagreement brings a third host, and the two that agree win.  A host
-- that reported no sketches (local mode) is checked as before: a second
-- host recomputes the whole range and both send a fingerprint under a seed
-- drawn at commit.  While a check is open the host's grant for that round
-- is pending; agreement grants it (and credits the checker), disagreement
-- denies it and every other pending grant of the host and resets its
-- record.  Every project gets the default policy (spot_policy_default); a
-- maintainer may change or delete its row.

-- The policy of a project; without a row, checks are off.
CREATE OR REPLACE FUNCTION spot_policy_of(p_project bigint) RETURNS spot_policy LANGUAGE sql STABLE AS $$
    SELECT coalesce(s, ROW(p_project, 2147483647, 0, 0, 16, 1e-3, 86400, 2, 0.5)::spot_policy)
      FROM (SELECT NULL) x LEFT JOIN spot_policy s ON s.project_id = p_project
$$;

-- The probability of checking a host with this record (consecutive
-- agreeing checks) under this policy: first_rate below trusted_after, then
-- multiplied by decay for each further agreeing check, never below
-- min_rate.  A host that cheats on a fraction f of its microbatches passes
-- a check with probability (1 - f)^microbatches, so the chance that it
-- reaches a low rate shrinks as fast as the rate does; a failure puts the
-- record, and the rate, back to the start (spot_record).
CREATE OR REPLACE FUNCTION spot_rate(p spot_policy, p_record integer) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_record < p.trusted_after THEN p.first_rate
                ELSE greatest(p.min_rate, p.first_rate * exp(greatest(
                         ln(p.decay) * (p_record - p.trusted_after + 1)::double precision, -700)))
           END
$$;

-- Trigger project_spot_policy: every new project gets the default policy.
CREATE OR REPLACE FUNCTION spot_policy_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spot_policy (project_id) VALUES (NEW.id) ON CONFLICT (project_id) DO NOTHING;
    RETURN NEW;
END
$$;

-- The sketch seed of round p_version of p_project: derived from the
-- project's secret, so it exists before the round's row does and is the
-- same for every work unit of the round.
CREATE OR REPLACE FUNCTION spot_sketch_seed(p_project bigint, p_version integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT ('x' || substr(md5(p.sketch_secret::text || ':' || p_version), 1, 16))::bit(64)::bigint
      FROM project p WHERE p.id = p_project
$$;

-- The microbatches of a block whose gradient a host keeps for the check
-- under a second seed (round_sketch_seed2.sql): the size of a check, or
-- more where a round's target holds more than 16 checks' worth, so that a
-- member keeps at most about 16 gradient copies a round plus one per work
-- unit (blocks never span units), whatever the target; 1,024 at most (the
-- client's CL_BLOCK_MAX).  A block check recomputes one block.
CREATE OR REPLACE FUNCTION round_seed2_block(p_project bigint) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT least(1024, greatest(s.microbatches,
                                ceil(p.target_batch::numeric / p.microbatch_size / 16)::integer))
      FROM spot_policy s JOIN project p ON p.id = s.project_id
     WHERE s.project_id = p_project
$$;

-- What a work unit tells its host to sketch: {"seed", "k", "block"}, or
-- NULL when the project is not checked.  "block": round_seed2_block.
CREATE OR REPLACE FUNCTION spot_sketch_params(p_project bigint, p_version integer) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('seed', spot_sketch_seed(p_project, p_version)::text, 'k', s.k,
                              'block', round_seed2_block(p_project))
      FROM spot_policy s WHERE s.project_id = p_project
$$;

-- Why p is not p_mb sketches of p_k finite numbers each, or NULL when it is.
CREATE OR REPLACE FUNCTION spot_sketches_invalid(p jsonb, p_mb bigint, p_k integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(p) <> 'array' THEN
        RETURN 'field "sketches" must be an array of sketches';
    END IF;
    IF jsonb_array_length(p) <> p_mb THEN
        RETURN format('field "sketches" holds %s sketches, not one for each of the %s microbatches done',
                      jsonb_array_length(p), p_mb);
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p) e
                WHERE jsonb_typeof(e) <> 'array' OR jsonb_array_length(e) <> p_k) THEN
        RETURN format('each sketch must be an array of %s numbers (the project''s k)', p_k);
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p) e, jsonb_array_elements(e) x
                WHERE CASE WHEN jsonb_typeof(x) = 'number' THEN abs(x::text::numeric) > 1e300
                           ELSE true END) THEN
        RETURN 'each sketch value must be a number of magnitude at most 1e300';
    END IF;
    RETURN NULL;
END
$$;

-- The sketches of p (checked by spot_sketches_invalid) as one flat array,
-- row after row.
CREATE OR REPLACE FUNCTION spot_sketches_flat(p jsonb) RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT x::text::double precision
                   FROM jsonb_array_elements(p) WITH ORDINALITY a(e, i),
                        jsonb_array_elements(e) WITH ORDINALITY b(x, j)
                  ORDER BY i, j)
$$;

-- The distance of two answers to a check: rows of p_k values (one row per
-- microbatch; one row for a whole-range fingerprint), the largest of the
-- rows' ||a - b|| / max(||a||, ||b||).
CREATE OR REPLACE FUNCTION spot_distance(a double precision[], b double precision[], p_k integer)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(max(CASE WHEN greatest(na, nb) > 0 THEN sqrt(d) / sqrt(greatest(na, nb))
                             ELSE 0 END), 0)
      FROM (SELECT (o - 1) / p_k AS r, sum((x - y) ^ 2) AS d, sum(x ^ 2) AS na, sum(y ^ 2) AS nb
              FROM unnest(a, b) WITH ORDINALITY u(x, y, o) GROUP BY 1) t
$$;

-- A host's record after a check of its work (p_agreed) or after it
-- disagreed, as a checker, with the two that agreed.
CREATE OR REPLACE FUNCTION spot_record(p_host bigint, p_agreed boolean, p_now timestamptz) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO host_check_record AS r (host_id, consecutive, n_agreed, n_disagreed, last_at)
    VALUES (p_host, CASE WHEN p_agreed THEN 1 ELSE 0 END, CASE WHEN p_agreed THEN 1 ELSE 0 END,
            CASE WHEN p_agreed THEN 0 ELSE 1 END, p_now)
    ON CONFLICT (host_id) DO UPDATE
       SET consecutive = CASE WHEN p_agreed THEN r.consecutive + 1 ELSE 0 END,
           n_agreed = r.n_agreed + CASE WHEN p_agreed THEN 1 ELSE 0 END,
           n_disagreed = r.n_disagreed + CASE WHEN p_agreed THEN 0 ELSE 1 END,
           last_at = p_now
$$;

-- A 'check' grant to p_host for the samples it recomputed in check c,
-- granted at once.
CREATE OR REPLACE FUNCTION spot_credit_checker(c spot_check, p_host bigint, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    g       record;
    v_grant bigint;
BEGIN
    SELECT h.id AS host_id, h.account_id, a.team_id, p.flops_per_sample INTO g
      FROM host h JOIN account a ON a.id = h.account_id, project p
     WHERE h.id = p_host AND p.id = c.project_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, team_id, samples,
                              flops, credit, status, work_start, created_at, spot_check_id)
    VALUES ('check', c.project_id, c.version, g.host_id, g.account_id, g.team_id, c.samples,
            g.flops_per_sample * c.samples,
            g.flops_per_sample * c.samples / credit_flops_per_credit(), 'pending',
            coalesce(c.assigned_at, c.created_at), p_now, c.id)
    ON CONFLICT (project_id, version, host_id, kind) DO NOTHING
    RETURNING id INTO v_grant;
    IF v_grant IS NOT NULL THEN
        PERFORM credit_release(v_grant, p_now);
    END IF;
END
$$;

-- The checked host of check c was right: its grant is granted, its record
-- grows.
CREATE OR REPLACE FUNCTION spot_host_agreed(c spot_check, p_distance double precision, p_outcome text,
                                            p_now timestamptz) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE spot_check SET state = 'agreed', distance = p_distance, resolved_at = p_now,
                          outcome = p_outcome
     WHERE id = c.id;
    PERFORM spot_record(c.host_id, true, p_now);
    PERFORM credit_release(g.id, p_now)
       FROM credit_grant g
      WHERE g.kind = 'round' AND g.project_id = c.project_id AND g.version = c.version
        AND g.host_id = c.host_id;
END
$$;

-- The checked host of check c was wrong: this grant and every other pending
-- grant of the host are denied, its record drops to 0.
CREATE OR REPLACE FUNCTION spot_host_denied(c spot_check, p_distance double precision, p_outcome text,
                                            p_now timestamptz) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE spot_check SET state = 'disagreed', distance = p_distance, resolved_at = p_now,
                          outcome = p_outcome
     WHERE id = c.id;
    PERFORM spot_record(c.host_id, false, p_now);
    UPDATE credit_grant SET status = 'denied',
           reason = format('spot check %s: %s', c.id, p_outcome)
     WHERE host_id = c.host_id AND status = 'pending';
END
$$;

-- The checker and a third host of check c (of committed microbatch
-- sketches) both disagreed with the host, p_outcome says how: the host is
-- denied (spot_host_denied) and flagged for good, as a host the check
-- under a second seed flagged: a lasting round_sketch_flag naming the
-- check keeps it out of the project's later rounds (round_sketch_bars,
-- round_banned_hosts; a round planned with it reruns without it,
-- round_try_commit).  Under round_flag_lock, taken before any grant is
-- touched (a commit takes it before it grants).
CREATE OR REPLACE FUNCTION spot_ban(c spot_check, p_outcome text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM round_flag_lock(c.project_id);
    PERFORM spot_host_denied(c, c.distance, p_outcome, p_now);
    INSERT INTO round_sketch_flag (project_id, version, attempt, host_id, role, reason, distance,
                                   tolerance, lasting, spot_check_id, created_at)
    VALUES (c.project_id, c.version,
            coalesce((SELECT attempt FROM round WHERE project_id = c.project_id AND version = c.version), 1),
            c.host_id, 'member', format('spot check %s: %s', c.id, p_outcome), c.distance,
            c.tolerance, true, c.id, clock_timestamp());
END
$$;

-- May host p_host (of account p_acc) answer check c, as its checker or as
-- its third?  Not a host of the checked host's account, nor of the first
-- checker's; not the checked host's averaging partner in the round when the
-- round had more than one group (with one group every host is everyone's
-- partner); and not a host that answered the checked host's previous or
-- next check (a third comes after the next check may have been answered),
-- so that no one host vouches for another twice in a row: a friend can
-- answer at most every other check of a host, and each dispute is settled
-- by a third of yet another account.  A dispute no host may settle expires
-- at its deadline, denied (spot_settle).  (A rule that let a host's own checks
-- bar others from checking it would let a cheater that checks everyone
-- make itself unchecked.)
CREATE OR REPLACE FUNCTION spot_may_answer(c spot_check, p_host bigint, p_acc bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_host <> c.host_id
       AND p_host IS DISTINCT FROM c.checker_id
       AND NOT EXISTS (SELECT 1 FROM host h WHERE h.id IN (c.host_id, c.checker_id)
                                            AND h.account_id = p_acc)
       AND NOT EXISTS (SELECT 1 FROM round_member a
                         JOIN round_member b ON b.project_id = a.project_id
                                            AND b.version = a.version AND b.group_id = a.group_id
                        WHERE a.project_id = c.project_id AND a.version = c.version
                          AND a.host_id = c.host_id AND b.host_id = p_host
                          AND EXISTS (SELECT 1 FROM round_member g
                                       WHERE g.project_id = a.project_id AND g.version = a.version
                                         AND g.group_id <> a.group_id))
       AND NOT EXISTS (SELECT 1 FROM spot_check o
                        WHERE o.id IN ((SELECT max(o2.id) FROM spot_check o2
                                         WHERE o2.host_id = c.host_id AND o2.id < c.id),
                                       (SELECT min(o2.id) FROM spot_check o2
                                         WHERE o2.host_id = c.host_id AND o2.id > c.id))
                          AND p_host IN (o.checker_id, o.third_id))
$$;

-- Settle check p_check (its row locked by the caller) with what it holds at
-- p_now.  Host and checker agree within the tolerance: the host is right.
-- They differ: a whole-range check denies the host (with two answers, which
-- one is wrong is unknown, and the host may recompute when asked); a check
-- of committed microbatches waits for a third host, and then the host is
-- right when the third agrees with it (the checker's record drops), wrong
-- when the third agrees with the checker, and denied on a tie.  Past the
-- deadline: a host whose fingerprint never came, or whose dispute found no
-- third, is denied; one whose checker never came is granted.  Returns the
-- check's state.
CREATE OR REPLACE FUNCTION spot_settle(p_check bigint, p_now timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    c      spot_check;
    v_hc   double precision;
    v_ht   double precision;
    v_ct   double precision;
BEGIN
    SELECT * INTO c FROM spot_check WHERE id = p_check;
    IF c.state <> 'open' THEN
        RETURN c.state;
    END IF;
    IF c.fp_host IS NOT NULL AND c.fp_checker IS NOT NULL AND c.disputed_at IS NULL THEN
        v_hc := spot_distance(c.fp_host, c.fp_checker, c.k);
        IF v_hc <= c.tolerance THEN
            PERFORM spot_host_agreed(c, v_hc, 'the checker agreed', p_now);
            PERFORM spot_credit_checker(c, c.checker_id, p_now);
            RETURN 'agreed';
        END IF;
        IF c.microbatches IS NULL THEN
            PERFORM spot_host_denied(c, v_hc, format('the checker disagreed (distance %s)', v_hc), p_now);
            RETURN 'disagreed';
        END IF;
        UPDATE spot_check SET disputed_at = p_now, distance = v_hc,
               deadline = greatest(deadline, p_now + make_interval(
                   secs => (spot_policy_of(c.project_id)).deadline_s))
         WHERE id = p_check;
        RETURN 'open';
    END IF;
    IF c.disputed_at IS NOT NULL AND c.fp_third IS NOT NULL THEN
        v_ht := spot_distance(c.fp_host, c.fp_third, c.k);
        v_ct := spot_distance(c.fp_checker, c.fp_third, c.k);
        IF v_ht <= c.tolerance THEN
            PERFORM spot_host_agreed(c, v_ht, format(
                'the third host agreed with the host; the checker disagreed (distance %s)',
                c.distance), p_now);
            PERFORM spot_credit_checker(c, c.third_id, p_now);
            PERFORM spot_record(c.checker_id, false, p_now);
            RETURN 'agreed';
        ELSIF v_ct <= c.tolerance THEN
            PERFORM spot_ban(c, format(
                'the checker and a third host disagreed with the committed sketches (distances %s, %s)',
                c.distance, v_ht), p_now);
            PERFORM spot_credit_checker(c, c.checker_id, p_now);
            PERFORM spot_credit_checker(c, c.third_id, p_now);
            RETURN 'disagreed';
        END IF;
        PERFORM spot_host_denied(c, c.distance, format(
            'host, checker and third host all differ (distances %s, %s, %s): a tie denies',
            c.distance, v_ht, v_ct), p_now);
        RETURN 'disagreed';
    END IF;
    IF p_now < c.deadline THEN
        RETURN 'open';
    END IF;
    UPDATE spot_check SET state = 'expired', resolved_at = p_now WHERE id = p_check;
    IF c.fp_host IS NULL OR c.disputed_at IS NOT NULL THEN
        UPDATE spot_check SET outcome = CASE WHEN c.fp_host IS NULL
                                             THEN 'expired without the host''s fingerprint'
                                             ELSE 'expired disputed, no third host came' END
         WHERE id = p_check;
        UPDATE credit_grant SET status = 'denied',
               reason = format('spot check %s %s', p_check,
                               CASE WHEN c.fp_host IS NULL
                                    THEN 'expired without the host''s fingerprint'
                                    ELSE 'expired disputed: no third host settled it' END)
         WHERE kind = 'round' AND project_id = c.project_id AND version = c.version
           AND host_id = c.host_id AND status = 'pending';
    ELSE
        UPDATE spot_check SET outcome = 'expired without a checker' WHERE id = p_check;
        PERFORM credit_release(g.id, p_now)
           FROM credit_grant g
          WHERE g.kind = 'round' AND g.project_id = c.project_id AND g.version = c.version
            AND g.host_id = c.host_id;
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
        'microbatches', to_jsonb(c.microbatches),
        'checkpoint_sha256', mv.checkpoint_sha256, 'deadline', c.deadline, 'state', c.state)
        || CASE WHEN c.seed2 IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('seed2', c.seed2::text) END
      FROM project p
      LEFT JOIN model_version mv ON mv.project_id = p.id AND mv.version = c.version
     WHERE p.id = c.project_id
$$;

-- GET /v1/hosts/{id}/spotchecks: the open checks of the host's own work that
-- still wait for its fingerprint, and those it claimed as a checker or as a
-- third host that it has not answered.
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
                               WHERE c.state = 'open'
                                 AND ((c.checker_id = p_host AND c.fp_checker IS NULL)
                                      OR (c.third_id = p_host AND c.fp_third IS NULL))),
                        '[]'::jsonb))::text;
END
$$;

-- POST /v1/projects/{name}/spotchecks/claim: give the host the oldest open
-- check of this project it may answer (spot_may_answer) whose version
-- checkpoint exists: one that has no checker yet, or a disputed one that
-- waits for a third host.  The same check again while the host has not
-- answered it.  204 when there is none.
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
     WHERE project_id = v_pid AND state = 'open'
       AND ((checker_id = v_host AND fp_checker IS NULL) OR (third_id = v_host AND fp_third IS NULL))
     ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        SELECT sc.* INTO c FROM spot_check sc
         WHERE sc.project_id = v_pid AND sc.state = 'open'
           AND (sc.checker_id IS NULL OR (sc.disputed_at IS NOT NULL AND sc.third_id IS NULL))
           AND spot_may_answer(sc, v_host, v_acc)
         ORDER BY sc.id LIMIT 1 FOR UPDATE OF sc SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 204, jsonb_build_object('retry_after', 600)::text;
            RETURN;
        END IF;
        IF c.checker_id IS NULL THEN
            UPDATE spot_check SET checker_id = v_host, assigned_at = credit_now()
             WHERE id = c.id RETURNING * INTO c;
        ELSE
            UPDATE spot_check SET third_id = v_host, third_assigned_at = credit_now()
             WHERE id = c.id RETURNING * INTO c;
        END IF;
    END IF;
    RETURN QUERY SELECT 200, spot_check_json(c)::text;
END
$$;

-- POST /v1/spotchecks/{id}/fingerprint: the host whose work it is, its
-- checker or its third host sends its values: K for a whole-range check,
-- K per microbatch (in the check's order) for a check of microbatches,
-- whose host's values were committed with its report, and for a check of
-- a block with a second seed K more: the sketch under it of the block's
-- gradient sum.  Settles what can be
-- settled and answers the check's state (and distance once known).  The
-- same values again answer the same; different ones are 409.
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
    IF v_host <> c.host_id AND v_host IS DISTINCT FROM c.checker_id
       AND v_host IS DISTINCT FROM c.third_id THEN
        RETURN QUERY SELECT 403, api_error('forbidden',
            format('host %s is neither the host nor a checker of spot check %s', v_host, p_check),
            'Claim a check first (POST /v1/projects/{name}/spotchecks/claim).');
        RETURN;
    END IF;
    IF cardinality(p_values) IS DISTINCT FROM c.k * (coalesce(cardinality(c.microbatches), 1)
                                                     + (c.seed2 IS NOT NULL)::integer) THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('spot check %s wants %s values, not %s', p_check,
                   c.k * (coalesce(cardinality(c.microbatches), 1) + (c.seed2 IS NOT NULL)::integer),
                   coalesce(cardinality(p_values), 0)));
        RETURN;
    END IF;
    v_prev := CASE v_host WHEN c.host_id THEN c.fp_host WHEN c.checker_id THEN c.fp_checker
                          ELSE c.fp_third END;
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
    ELSIF v_host = c.checker_id THEN
        UPDATE spot_check SET fp_checker = p_values WHERE id = p_check;
    ELSE
        UPDATE spot_check SET fp_third = p_values WHERE id = p_check;
    END IF;
    v_state := spot_settle(p_check, credit_now());
    RETURN QUERY SELECT 200, (SELECT jsonb_build_object('id', s.id, 'state', s.state,
                                                        'distance', s.distance)
                                FROM spot_check s WHERE s.id = p_check)::text;
END
$$;
