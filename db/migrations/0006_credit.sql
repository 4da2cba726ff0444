-- cotrain schema, version 6: credit (doc/credit.md).
--
-- Unit: BOINC's cobblestone, 1 credit = 4.32e11 floating-point operations;
-- a host earns project.flops_per_sample x the samples it contributed to a
-- committed round, only when it was accepted (its parameters hash matched
-- the server's).  Every grant is one row of credit_grant, so every total can
-- be explained; the totals and the recent average credit (RAC) of accounts,
-- teams and hosts are kept beside them, updated as BOINC does at grant time
-- and decayed on read to "now".
--
-- Spot checks (BOINC's adaptive replication): when a round commits, each
-- accepted host is checked with a probability that falls as its record of
-- consecutive agreeing checks grows.  A check reissues one of the host's
-- committed work ranges to a second host; both send a fingerprint (the
-- gradient of the range projected on K random directions derived from a
-- seed the server picked after the round committed); the server compares
-- them within a relative tolerance.  While a check is open the host's grant
-- for that round is pending; agreement grants it (and credits the checker),
-- disagreement denies it and every other pending grant of the host and
-- resets its record.
--
-- "Now" is injectable for tests: credit_now() is the session setting
-- cotrain.now when set, else now().

CREATE FUNCTION credit_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('cotrain.now', true), '')::timestamptz, now())
$$;

