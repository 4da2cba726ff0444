-- cotrain functions: credit (doc/credit.md).
--
-- Unit: BOINC's cobblestone, 1 credit = 4.32e11 floating-point operations;
-- a host earns project.flops_per_sample x the samples it contributed to a
-- committed round, only when it was accepted (its parameters hash matched
-- the server's).  Every grant is one row of credit_grant, so every total can
-- be explained; the totals and the recent average credit (RAC) of accounts,
-- teams and hosts are kept beside them, updated as BOINC does at grant time
-- and decayed on read to "now".  A grant waits ('pending') while a spot
-- check of the host's work is open (spotcheck.sql).

-- "Now", injectable for tests: the session setting cotrain.now when set,
-- else now().
CREATE OR REPLACE FUNCTION credit_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('cotrain.now', true), '')::timestamptz, now())
$$;

-- FLOPs per credit (BOINC's cobblestone) and the RAC half-life, seconds.
CREATE OR REPLACE FUNCTION credit_flops_per_credit() RETURNS double precision LANGUAGE sql IMMUTABLE
    AS $$ SELECT 4.32e11::double precision $$;
CREATE OR REPLACE FUNCTION credit_half_life() RETURNS double precision LANGUAGE sql IMMUTABLE
    AS $$ SELECT 604800::double precision $$;

-- RAC decayed from its time p_time to p_now (work = 0).
CREATE OR REPLACE FUNCTION credit_rac_at(p_rac double precision, p_time timestamptz, p_now timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_time IS NULL OR p_rac <= 0 THEN 0
                ELSE p_rac * exp(-greatest(extract(epoch FROM p_now - p_time), 0)
                                 * ln(2) / credit_half_life()) END
$$;

-- An ordering key of a RAC that does not depend on "now": the RAC decays by
-- the same factor for everyone, so log2(rac) + time/half-life orders RACs
-- read at any later instant.  Indexed for the leaderboards.
CREATE OR REPLACE FUNCTION credit_rac_key(p_rac double precision, p_time timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_time IS NULL OR p_rac <= 0 THEN -1e300
                ELSE log(2::numeric, p_rac::numeric)::double precision
                     + extract(epoch FROM p_time) / credit_half_life() END
$$;

-- BOINC's update_average (lib/util.cpp): add p_work credit done between
-- p_start and p_now to the average p_rac last updated at p_time.
CREATE OR REPLACE FUNCTION credit_rac_add(p_rac double precision, p_time timestamptz,
                               p_work double precision, p_start timestamptz,
                               p_now timestamptz) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_diff   double precision;
    v_weight double precision;
    v_avg    double precision := coalesce(p_rac, 0);
BEGIN
    IF p_time IS NOT NULL THEN
        v_diff := greatest(extract(epoch FROM p_now - p_time), 0);
        v_weight := exp(-v_diff * ln(2) / credit_half_life());
        v_avg := v_avg * v_weight;
        IF 1 - v_weight > 1e-6 THEN
            v_avg := v_avg + (1 - v_weight) * (p_work / (v_diff / 86400));
        ELSE
            v_avg := v_avg + ln(2) * p_work * 86400 / credit_half_life();
        END IF;
    ELSIF p_work > 0 THEN
        v_diff := extract(epoch FROM p_now - coalesce(p_start, p_now));
        IF v_diff > 1 THEN
            v_avg := p_work / (v_diff / 86400);
        ELSE
            v_avg := ln(2) * p_work * 86400 / credit_half_life();
        END IF;
    END IF;
    RETURN v_avg;
END
$$;

-- A holder's total and RAC (p_total, p_rac last updated at p_time; NULLs
-- for a holder without a row yet) after the grants p_grants, in ascending
-- id order, each added as BOINC does at grant time at p_now.
CREATE OR REPLACE FUNCTION credit_fold(p_total double precision, p_rac double precision,
                                       p_time timestamptz, p_grants bigint[], p_now timestamptz,
                                       OUT total double precision, OUT rac double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    g record;
BEGIN
    total := coalesce(p_total, 0);
    rac := coalesce(p_rac, 0);
    FOR g IN SELECT cg.credit, cg.work_start FROM credit_grant cg WHERE cg.id = ANY (p_grants)
              ORDER BY cg.id
    LOOP
        total := total + g.credit;
        rac := credit_rac_add(rac, p_time, g.credit, g.work_start, p_now);
        p_time := p_now;
    END LOOP;
END
$$;

-- Turn the pending grants p_grants into granted ones (counted from p_now)
-- and add their credit to the totals of their hosts, accounts and teams
-- (a team the account has left still gets what it earned in it: the
-- grant's team_id): one write per holder, whatever its number of grants.
-- A round's thousand grants of one account or team were a thousand updates
-- of one row in one transaction, each slower than the last (doc/scale.md,
-- "Runs M").  Grants no longer pending are left as they are.
DROP FUNCTION IF EXISTS credit_add(bigint, bigint, bigint, double precision, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION credit_release_all(p_grants bigint[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids  bigint[];
    v_kind text;
    k      record;
BEGIN
    WITH u AS (UPDATE credit_grant SET status = 'granted', granted_at = p_now
                WHERE id = ANY (p_grants) AND status = 'pending' RETURNING id)
    SELECT array_agg(id) INTO v_ids FROM u;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    FOREACH v_kind IN ARRAY ARRAY['host', 'account', 'team'] LOOP
        FOR k IN EXECUTE format('SELECT %1$I_id AS holder, array_agg(id) AS ids FROM credit_grant
                                  WHERE id = ANY ($1) AND %1$I_id IS NOT NULL GROUP BY 1 ORDER BY 1',
                                v_kind) USING v_ids
        LOOP
            EXECUTE format('INSERT INTO %1$I_credit AS c (%1$I_id, total, rac, rac_time, rac_key)
                            SELECT $1, f.total, f.rac, $3, credit_rac_key(f.rac, $3)
                              FROM credit_fold(NULL, NULL, NULL, $2, $3) f
                            ON CONFLICT (%1$I_id) DO UPDATE SET (total, rac, rac_time, rac_key) =
                               (SELECT f.total, f.rac, $3, credit_rac_key(f.rac, $3)
                                  FROM credit_fold(c.total, c.rac, c.rac_time, $2, $3) f)',
                           v_kind) USING k.holder, k.ids, p_now;
        END LOOP;
    END LOOP;
END
$$;

-- Turn a pending grant into a granted one (counted from p_now).
CREATE OR REPLACE FUNCTION credit_release(p_grant bigint, p_now timestamptz) RETURNS void
LANGUAGE sql AS $$
    SELECT credit_release_all(ARRAY[p_grant], p_now)
$$;

-- Grant the credit of committed round p_version of p_project: one 'round'
-- row per accepted member, pending when a spot check of one of its work
-- ranges is opened (chosen with spot_rate), else granted at once.
-- Idempotent: a member that already has its row gets nothing more.  Returns
-- the number of rows inserted.  Nothing for a round that is not committed.
CREATE OR REPLACE FUNCTION credit_grant_round(p_project bigint, p_version integer,
                                   p_now timestamptz DEFAULT credit_now())
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    ro   record;
    pr   record;
    pol  spot_policy;
    m    record;
    wu   record;
    v_rec integer;
    v_grant bigint;
    v_check bigint;
    v_n  integer := 0;
    v_owed boolean;
    v_k  integer;
    v_release bigint[] := '{}';
BEGIN
    SELECT * INTO ro FROM round WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR ro.state <> 'committed' THEN
        RETURN 0;
    END IF;
    SELECT flops_per_sample, microbatch_size INTO pr FROM project WHERE id = p_project;
    pol := spot_policy_of(p_project);
    v_k := round_seed2_k(p_project, p_version);
    FOR m IN
        SELECT rm.host_id, rm.samples, h.account_id, a.team_id
          FROM round_member rm
          JOIN host h ON h.id = rm.host_id
          JOIN account a ON a.id = h.account_id
         WHERE rm.project_id = p_project AND rm.version = p_version
           AND rm.accepted IS TRUE AND rm.samples > 0
         ORDER BY rm.host_id
    LOOP
        INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, team_id,
                                  samples, flops, credit, status, work_start, created_at)
        VALUES ('round', p_project, p_version, m.host_id, m.account_id, m.team_id, m.samples,
                pr.flops_per_sample * m.samples,
                pr.flops_per_sample * m.samples / credit_flops_per_credit(),
                'pending', ro.opened_at, p_now)
        ON CONFLICT (project_id, version, host_id, kind) DO NOTHING
        RETURNING id INTO v_grant;
        IF v_grant IS NULL THEN
            CONTINUE;
        END IF;
        v_n := v_n + 1;
        SELECT coalesce((SELECT consecutive FROM host_check_record WHERE host_id = m.host_id), 0)
          INTO v_rec;
        v_check := NULL;
        -- A host that owes its sketches under the round's second seed is
        -- drawn for a check once they came (round_seed2_verify: one block).
        v_owed := round_seed2_owed(p_project, p_version, m.host_id, v_k);
        IF random() < spot_rate(pol, v_rec) AND NOT v_owed THEN
            -- One of its committed ranges, preferring one whose microbatch
            -- sketches were committed with its report, at random with a
            -- probability proportional to its microbatches (the exponential
            -- race: the least -ln(u) / weight wins), so that the checked
            -- microbatches are a uniform draw of the host's round whatever
            -- its units' sizes: a host cannot cheat in its one large unit
            -- and hide behind several small honest ones.
            SELECT w.id, w.lo, w.lo + w.mb_done AS hi, w.mb_done, ws.k AS sk, ws.sketches INTO wu
              FROM work_unit w LEFT JOIN work_unit_sketch ws ON ws.work_unit_id = w.id
             WHERE w.project_id = p_project AND w.version = p_version AND w.host_id = m.host_id
               AND w.mb_done > 0 AND w.state IN ('done', 'returned')
             ORDER BY ws.work_unit_id IS NULL, -ln(1 - random()) / w.mb_done LIMIT 1;
            IF FOUND AND wu.sketches IS NOT NULL THEN
                -- pol.microbatches of them, at random: the host's committed
                -- sketches of those are its answer already.
                INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi,
                                        samples, seed, k, tolerance, created_at, deadline,
                                        microbatches, fp_host)
                SELECT p_project, p_version, wu.id, m.host_id, wu.lo, wu.hi,
                       count(*) * pr.microbatch_size, spot_sketch_seed(p_project, p_version),
                       wu.sk, greatest(pol.tolerance, spot_precision_floor(p_project)), p_now,
                       p_now + make_interval(secs => pol.deadline_s),
                       array_agg(wu.lo + o ORDER BY o),
                       (SELECT array_agg(wu.sketches[o2 * wu.sk + j] ORDER BY o2, j)
                          FROM unnest(array_agg(o)) o2, generate_series(1, wu.sk) j)
                  FROM (SELECT o FROM generate_series(0, wu.mb_done - 1) o
                         ORDER BY random() LIMIT pol.microbatches) pick
                RETURNING id INTO v_check;
                UPDATE credit_grant SET spot_check_id = v_check WHERE id = v_grant;
            ELSIF FOUND THEN
                INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi,
                                        samples, seed, k, tolerance, created_at, deadline)
                VALUES (p_project, p_version, wu.id, m.host_id, wu.lo, wu.hi,
                        wu.mb_done * pr.microbatch_size,
                        ('x' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))
                            ::bit(64)::bigint,
                        pol.k, greatest(pol.tolerance, spot_precision_floor(p_project)), p_now,
                        p_now + make_interval(secs => pol.deadline_s))
                RETURNING id INTO v_check;
                UPDATE credit_grant SET spot_check_id = v_check WHERE id = v_grant;
            END IF;
        END IF;
        -- A host that owes its sketches under the round's second seed
        -- waits for their check too (round_seed2_verify releases it).
        IF v_check IS NULL AND NOT v_owed THEN
            v_release := v_release || v_grant;
        END IF;
    END LOOP;
    PERFORM credit_release_all(v_release, p_now);
    RETURN v_n;
END
$$;

-- The round commit path: grant when a round turns committed.
CREATE OR REPLACE FUNCTION credit_round_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM credit_grant_round(NEW.project_id, NEW.version, credit_now());
    RETURN NULL;
END
$$;

-- Pending credit: the credit of a holder's grants that wait for a spot
-- check (shown beside the totals, as BOINC shows pending credit; never in
-- them).
CREATE OR REPLACE FUNCTION credit_pending_host(p_host bigint) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(credit), 0) FROM credit_grant WHERE host_id = p_host AND status = 'pending'
$$;
CREATE OR REPLACE FUNCTION credit_pending_account(p_account bigint) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(credit), 0) FROM credit_grant
     WHERE account_id = p_account AND status = 'pending'
$$;
CREATE OR REPLACE FUNCTION credit_pending_team(p_team bigint) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(credit), 0) FROM credit_grant WHERE team_id = p_team AND status = 'pending'
$$;
