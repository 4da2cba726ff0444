-- cotrain schema, version 8: spot checks on by default.
--
-- 0006_credit.sql left a project unchecked until a spot_policy row existed,
-- because clients could not answer checks yet.  They do now
-- (client/spotcheck.h), so every project gets the default policy, existing
-- ones and each new one; a maintainer may still change or delete its row.

INSERT INTO spot_policy (project_id)
SELECT id FROM project ON CONFLICT (project_id) DO NOTHING;

CREATE FUNCTION spot_policy_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spot_policy (project_id) VALUES (NEW.id) ON CONFLICT (project_id) DO NOTHING;
    RETURN NEW;
END
$$;

CREATE TRIGGER project_spot_policy AFTER INSERT ON project
    FOR EACH ROW EXECUTE FUNCTION spot_policy_default();
