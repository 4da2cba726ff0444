-- cotrain functions: a notification on channel cotrain_round when a round
-- moves (doc/scale.md, "Several server processes").
--
-- Every server process holds long polls that another process's change
-- answers (a round closed, planned, its mean in, committed), and its
-- coordinator's duty holder plans from reports any process took.  Each
-- process LISTENs (server/db_listen.c) and looks at once when notified; its
-- 250 ms look stays as the floor.  Notifications go out at commit, one per
-- transaction (PostgreSQL folds identical ones), and cost nothing when
-- nobody listens.  The triggers are created here, beside their function
-- (db/README).
CREATE OR REPLACE FUNCTION round_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cotrain_round', '');
    RETURN NULL;
END
$$;

-- A round opened (a project created, a commit, a rerun).
CREATE OR REPLACE TRIGGER round_notify_insert AFTER INSERT ON round
    FOR EACH ROW EXECUTE FUNCTION round_notify();

-- What server/round_coord.c's watch looks at: a round's state or attempt,
-- the mean's hash, v+1 in.
CREATE OR REPLACE TRIGGER round_notify_update AFTER UPDATE ON round
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt IS DISTINCT FROM NEW.attempt
          OR OLD.gradient_sha256 IS DISTINCT FROM NEW.gradient_sha256
          OR OLD.checkpoint_sha256 IS DISTINCT FROM NEW.checkpoint_sha256)
    EXECUTE FUNCTION round_notify();

-- A report, which the duty holder's coordinator plans from.
CREATE OR REPLACE TRIGGER round_notify_report AFTER INSERT ON round_report
    FOR EACH STATEMENT EXECUTE FUNCTION round_notify();
