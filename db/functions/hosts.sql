-- cotrain functions: a host's identity across attaches, and host merging
-- (BOINC's "merge hosts").  See doc/api.md ("Hosts") and doc/design.md.

-- Register a host of account p_account under the token whose sha256 is
-- p_token_hash.  With a machine id (64 hex digits), the account's live host
-- of that machine is reused: it takes the new token (the old one stops
-- working) and the new hardware description, and keeps its id, credit,
-- pending checks and units.  Without one, or when there is no such host, a
-- new host is made.  Returns the host's id and whether it was reused.
CREATE OR REPLACE FUNCTION host_register(p_account bigint, p_token_hash bytea, p_machine text,
                                         p_cpu text, p_cores integer, p_memory bigint,
                                         p_gpu text, p_flops double precision,
                                         p_version text, p_os_name text, p_os_version text,
                                         OUT host_id bigint, OUT reused boolean)
LANGUAGE sql AS $$
    INSERT INTO host AS h (account_id, token_hash, machine_id, cpu_model, cores, memory_bytes,
                           gpu, flops, client_version, os_name, os_version)
    VALUES (p_account, p_token_hash, p_machine, p_cpu, p_cores, p_memory, p_gpu, p_flops,
            p_version, p_os_name, p_os_version)
    ON CONFLICT (account_id, machine_id) WHERE machine_id IS NOT NULL AND NOT revoked
    DO UPDATE SET token_hash = EXCLUDED.token_hash, cpu_model = EXCLUDED.cpu_model,
                  cores = EXCLUDED.cores, memory_bytes = EXCLUDED.memory_bytes,
                  gpu = EXCLUDED.gpu, flops = EXCLUDED.flops,
                  client_version = EXCLUDED.client_version, os_name = EXCLUDED.os_name,
                  os_version = EXCLUDED.os_version, last_seen = now()
    RETURNING h.id, h.xmax <> 0
$$;

-- Merge host p_old into host p_new, both of one account: the old host's
-- grants (granted, pending and denied), its spot checks (as the checked host
-- and as the checker), its check record and its finished units move to the
-- survivor, whose credit total and RAC take the old host's; the old host is
-- revoked and marked merged_into.  A grant of a round both hosts have a grant
-- of stays with the old host (it still counts for the account).  A live unit
-- of the old host stays with it and expires at its deadline, its range going
-- back to the pool as any expired unit's does.  Raises an error (and changes
-- nothing) for an unknown host, a host merged into itself, hosts of two
-- accounts, or a host already merged.  Returns a summary object.
CREATE OR REPLACE FUNCTION host_merge(p_old bigint, p_new bigint, p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o       host;
    n       host;
    oc      host_credit;
    v_grants  bigint;
    v_kept    bigint;
    v_pending bigint;
    v_checks  bigint;
    v_units   bigint;
    v_kept_credit double precision;
BEGIN
    IF p_old = p_new THEN
        RAISE EXCEPTION 'cannot merge host % into itself', p_old
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Lock both rows in id order, so two merges cannot deadlock.
    PERFORM 1 FROM host WHERE id IN (p_old, p_new) ORDER BY id FOR UPDATE;
    SELECT * INTO o FROM host WHERE id = p_old;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'host % does not exist', p_old USING ERRCODE = 'no_data_found';
    END IF;
    SELECT * INTO n FROM host WHERE id = p_new;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'host % does not exist', p_new USING ERRCODE = 'no_data_found';
    END IF;
    IF o.account_id <> n.account_id THEN
        RAISE EXCEPTION 'cannot merge host % of account % into host % of account %',
                        p_old, o.account_id, p_new, n.account_id
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Only the hosts of one account can be merged: they are one volunteer''s machines.';
    END IF;
    IF o.merged_into IS NOT NULL THEN
        RAISE EXCEPTION 'host % was already merged into host %', p_old, o.merged_into
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n.merged_into IS NOT NULL THEN
        RAISE EXCEPTION 'host % was merged into host %', p_new, n.merged_into
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = format('Merge into host %s instead.', n.merged_into);
    END IF;

    UPDATE host SET revoked = true, merged_into = p_new WHERE id = p_old;

    SELECT count(*) FILTER (WHERE status = 'pending') INTO v_pending
      FROM credit_grant g
     WHERE g.host_id = p_old
       AND NOT EXISTS (SELECT 1 FROM credit_grant s
                        WHERE s.host_id = p_new AND s.project_id = g.project_id
                          AND s.version = g.version AND s.kind = g.kind);
    UPDATE credit_grant g SET host_id = p_new
     WHERE g.host_id = p_old
       AND NOT EXISTS (SELECT 1 FROM credit_grant s
                        WHERE s.host_id = p_new AND s.project_id = g.project_id
                          AND s.version = g.version AND s.kind = g.kind);
    GET DIAGNOSTICS v_grants = ROW_COUNT;
    SELECT count(*) INTO v_kept FROM credit_grant WHERE host_id = p_old;

    UPDATE spot_check SET host_id = p_new WHERE host_id = p_old;
    GET DIAGNOSTICS v_checks = ROW_COUNT;
    UPDATE spot_check SET checker_id = p_new WHERE checker_id = p_old;

    INSERT INTO host_check_record AS r (host_id, consecutive, n_agreed, n_disagreed, last_at)
    SELECT p_new, consecutive, n_agreed, n_disagreed, last_at
      FROM host_check_record WHERE host_id = p_old
    ON CONFLICT (host_id) DO UPDATE
       SET consecutive = least(r.consecutive, EXCLUDED.consecutive),
           n_agreed = r.n_agreed + EXCLUDED.n_agreed,
           n_disagreed = r.n_disagreed + EXCLUDED.n_disagreed,
           last_at = greatest(r.last_at, EXCLUDED.last_at);
    DELETE FROM host_check_record WHERE host_id = p_old;

    UPDATE round_report SET host_id = p_new
     WHERE host_id = p_old
       AND work_unit_id IN (SELECT id FROM work_unit WHERE host_id = p_old AND state <> 'live');
    UPDATE work_unit SET host_id = p_new WHERE host_id = p_old AND state <> 'live';
    GET DIAGNOSTICS v_units = ROW_COUNT;

    -- The old host's credit: its total moves but for the granted credit of
    -- the grants it keeps, so each host's total stays the sum of its granted
    -- grants; its RAC is added as it stands now (both decayed to p_now).
    SELECT coalesce(sum(credit), 0) INTO v_kept_credit
      FROM credit_grant WHERE host_id = p_old AND status = 'granted';
    SELECT * INTO oc FROM host_credit WHERE host_id = p_old;
    IF FOUND THEN
        INSERT INTO host_credit AS c (host_id, total, rac, rac_time, rac_key)
        VALUES (p_new, oc.total - v_kept_credit, credit_rac_at(oc.rac, oc.rac_time, p_now), p_now,
                credit_rac_key(credit_rac_at(oc.rac, oc.rac_time, p_now), p_now))
        ON CONFLICT (host_id) DO UPDATE
           SET total = c.total + EXCLUDED.total,
               rac = credit_rac_at(c.rac, c.rac_time, p_now) + EXCLUDED.rac,
               rac_time = p_now,
               rac_key = credit_rac_key(credit_rac_at(c.rac, c.rac_time, p_now) + EXCLUDED.rac,
                                        p_now);
        UPDATE host_credit SET total = v_kept_credit, rac = 0, rac_time = NULL, rac_key = -1e300
         WHERE host_id = p_old;
    END IF;
    RETURN jsonb_build_object('old', p_old, 'new', p_new, 'grants_moved', v_grants,
                              'grants_kept', v_kept, 'pending_moved', v_pending,
                              'checks_moved', v_checks, 'units_moved', v_units);
END
$$;
