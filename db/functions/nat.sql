-- cotrain functions: what the NAT service and the rounds learned of each
-- host's connections (doc/nat.md, "What the server keeps"): the links a
-- peer reports with its outcome, and the "links" and "reachability" of the
-- host views.  host.nat_* and host.relay_* are written by
-- server/reachability.c.

-- round_outcome (round_averaging.sql) plus the host's links, in one transaction: the links
-- are stored (upserted: a repeated outcome replaces the rung and time of
-- each peer it names again) only when the outcome itself is answered 200.
-- p_links is NULL (the field was absent) or a JSON array of
-- {"peer": id, "rung": text, "connect_ms": number} objects that the server
-- has checked already; peers that are not members of the round, or the host
-- itself, are dropped.  Membership is taken before the outcome is applied,
-- since a 'failed' outcome fails the round and empties its members.
CREATE OR REPLACE FUNCTION round_outcome_links(p_token_hash bytea, p_project text, p_version integer,
                                    p_host bigint, p_status text, p_included jsonb,
                                    p_sha256 text, p_links jsonb)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_project bigint;
    v_links   jsonb;
    o         record;
BEGIN
    SELECT p.id INTO v_project FROM project p WHERE p.name = p_project;
    IF v_project IS NOT NULL AND jsonb_typeof(p_links) = 'array' THEN
        SELECT coalesce(jsonb_agg(jsonb_build_object('peer', l.peer, 'rung', l.rung,
                                                     'connect_ms', l.connect_ms)), '[]')
          INTO v_links
          FROM (SELECT DISTINCT ON (x.peer) x.peer, x.rung, x.connect_ms
                  FROM jsonb_to_recordset(p_links) AS x(peer bigint, rung text,
                                                          connect_ms double precision)
                 WHERE x.peer <> p_host
                   AND EXISTS (SELECT 1 FROM round_member m
                                WHERE m.project_id = v_project AND m.version = p_version
                                  AND m.host_id = x.peer)
                 ORDER BY x.peer) l;
    END IF;
    SELECT * INTO o FROM round_outcome(p_token_hash, p_project, p_version, p_host, p_status,
                                       p_included, p_sha256);
    IF o.status = 200 AND v_links IS NOT NULL THEN
        INSERT INTO round_link AS k (project_id, version, host_id, peer_id, rung, connect_ms)
        SELECT v_project, p_version, p_host, l.peer, l.rung, l.connect_ms
          FROM jsonb_to_recordset(v_links) AS l(peer bigint, rung text, connect_ms double precision)
        ON CONFLICT (project_id, version, host_id, peer_id)
        DO UPDATE SET rung = EXCLUDED.rung, connect_ms = EXCLUDED.connect_ms, reported_at = now();
    END IF;
    RETURN QUERY SELECT o.status, o.body;
END
$$;

-- The "links" of a host's views (doc/api.md, "Hosts"): the connections of
-- the latest round the host took part in with links, both those it dialed
-- and those dialed to it, and the rungs of the connections it dialed over
-- its latest 20 such rounds.
CREATE OR REPLACE FUNCTION host_links_json(p_host bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH latest AS (
        SELECT k.project_id, k.version
          FROM round_link k
         WHERE k.host_id = p_host OR k.peer_id = p_host
         ORDER BY k.reported_at DESC, k.version DESC
         LIMIT 1
    ), recent AS (
        SELECT k.project_id, k.version, max(k.reported_at) AS at
          FROM round_link k
         WHERE k.host_id = p_host
         GROUP BY k.project_id, k.version
         ORDER BY 3 DESC
         LIMIT 20
    ), counts AS (
        SELECT count(DISTINCT (k.project_id, k.version)) AS rounds,
               count(*) FILTER (WHERE k.rung = 'direct') AS direct,
               count(*) FILTER (WHERE k.rung = 'punch') AS punch,
               count(*) FILTER (WHERE k.rung = 'relay') AS relay
          FROM round_link k JOIN recent r USING (project_id, version)
         WHERE k.host_id = p_host
    )
    SELECT jsonb_build_object(
        'project', (SELECT p.name FROM latest l JOIN project p ON p.id = l.project_id),
        'version', (SELECT l.version FROM latest l),
        'dialed', (SELECT coalesce(jsonb_agg(jsonb_build_object('peer', k.peer_id,
                           'rung', k.rung, 'connect_ms', k.connect_ms) ORDER BY k.peer_id), '[]')
                     FROM round_link k JOIN latest l USING (project_id, version)
                    WHERE k.host_id = p_host),
        'accepted', (SELECT coalesce(jsonb_agg(jsonb_build_object('peer', k.host_id,
                             'rung', k.rung, 'connect_ms', k.connect_ms) ORDER BY k.host_id), '[]')
                       FROM round_link k JOIN latest l USING (project_id, version)
                      WHERE k.peer_id = p_host),
        'last_20_rounds', (SELECT jsonb_build_object('rounds', c.rounds, 'direct', c.direct,
                                                  'punch', c.punch, 'relay', c.relay)
                          FROM counts c))
$$;

-- The "reachability" of a host's views, from the host row.  The public
-- endpoint is only for its owner (p_owner): it is the volunteer's address.
CREATE OR REPLACE FUNCTION host_reachability_json(h host, p_owner boolean) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'class', coalesce(h.nat_class, 'unknown'),
        'mapping', coalesce(h.nat_mapping, 'unknown'),
        'observed_at', h.nat_observed_at,
        'relay_bytes_in', h.relay_bytes_in,
        'relay_bytes_out', h.relay_bytes_out,
        'relay_sessions', h.relay_sessions)
    || CASE WHEN p_owner THEN jsonb_build_object('public_endpoint',
           CASE WHEN h.nat_public_addr IS NULL THEN NULL
                WHEN strpos(h.nat_public_addr, ':') > 0
                THEN '[' || h.nat_public_addr || ']:' || h.nat_public_port
                ELSE h.nat_public_addr || ':' || h.nat_public_port END)
       ELSE '{}'::jsonb END
$$;
