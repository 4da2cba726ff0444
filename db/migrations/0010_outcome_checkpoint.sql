-- cotrain schema, version 10: an accepted peer learns which checkpoint its
-- parameters are.
--
-- "accepted" says that a peer's v+1 equals the server's v+1 of the round's
-- current attempt, not that the round commits: a later failure (another
-- peer's) opens the round again, and a new attempt may commit another v+1
-- without this peer.  A peer that kept its own v+1 and went on computing
-- version v+1 from it then trained, and stepped, from parameters that are
-- not the project's.  So an accepted peer is now also told the checkpoint
-- of the v+1 it holds ("checkpoint_sha256"), and keeps its model for a
-- work unit of version v+1 only when that unit's checkpoint is the same
-- file (client/daemon.c); otherwise it loads the unit's.

-- The answer to a peer's outcome, as in 0005, plus "checkpoint_sha256" (the
-- server's v+1) for an accepted peer.
CREATE OR REPLACE FUNCTION round_outcome_body(p_project bigint, p_version integer, p_host bigint)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    ro record;
    m  record;
    b  jsonb;
BEGIN
    SELECT * INTO ro FROM round WHERE project_id = p_project AND version = p_version;
    SELECT * INTO m FROM round_member
     WHERE project_id = p_project AND version = p_version AND host_id = p_host;
    b := jsonb_build_object('version', p_version, 'host_id', p_host,
        'status', coalesce(m.outcome, 'failed'),
        'round', jsonb_build_object('state', ro.state, 'version', p_version,
                                    'attempt', ro.attempt, 'last_failure', ro.last_failure));
    IF m.included IS FALSE THEN
        b := b || jsonb_build_object('accepted', false);
        IF ro.params_sha256 IS NOT NULL THEN
            b := b || jsonb_build_object('params_sha256', ro.params_sha256);
        END IF;
    ELSIF m.outcome = 'ok' AND ro.params_sha256 IS NOT NULL THEN
        b := b || jsonb_build_object('params_sha256', ro.params_sha256,
                                     'accepted', m.params_sha256 = ro.params_sha256);
    END IF;
    IF ro.checkpoint_sha256 IS NOT NULL AND b->'accepted' = 'false'::jsonb THEN
        b := b || jsonb_build_object('reload', jsonb_build_object(
            'version', p_version + 1, 'checkpoint_sha256', ro.checkpoint_sha256,
            'url', '/files/' || ro.checkpoint_sha256));
    ELSIF ro.checkpoint_sha256 IS NOT NULL AND b->'accepted' = 'true'::jsonb THEN
        b := b || jsonb_build_object('checkpoint_sha256', ro.checkpoint_sha256);
    END IF;
    RETURN b::text;
END
$$;
