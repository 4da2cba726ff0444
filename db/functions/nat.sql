-- cotrain functions: what the NAT service and the rounds learned of each
-- host's connections (doc/nat.md, "What the server keeps"): the links a
-- peer reports with its outcome, and the "links" and "reachability" of the
-- host views.  host.nat_* and host.relay_* are written by
-- server/reachability.c.

-- round_outcome (round_averaging.sql) plus the host's links, in one transaction: the links
-- are stored (upserted: a repeated outcome replaces the rung and time of
-- each peer it names again) only when the outcome itself is answered 200.
-- p_links is NULL (the field was absent) or a JSON array of
-- {"peer": id, "rung": text, "connect_ms": number, "plan": text or absent}
-- objects that the server has checked already; peers that are not members of the round, or the host
-- itself, are dropped.  Membership is taken before the outcome is applied,
-- since a 'failed' outcome fails the round and empties its members.
DROP FUNCTION IF EXISTS round_outcome_links(bytea, text, integer, bigint, text, jsonb, text, jsonb, jsonb);
CREATE OR REPLACE FUNCTION round_outcome_links(p_token_hash bytea, p_project text, p_version integer,
                                    p_host bigint, p_status text, p_included jsonb,
                                    p_sha256 text, p_links jsonb, p_sketches jsonb,
                                    p_moments text DEFAULT NULL)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql AS $$
DECLARE
    v_project bigint;
    v_links   jsonb;
    v_why     text;
    o         record;
BEGIN
    SELECT p.id INTO v_project FROM project p WHERE p.name = p_project;
    IF v_project IS NOT NULL AND jsonb_typeof(p_links) = 'array' THEN
        SELECT coalesce(jsonb_agg(jsonb_build_object('peer', l.peer, 'rung', l.rung,
                                                     'connect_ms', l.connect_ms, 'plan', l.plan)), '[]')
          INTO v_links
          FROM (SELECT DISTINCT ON (x.peer) x.peer, x.rung, x.connect_ms, x.plan
                  FROM jsonb_to_recordset(p_links) AS x(peer bigint, rung text,
                                                          connect_ms double precision, plan text)
                 WHERE x.peer <> p_host
                   AND EXISTS (SELECT 1 FROM round_member m
                                WHERE m.project_id = v_project AND m.version = p_version
                                  AND m.host_id = x.peer)
                 ORDER BY x.peer) l;
    END IF;
    -- The sketches of what the host averaged (round_sketch.sql), stored
    -- before the outcome, which may commit the round, checks them.
    IF p_sketches IS NOT NULL AND jsonb_typeof(p_sketches) <> 'null' THEN
        v_why := round_sketches_invalid(p_sketches);
        IF v_why IS NOT NULL THEN
            RETURN QUERY SELECT 400, api_error('invalid', v_why);
            RETURN;
        END IF;
        IF v_project IS NOT NULL AND p_status IN ('ok', 'dropped')
           AND host_auth(p_token_hash) = p_host THEN
            -- The round's row first, then the member's, the order of every
            -- writer of both (round_outcome, round_group_sum_store): a
            -- member's outcome may come while its group's sum or mean hash
            -- is being kept, which sets the group's members' "included"
            -- under the round's lock, and the other order deadlocked.  FOR
            -- SHARE, as round_outcome takes it for an 'ok' or 'dropped'.
            PERFORM 1 FROM round WHERE project_id = v_project AND version = p_version FOR SHARE;
            UPDATE round_member SET sketches = p_sketches
             WHERE project_id = v_project AND version = p_version AND host_id = p_host
               AND outcome IS NULL;
        END IF;
    END IF;
    SELECT * INTO o FROM round_outcome(p_token_hash, p_project, p_version, p_host, p_status,
                                       p_included, p_sha256, p_moments);
    IF o.status = 200 AND v_links IS NOT NULL THEN
        INSERT INTO round_link AS k (project_id, version, host_id, peer_id, rung, connect_ms, plan)
        SELECT v_project, p_version, p_host, l.peer, l.rung, l.connect_ms, l.plan
          FROM jsonb_to_recordset(v_links) AS l(peer bigint, rung text, connect_ms double precision,
                                                plan text)
        ON CONFLICT (project_id, version, host_id, peer_id)
        DO UPDATE SET rung = EXCLUDED.rung, connect_ms = EXCLUDED.connect_ms, plan = EXCLUDED.plan,
                      reported_at = now();
    END IF;
    RETURN QUERY SELECT o.status, o.body;
END
$$;

