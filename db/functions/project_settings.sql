-- cotrain functions: a project's settings at a model version (doc/design.md,
-- "Changing a run").  `cotrain-admin project update` records each change in
-- the project's config, in its "changes" array, with the version it takes
-- effect at; the settings in force at version v are the config's own with
-- every change of version <= v merged over them in ascending version (file
-- order among equal ones), objects key by key, exactly as
-- kernels/config_changes.c reads them for the optimizer step.  The columns
-- the scheduler reads (target_batch, wu_seconds) and the spot_policy row
-- hold the values in force at the project's current version:
-- project_apply_settings sets them when a version is committed and when a
-- change is recorded.

-- b merged over a: objects key by key (recursively), any other value of b
-- replaces a's.
CREATE OR REPLACE FUNCTION jsonb_merge_deep(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF jsonb_typeof(a) IS DISTINCT FROM 'object' OR jsonb_typeof(b) IS DISTINCT FROM 'object' THEN
        RETURN b;
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(b) LOOP
        a := jsonb_set(a, ARRAY[k], CASE WHEN a ? k THEN jsonb_merge_deep(a->k, v) ELSE v END);
    END LOOP;
    RETURN a;
END
$$;

-- The config p_config in force at version p_version, without "changes".
CREATE OR REPLACE FUNCTION project_config_at(p_config jsonb, p_version integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c   jsonb;
    cfg jsonb := p_config - 'changes';
BEGIN
    FOR c IN SELECT e FROM jsonb_array_elements(coalesce(p_config->'changes', '[]')) WITH ORDINALITY x(e, i)
              WHERE (e->>'version')::integer <= p_version
              ORDER BY (e->>'version')::integer, i LOOP
        cfg := jsonb_merge_deep(cfg, c - 'version' - 'at');
    END LOOP;
    RETURN cfg;
END
$$;

-- Set project p_project's target_batch and wu_seconds, and its spot-check
-- policy when the config names one, to the values in force at its current
-- version.  The caller holds the project's row lock or commits its version.
CREATE OR REPLACE FUNCTION project_apply_settings(p_project bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cfg jsonb;
    val jsonb;
BEGIN
    SELECT project_config_at(config, current_version) INTO cfg FROM project WHERE id = p_project;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE project
       SET target_batch = coalesce((cfg->>'target_batch')::integer, target_batch),
           wu_seconds = coalesce((cfg->>'work_unit_seconds')::integer, wu_seconds)
     WHERE id = p_project
       AND (target_batch, wu_seconds) IS DISTINCT FROM
           (coalesce((cfg->>'target_batch')::integer, target_batch),
            coalesce((cfg->>'work_unit_seconds')::integer, wu_seconds));
    val := cfg->'validation';
    IF jsonb_typeof(val) = 'object' THEN
        INSERT INTO spot_policy AS s (project_id, trusted_after, first_rate, min_rate, decay)
        VALUES (p_project, coalesce((val->>'trusted_after')::integer, 1),
                coalesce((val->>'first_rate')::double precision, 1),
                coalesce((val->>'min_rate')::double precision, 0.01),
                coalesce((val->>'decay')::double precision, 0.5))
        ON CONFLICT (project_id) DO UPDATE
           SET trusted_after = EXCLUDED.trusted_after, first_rate = EXCLUDED.first_rate,
               min_rate = EXCLUDED.min_rate, decay = EXCLUDED.decay;
    END IF;
END
$$;