-- FLOPs per credit (BOINC's cobblestone) and the RAC half-life, seconds.
CREATE FUNCTION credit_flops_per_credit() RETURNS double precision LANGUAGE sql IMMUTABLE
    AS $$ SELECT 4.32e11::double precision $$;
CREATE FUNCTION credit_half_life() RETURNS double precision LANGUAGE sql IMMUTABLE
    AS $$ SELECT 604800::double precision $$;

-- RAC decayed from its time p_time to p_now (work = 0).
CREATE FUNCTION credit_rac_at(p_rac double precision, p_time timestamptz, p_now timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_time IS NULL OR p_rac <= 0 THEN 0
                ELSE p_rac * exp(-greatest(extract(epoch FROM p_now - p_time), 0)
                                 * ln(2) / credit_half_life()) END
$$;

-- An ordering key of a RAC that does not depend on "now": the RAC decays by
-- the same factor for everyone, so log2(rac) + time/half-life orders RACs
-- read at any later instant.  Indexed for the leaderboards.
CREATE FUNCTION credit_rac_key(p_rac double precision, p_time timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_time IS NULL OR p_rac <= 0 THEN -1e300
                ELSE log(2::numeric, p_rac::numeric)::double precision
                     + extract(epoch FROM p_time) / credit_half_life() END
$$;

-- BOINC's update_average (lib/util.cpp): add p_work credit done between
-- p_start and p_now to the average p_rac last updated at p_time.
CREATE FUNCTION credit_rac_add(p_rac double precision, p_time timestamptz,
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

-- Totals, one table per kind of holder, each row created at first grant.
CREATE TABLE account_credit (
    account_id   bigint PRIMARY KEY REFERENCES account(id) ON DELETE CASCADE,
    total        double precision NOT NULL DEFAULT 0,
    rac          double precision NOT NULL DEFAULT 0,
    rac_time     timestamptz,
    rac_key      double precision NOT NULL DEFAULT -1e300
);
CREATE INDEX account_credit_total_idx ON account_credit (total DESC, account_id DESC);
CREATE INDEX account_credit_rac_idx ON account_credit (rac_key DESC, account_id DESC);

CREATE TABLE team_credit (
    team_id      bigint PRIMARY KEY REFERENCES team(id) ON DELETE CASCADE,
    total        double precision NOT NULL DEFAULT 0,
    rac          double precision NOT NULL DEFAULT 0,
    rac_time     timestamptz,
    rac_key      double precision NOT NULL DEFAULT -1e300
);
CREATE INDEX team_credit_total_idx ON team_credit (total DESC, team_id DESC);
CREATE INDEX team_credit_rac_idx ON team_credit (rac_key DESC, team_id DESC);

CREATE TABLE host_credit (
    host_id      bigint PRIMARY KEY REFERENCES host(id) ON DELETE CASCADE,
    total        double precision NOT NULL DEFAULT 0,
    rac          double precision NOT NULL DEFAULT 0,
    rac_time     timestamptz,
    rac_key      double precision NOT NULL DEFAULT -1e300
);
CREATE INDEX host_credit_total_idx ON host_credit (total DESC, host_id DESC);
CREATE INDEX host_credit_rac_idx ON host_credit (rac_key DESC, host_id DESC);

-- The ledger: one row per grant.  kind 'round': a host's samples in a
-- committed round; kind 'check': the samples a checker recomputed for an
-- agreeing spot check.  status: 'granted' (counted in the totals),
-- 'pending' (a spot check is open), 'denied' (a spot check disagreed, or
-- the host never answered its own check).
CREATE TABLE credit_grant (
    id           bigserial PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('round', 'check')),
    project_id   bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version      integer NOT NULL,
    host_id      bigint NOT NULL REFERENCES host(id) ON DELETE CASCADE,
    account_id   bigint NOT NULL REFERENCES account(id) ON DELETE CASCADE,
    team_id      bigint REFERENCES team(id) ON DELETE SET NULL,
    samples      bigint NOT NULL CHECK (samples >= 0),
    flops        double precision NOT NULL CHECK (flops >= 0),
    credit       double precision NOT NULL CHECK (credit >= 0),
    status       text NOT NULL CHECK (status IN ('granted', 'pending', 'denied')),
    reason       text,
    work_start   timestamptz,          -- when the work began (BOINC's RAC start)
    created_at   timestamptz NOT NULL,
    granted_at   timestamptz,
    spot_check_id bigint,
    UNIQUE (project_id, version, host_id, kind)
);
CREATE INDEX credit_grant_account_idx ON credit_grant (account_id, id DESC);
CREATE INDEX credit_grant_host_idx ON credit_grant (host_id, id DESC);
CREATE INDEX credit_grant_team_idx ON credit_grant (team_id, id DESC);
CREATE INDEX credit_grant_pending_idx ON credit_grant (host_id) WHERE status = 'pending';

-- Per project: how often to check.  A host whose record (consecutive
-- agreeing checks) is below trusted_after is checked with probability
-- first_rate, then with max(min_rate, 1/record).  A row with the defaults is
-- BOINC's rule (always until 10, then 1/record).  Projects without a row are
-- not checked: a check the client cannot answer would deny its credit, so a
-- project turns checks on (INSERT INTO spot_policy (project_id) ...) once its
-- clients answer them.
CREATE TABLE spot_policy (
    project_id     bigint PRIMARY KEY REFERENCES project(id) ON DELETE CASCADE,
    trusted_after  integer NOT NULL DEFAULT 10 CHECK (trusted_after >= 0),
    first_rate     double precision NOT NULL DEFAULT 1 CHECK (first_rate BETWEEN 0 AND 1),
    min_rate       double precision NOT NULL DEFAULT 0.01 CHECK (min_rate BETWEEN 0 AND 1),
    k              integer NOT NULL DEFAULT 16 CHECK (k BETWEEN 1 AND 256),
    tolerance      double precision NOT NULL DEFAULT 1e-3 CHECK (tolerance > 0 AND tolerance < 1),
    deadline_s     integer NOT NULL DEFAULT 86400 CHECK (deadline_s > 0)
);

CREATE TABLE host_check_record (
    host_id        bigint PRIMARY KEY REFERENCES host(id) ON DELETE CASCADE,
    consecutive    integer NOT NULL DEFAULT 0,
    n_agreed       integer NOT NULL DEFAULT 0,
    n_disagreed    integer NOT NULL DEFAULT 0,
    last_at        timestamptz
);

-- One check of one committed work range [lo, hi) (stream microbatches) of
-- host_id in round version; checker_id recomputes it.
CREATE TABLE spot_check (
    id             bigserial PRIMARY KEY,
    project_id     bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version        integer NOT NULL,
    work_unit_id   bigint NOT NULL REFERENCES work_unit(id) ON DELETE CASCADE,
    host_id        bigint NOT NULL REFERENCES host(id) ON DELETE CASCADE,
    lo             bigint NOT NULL,
    hi             bigint NOT NULL,
    samples        bigint NOT NULL,
    seed           bigint NOT NULL,      -- picked when the round committed
    k              integer NOT NULL,
    tolerance      double precision NOT NULL,
    checker_id     bigint REFERENCES host(id) ON DELETE SET NULL,
    fp_host        double precision[],
    fp_checker     double precision[],
    distance       double precision,     -- ||a - b|| / max(||a||, ||b||)
    state          text NOT NULL DEFAULT 'open'
                   CHECK (state IN ('open', 'agreed', 'disagreed', 'expired')),
    created_at     timestamptz NOT NULL,
    assigned_at    timestamptz,
    deadline       timestamptz NOT NULL,
    resolved_at    timestamptz,
    CHECK (lo < hi)
);
CREATE INDEX spot_check_open_idx ON spot_check (project_id, id) WHERE state = 'open';
CREATE INDEX spot_check_host_idx ON spot_check (host_id, id DESC);
CREATE INDEX spot_check_checker_idx ON spot_check (checker_id) WHERE state = 'open';

-- The policy of a project; without a row, checks are off.
CREATE FUNCTION spot_policy_of(p_project bigint) RETURNS spot_policy LANGUAGE sql STABLE AS $$
    SELECT coalesce(s, ROW(p_project, 2147483647, 0, 0, 16, 1e-3, 86400)::spot_policy)
      FROM (SELECT NULL) x LEFT JOIN spot_policy s ON s.project_id = p_project
$$;

-- The probability of checking a host with this record under this policy.
CREATE FUNCTION spot_rate(p spot_policy, p_record integer) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_record < p.trusted_after THEN p.first_rate
                ELSE greatest(p.min_rate, 1.0 / greatest(p_record, 1)) END
$$;

-- Add p_credit (granted at p_now for work begun at p_start) to the totals
-- of a host, its account and the team.
CREATE FUNCTION credit_add(p_host bigint, p_account bigint, p_team bigint,
                           p_credit double precision, p_start timestamptz, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO host_credit AS c (host_id, total, rac, rac_time, rac_key)
    VALUES (p_host, p_credit, credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now,
            credit_rac_key(credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now))
    ON CONFLICT (host_id) DO UPDATE
       SET total = c.total + p_credit,
           rac = credit_rac_add(c.rac, c.rac_time, p_credit, p_start, p_now),
           rac_time = p_now,
           rac_key = credit_rac_key(credit_rac_add(c.rac, c.rac_time, p_credit, p_start, p_now),
                                    p_now);
    INSERT INTO account_credit AS c (account_id, total, rac, rac_time, rac_key)
    VALUES (p_account, p_credit, credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now,
            credit_rac_key(credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now))
    ON CONFLICT (account_id) DO UPDATE
       SET total = c.total + p_credit,
           rac = credit_rac_add(c.rac, c.rac_time, p_credit, p_start, p_now),
           rac_time = p_now,
           rac_key = credit_rac_key(credit_rac_add(c.rac, c.rac_time, p_credit, p_start, p_now),
                                    p_now);
    IF p_team IS NOT NULL THEN
        INSERT INTO team_credit AS c (team_id, total, rac, rac_time, rac_key)
        VALUES (p_team, p_credit, credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now,
                credit_rac_key(credit_rac_add(0, NULL, p_credit, p_start, p_now), p_now))
        ON CONFLICT (team_id) DO UPDATE
           SET total = c.total + p_credit,
               rac = credit_rac_add(c.rac, c.rac_time, p_credit, p_start, p_now),
               rac_time = p_now,
               rac_key = credit_rac_key(credit_rac_add(c.rac, c.rac_time, p_credit, p_start,
                                                       p_now), p_now);
    END IF;
END
$$;

-- Turn a pending grant into a granted one (counted from p_now).
CREATE FUNCTION credit_release(p_grant bigint, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    g record;
BEGIN
    UPDATE credit_grant SET status = 'granted', granted_at = p_now
     WHERE id = p_grant AND status = 'pending'
    RETURNING * INTO g;
    IF FOUND THEN
        -- Credit of a team the account has left still counts for the team it
        -- earned it in (the grant's team_id).
        PERFORM credit_add(g.host_id, g.account_id, g.team_id, g.credit, g.work_start, p_now);
    END IF;
END
$$;

-- Grant the credit of committed round p_version of p_project: one 'round'
-- row per accepted member, pending when a spot check of one of its work
-- ranges is opened (chosen with spot_rate), else granted at once.
-- Idempotent: a member that already has its row gets nothing more.  Returns
-- the number of rows inserted.  Nothing for a round that is not committed.
CREATE FUNCTION credit_grant_round(p_project bigint, p_version integer,
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
BEGIN
    SELECT * INTO ro FROM round WHERE project_id = p_project AND version = p_version;
    IF NOT FOUND OR ro.state <> 'committed' THEN
        RETURN 0;
    END IF;
    SELECT flops_per_sample, microbatch_size INTO pr FROM project WHERE id = p_project;
    pol := spot_policy_of(p_project);
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
        IF random() < spot_rate(pol, v_rec) THEN
            -- One of its committed ranges, at random.
            SELECT w.id, w.lo, w.lo + w.mb_done AS hi, w.mb_done INTO wu
              FROM work_unit w
             WHERE w.project_id = p_project AND w.version = p_version AND w.host_id = m.host_id
               AND w.mb_done > 0 AND w.state IN ('done', 'returned')
             ORDER BY random() LIMIT 1;
            IF FOUND THEN
                INSERT INTO spot_check (project_id, version, work_unit_id, host_id, lo, hi,
                                        samples, seed, k, tolerance, created_at, deadline)
                VALUES (p_project, p_version, wu.id, m.host_id, wu.lo, wu.hi,
                        wu.mb_done * pr.microbatch_size,
                        ('x' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))
                            ::bit(64)::bigint,
                        pol.k, pol.tolerance, p_now,
                        p_now + make_interval(secs => pol.deadline_s))
                RETURNING id INTO v_check;
                UPDATE credit_grant SET spot_check_id = v_check WHERE id = v_grant;
            END IF;
        END IF;
        IF v_check IS NULL THEN
            PERFORM credit_release(v_grant, p_now);
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;

-- The round commit path: grant when a round turns committed.
CREATE FUNCTION credit_round_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM credit_grant_round(NEW.project_id, NEW.version, credit_now());
    RETURN NULL;
END
$$;
CREATE TRIGGER round_credit AFTER UPDATE OF state ON round
    FOR EACH ROW WHEN (NEW.state = 'committed' AND OLD.state IS DISTINCT FROM 'committed')
    EXECUTE FUNCTION credit_round_committed();

-- Settle check p_check, both fingerprints in (or its deadline passed):
-- compare, then apply the consequences.  The caller holds its row lock.
CREATE FUNCTION spot_settle(p_check bigint, p_now timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    c      record;
    v_diff double precision;
    v_na   double precision;
    v_nb   double precision;
    v_grant bigint;
    g      record;
BEGIN
    SELECT * INTO c FROM spot_check WHERE id = p_check;
    IF c.state <> 'open' THEN
        RETURN c.state;
    END IF;
    SELECT id INTO v_grant FROM credit_grant
     WHERE kind = 'round' AND project_id = c.project_id AND version = c.version
       AND host_id = c.host_id;
    IF c.fp_host IS NOT NULL AND c.fp_checker IS NOT NULL THEN
        SELECT sqrt(sum((a - b) ^ 2)), sqrt(sum(a ^ 2)), sqrt(sum(b ^ 2))
          INTO v_diff, v_na, v_nb
          FROM unnest(c.fp_host, c.fp_checker) AS u(a, b);
        v_diff := CASE WHEN greatest(v_na, v_nb) > 0 THEN v_diff / greatest(v_na, v_nb)
                       ELSE 0 END;
        IF v_diff <= c.tolerance THEN
            UPDATE spot_check SET state = 'agreed', distance = v_diff, resolved_at = p_now
             WHERE id = p_check;
            INSERT INTO host_check_record AS r (host_id, consecutive, n_agreed, last_at)
            VALUES (c.host_id, 1, 1, p_now)
            ON CONFLICT (host_id) DO UPDATE SET consecutive = r.consecutive + 1,
                n_agreed = r.n_agreed + 1, last_at = p_now;
            PERFORM credit_release(v_grant, p_now);
            -- The checker did the same work: a 'check' grant for it.
            SELECT h.id AS host_id, h.account_id, a.team_id, p.flops_per_sample INTO g
              FROM host h JOIN account a ON a.id = h.account_id, project p
             WHERE h.id = c.checker_id AND p.id = c.project_id;
            IF FOUND THEN
                INSERT INTO credit_grant (kind, project_id, version, host_id, account_id,
                                          team_id, samples, flops, credit, status, work_start,
                                          created_at, spot_check_id)
                VALUES ('check', c.project_id, c.version, g.host_id, g.account_id, g.team_id,
                        c.samples, g.flops_per_sample * c.samples,
                        g.flops_per_sample * c.samples / credit_flops_per_credit(), 'pending',
                        c.assigned_at, p_now, p_check)
                ON CONFLICT (project_id, version, host_id, kind) DO NOTHING
                RETURNING id INTO v_grant;
                IF v_grant IS NOT NULL THEN
                    PERFORM credit_release(v_grant, p_now);
                END IF;
            END IF;
            RETURN 'agreed';
        END IF;
        UPDATE spot_check SET state = 'disagreed', distance = v_diff, resolved_at = p_now
         WHERE id = p_check;
        INSERT INTO host_check_record AS r (host_id, consecutive, n_disagreed, last_at)
        VALUES (c.host_id, 0, 1, p_now)
        ON CONFLICT (host_id) DO UPDATE SET consecutive = 0, n_disagreed = r.n_disagreed + 1,
            last_at = p_now;
        -- Withhold: this grant and every other pending grant of the host.
        UPDATE credit_grant SET status = 'denied',
               reason = format('spot check %s disagreed (distance %s)', p_check, v_diff)
         WHERE host_id = c.host_id AND status = 'pending';
        RETURN 'disagreed';
    END IF;
    IF p_now < c.deadline THEN
        RETURN 'open';
    END IF;
    -- Past the deadline.  A host that never sent its own fingerprint cannot
    -- show its work: denied.  One whose checker never came gets its credit.
    UPDATE spot_check SET state = 'expired', resolved_at = p_now WHERE id = p_check;
    IF c.fp_host IS NULL THEN
        UPDATE credit_grant SET status = 'denied',
               reason = format('spot check %s expired without the host''s fingerprint', p_check)
         WHERE id = v_grant AND status = 'pending';
    ELSE
        PERFORM credit_release(v_grant, p_now);
    END IF;
    RETURN 'expired';
END
$$;

-- Settle every open check past its deadline; returns how many.
CREATE FUNCTION spot_expire(p_now timestamptz DEFAULT credit_now()) RETURNS integer
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
CREATE FUNCTION spot_check_json(c spot_check) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', c.id, 'project', p.name, 'version', c.version, 'lo', c.lo, 'hi', c.hi,
        'samples', c.samples, 'seed', c.seed::text, 'k', c.k, 'tolerance', c.tolerance,
        'checkpoint_sha256', mv.checkpoint_sha256, 'deadline', c.deadline, 'state', c.state)
      FROM project p
      LEFT JOIN model_version mv ON mv.project_id = p.id AND mv.version = c.version
     WHERE p.id = c.project_id
$$;

-- Authenticate a host token; the host id or NULL.
CREATE FUNCTION spot_host(p_token_hash bytea) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT h.id FROM host h JOIN account a ON a.id = h.account_id
     WHERE h.token_hash = p_token_hash AND NOT h.revoked AND NOT a.disabled
$$;

-- GET /v1/hosts/{id}/spotchecks: the open checks of the host's own work that
-- still wait for its fingerprint, and those it claimed as a checker.
CREATE FUNCTION spot_list(p_token_hash bytea, p_host bigint)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint := spot_host(p_token_hash);
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
                               WHERE c.checker_id = p_host AND c.state = 'open'
                                 AND c.fp_checker IS NULL), '[]'::jsonb))::text;
END
$$;

-- POST /v1/projects/{name}/spotchecks/claim: give the host the oldest open
-- check of this project that has no checker, is not its own account's work,
-- and whose version checkpoint exists.  204 when there is none.
CREATE FUNCTION spot_claim(p_token_hash bytea, p_project text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host bigint := spot_host(p_token_hash);
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
     WHERE project_id = v_pid AND checker_id = v_host AND state = 'open' AND fp_checker IS NULL
     ORDER BY id LIMIT 1;
    IF NOT FOUND THEN
        SELECT sc.* INTO c FROM spot_check sc JOIN host h ON h.id = sc.host_id
         WHERE sc.project_id = v_pid AND sc.state = 'open' AND sc.checker_id IS NULL
           AND h.account_id <> v_acc
         ORDER BY sc.id LIMIT 1 FOR UPDATE OF sc SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 204, jsonb_build_object('retry_after', 600)::text;
            RETURN;
        END IF;
        UPDATE spot_check SET checker_id = v_host, assigned_at = credit_now()
         WHERE id = c.id RETURNING * INTO c;
    END IF;
    RETURN QUERY SELECT 200, spot_check_json(c)::text;
END
$$;

-- POST /v1/spotchecks/{id}/fingerprint: the host whose work it is, or its
-- checker, sends its K values.  Settles the check once both are in and
-- answers its state (and distance once settled).  The same values again
-- answer the same; different ones are 409.
CREATE FUNCTION spot_fingerprint(p_token_hash bytea, p_check bigint, p_values double precision[])
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_host  bigint := spot_host(p_token_hash);
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
    IF v_host <> c.host_id AND v_host IS DISTINCT FROM c.checker_id THEN
        RETURN QUERY SELECT 403, api_error('forbidden',
            format('host %s is neither the host nor the checker of spot check %s', v_host, p_check),
            'Claim a check first (POST /v1/projects/{name}/spotchecks/claim).');
        RETURN;
    END IF;
    IF cardinality(p_values) IS DISTINCT FROM c.k THEN
        RETURN QUERY SELECT 400, api_error('invalid',
            format('spot check %s wants %s values, not %s', p_check, c.k,
                   coalesce(cardinality(p_values), 0)));
        RETURN;
    END IF;
    v_prev := CASE WHEN v_host = c.host_id THEN c.fp_host ELSE c.fp_checker END;
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
    ELSE
        UPDATE spot_check SET fp_checker = p_values WHERE id = p_check;
    END IF;
    v_state := spot_settle(p_check, credit_now());
    RETURN QUERY SELECT 200, (SELECT jsonb_build_object('id', s.id, 'state', s.state,
                                                        'distance', s.distance)
                                FROM spot_check s WHERE s.id = p_check)::text;
END
$$;
