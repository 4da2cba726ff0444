-- cotrain functions: where a joiner fetches a checkpoint from (doc/design.md,
-- "Checkpoints from peers"; doc/api.md, "Checkpoints").
--
-- The hosts that hold checkpoint p_sha of project p_project are the peers
-- the server accepted in the round that made it: their own step equalled
-- the server's, so they can write the same file from the model they keep
-- (and serve its pieces on their peer port).  The server adds the piece
-- manifest itself (server/api_checkpoints.c); the joiner checks every piece
-- against it, so a host listed here that lies costs only a retry.

-- (status, body) for the authenticated host of p_token_hash: 200 with
-- {"sha256", "version", "size", "peers": [{"host_id", "endpoint"}]} (at
-- most p_limit peers, in random order, never the asking host, never a
-- revoked one), 401 for a bad token, 404 for a project or a checkpoint
-- that does not exist, or one older than the version before the current:
-- only those are fetched from peers (so only those have their manifest
-- built by the server, which reads and hashes the whole file).  Changes
-- nothing.
CREATE OR REPLACE FUNCTION ckpt_sources(p_token_hash bytea, p_project text, p_sha text, p_limit integer)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_host    bigint;
    v_project bigint;
    v_current integer;
    c         record;
    v_peers   jsonb;
BEGIN
    v_host := host_auth(p_token_hash);
    IF v_host IS NULL THEN
        RETURN QUERY SELECT 401, api_error('unauthorized', 'host token is not valid',
                                           'Register the host again to get a new token.');
        RETURN;
    END IF;
    SELECT p.id, p.current_version INTO v_project, v_current FROM project p WHERE p.name = p_project;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('project "%s" does not exist', p_project));
        RETURN;
    END IF;
    SELECT mv.version, f.size INTO c
      FROM model_version mv JOIN file f ON f.sha256 = mv.checkpoint_sha256
     WHERE mv.project_id = v_project AND mv.checkpoint_sha256 = p_sha
     ORDER BY mv.version DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 404, api_error('not_found',
            format('file %s is not a checkpoint of project "%s"', p_sha, p_project),
            'Ask for the project''s current checkpoint (GET /v1/projects/<name>).');
        RETURN;
    END IF;
    IF c.version < v_current - 1 THEN
        RETURN QUERY SELECT 404, api_error('not_found',
            format('checkpoint %s is of version %s: only those of versions %s and %s come from peers',
                   p_sha, c.version, v_current - 1, v_current),
            format('Download it whole from /files/%s.', p_sha));
        RETURN;
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object('host_id', s.host_id, 'endpoint', s.endpoint)), '[]'::jsonb)
      INTO v_peers
      FROM (SELECT rm.host_id, rm.endpoint
              FROM round_member rm
              JOIN round ro ON ro.project_id = rm.project_id AND ro.version = rm.version
              JOIN host h ON h.id = rm.host_id
             WHERE rm.project_id = v_project AND rm.version = c.version - 1
               AND ro.state = 'committed' AND rm.accepted AND NOT h.revoked
               AND rm.host_id <> v_host
             ORDER BY random() LIMIT greatest(p_limit, 0)) s;
    RETURN QUERY SELECT 200, jsonb_build_object('sha256', p_sha, 'version', c.version, 'size', c.size,
                                                'peers', v_peers)::text;
END
$$;