-- Plans from history (doc/nat.md): how a rung ('punch' or 'lan') fared in
-- the latest links (those with a reported plan) of the pair (p_host,
-- p_peer), in both directions, or with p_peer NULL of p_host with anyone,
-- newest first: fails, the tries of the rung (planned, and something else
-- connected) since its latest success; peers, with how many other hosts
-- they failed; since, the rounds planned otherwise after the latest failed
-- try.
DROP FUNCTION IF EXISTS nat_rung_streak(bigint, bigint, text);
CREATE OR REPLACE FUNCTION nat_rung_streak(p_host bigint, p_peer bigint, p_rung text,
                                           OUT fails integer, OUT peers integer, OUT since integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r      record;
    v_last text;
    v_seen bigint[] := '{}';
BEGIN
    fails := 0;
    since := 0;
    FOR r IN SELECT k.project_id, k.version, k.plan, k.rung,
                    CASE WHEN k.host_id = p_host THEN k.peer_id ELSE k.host_id END AS other
               FROM round_link k
              WHERE k.plan IS NOT NULL
                AND CASE WHEN p_peer IS NULL THEN k.host_id = p_host OR k.peer_id = p_host
                         ELSE (k.host_id = p_host AND k.peer_id = p_peer)
                              OR (k.host_id = p_peer AND k.peer_id = p_host) END
              ORDER BY k.reported_at DESC, k.version DESC
              LIMIT 64
    LOOP
        IF r.plan = p_rung THEN
            EXIT WHEN r.rung = p_rung;
            fails := fails + 1;
            IF NOT r.other = ANY (v_seen) THEN
                v_seen := v_seen || r.other;
            END IF;
        ELSIF fails = 0 AND v_last IS DISTINCT FROM r.project_id || ':' || r.version THEN
            since := since + 1;
            v_last := r.project_id || ':' || r.version;
        END IF;
    END LOOP;
    peers := cardinality(v_seen);
END
$$;

-- Whether the NAT service should skip rung p_rung ('punch' or 'lan') for a
-- meeting of p_dialer and p_acceptor: NULL to try it, else the reason.
-- Skipped after 2 failed tries of the pair in a row (both directions
-- count), or when either host's punches failed with 3 other hosts and
-- succeeded with none since (a host whose punches fail with everyone; a
-- host whose punches fail only with one bad peer is not one); tried again once 3 rounds went by without it, so that a
-- router that was fixed is noticed.
CREATE OR REPLACE FUNCTION nat_history_skip(p_dialer bigint, p_acceptor bigint, p_rung text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM nat_rung_streak(p_dialer, p_acceptor, p_rung);
    IF s.fails >= 2 AND s.since < 3 THEN
        RETURN format('%s failed in the pair''s last %s tries', p_rung, s.fails);
    END IF;
    IF p_rung = 'punch' THEN
        SELECT * INTO s FROM nat_rung_streak(p_dialer, NULL, p_rung);
        IF s.peers >= 3 AND s.since < 3 THEN
            RETURN format('host %s''s punches failed with %s hosts', p_dialer, s.peers);
        END IF;
        SELECT * INTO s FROM nat_rung_streak(p_acceptor, NULL, p_rung);
        IF s.peers >= 3 AND s.since < 3 THEN
            RETURN format('host %s''s punches failed with %s hosts', p_acceptor, s.peers);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- The "history" of a host's links view: its own punch streak, and each
-- peer of its latest 20 rounds with links whose punch or lan dial failed
-- lately, with what the NAT service plans for the pair now.
CREATE OR REPLACE FUNCTION host_nat_history_json(p_host bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH peers AS (
        SELECT DISTINCT CASE WHEN k.host_id = p_host THEN k.peer_id ELSE k.host_id END AS peer
          FROM (SELECT * FROM round_link k
                 WHERE k.host_id = p_host OR k.peer_id = p_host
                 ORDER BY k.reported_at DESC LIMIT 200) k
    ), streaks AS (
        SELECT p.peer, g.rung, s.fails, s.since, nat_history_skip(p_host, p.peer, g.rung) AS why
          FROM peers p CROSS JOIN (VALUES ('lan'), ('punch')) AS g(rung)
          CROSS JOIN LATERAL nat_rung_streak(p_host, p.peer, g.rung) s
    )
    SELECT jsonb_build_object(
        'failed_punches', (SELECT s.fails FROM nat_rung_streak(p_host, NULL, 'punch') s),
        'failed_punch_peers', (SELECT s.peers FROM nat_rung_streak(p_host, NULL, 'punch') s),
        'pairs', (SELECT coalesce(jsonb_agg(jsonb_build_object('peer', t.peer, 'rung', t.rung,
                          'failed', t.fails, 'rounds_since', t.since,
                          'skipped', t.why IS NOT NULL, 'why', t.why) ORDER BY t.peer, t.rung), '[]')
                    FROM streaks t WHERE t.fails > 0))
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
               count(*) FILTER (WHERE k.rung = 'lan') AS lan,
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
        'last_20_rounds', (SELECT jsonb_build_object('rounds', c.rounds, 'lan', c.lan,
                                                  'direct', c.direct, 'punch', c.punch,
                                                  'relay', c.relay)
                          FROM counts c),
        'history', host_nat_history_json(p_host))
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
