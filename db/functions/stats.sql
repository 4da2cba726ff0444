-- cotrain functions: what the stats export reads besides the tables
-- (server/export_stats.c, doc/credit.md "Stats export").

-- BEFORE UPDATE OF disabled ON account, OF revoked ON host: stamp when an
-- account was disabled or a host revoked (cleared when undone), so the
-- export lists it in user_deleted.gz / host_deleted.gz for 60 days.
CREATE OR REPLACE FUNCTION stats_deleted_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'account' THEN
        IF NEW.disabled AND NOT OLD.disabled THEN
            NEW.disabled_at := now();
        ELSIF NOT NEW.disabled THEN
            NEW.disabled_at := NULL;
        END IF;
    ELSE
        IF NEW.revoked AND NOT OLD.revoked THEN
            NEW.revoked_at := now();
        ELSIF NOT NEW.revoked THEN
            NEW.revoked_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- The triggers are created here, beside their function, so that no
-- migration has to define a function for them (db/README).
CREATE OR REPLACE TRIGGER account_disabled_at BEFORE UPDATE OF disabled ON account
    FOR EACH ROW EXECUTE FUNCTION stats_deleted_stamp();
CREATE OR REPLACE TRIGGER host_revoked_at BEFORE UPDATE OF revoked ON host
    FOR EACH ROW EXECUTE FUNCTION stats_deleted_stamp();
