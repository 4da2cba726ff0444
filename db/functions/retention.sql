-- cotrain functions: file store retention (doc/design.md, "Retention and
-- backup").  The collector (server/file_gc.c), run by the server's timer
-- (--gc-interval) and by `cotrain-admin files gc`, calls file_gc_collect to
-- drop the rows of the files the policy lets go, then removes the files
-- themselves; file_gc_referenced names every stored file that must stay
-- although no `file` row indexes it (group sums and mean gradients).

-- The versions whose checkpoints stay: per project the current one, the
-- last p_keep_last (the current one included), every p_keep_every-th (0:
-- none), the pinned ones, and every version something still needs: a live
-- work unit computes on it, its round is not committed, an open spot check
-- recomputes a range on it.
CREATE OR REPLACE FUNCTION file_gc_kept_versions(p_keep_last integer, p_keep_every integer)
RETURNS TABLE (project_id bigint, version integer)
LANGUAGE sql STABLE AS $$
    SELECT mv.project_id, mv.version
      FROM model_version mv JOIN project p ON p.id = mv.project_id
     WHERE mv.version = p.current_version
        OR mv.version > p.current_version - p_keep_last
        OR (p_keep_every > 0 AND mv.version % p_keep_every = 0)
        OR mv.pinned
        OR EXISTS (SELECT 1 FROM work_unit w
                    WHERE w.project_id = mv.project_id AND w.version = mv.version
                      AND w.state = 'live')
        OR EXISTS (SELECT 1 FROM round r
                    WHERE r.project_id = mv.project_id AND r.version = mv.version
                      AND r.state <> 'committed')
        OR EXISTS (SELECT 1 FROM spot_check c
                    WHERE c.project_id = mv.project_id AND c.version = mv.version
                      AND c.state = 'open')
$$;

-- The indexed files (rows of `file`) the policy lets go: checkpoints of no
-- kept version and of no round still averaging, shards and manifests of no
-- dataset (a tokenizer's model is never let go: its row pins it); never a row younger than p_grace_s seconds (its writer may not
-- have stored what references it yet).  Without p_dry_run the references
-- are cleared (model_version.checkpoint_sha256 of versions that are not
-- kept, round.checkpoint_sha256 of committed rounds) and the rows deleted,
-- in the caller's transaction; the caller then removes the files (a row
-- must never outlive its file; a file outliving its row is garbage the next
-- pass finds).  Each row: the file, its size and kind, and the project and
-- lowest version that named it (NULL when none did).  Locks model_version
-- against commits and pins, so a version that becomes needed during the
-- pass (a commit opening spot checks) is seen.
CREATE OR REPLACE FUNCTION file_gc_collect(p_keep_last integer, p_keep_every integer,
                                           p_grace_s integer, p_dry_run boolean)
RETURNS TABLE (sha256 text, size bigint, kind text, project text, version integer)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_keep_last IS NULL OR p_keep_last < 1 THEN
        RAISE EXCEPTION 'keep_last must be at least 1' USING ERRCODE = '22023';
    END IF;
    IF p_keep_every IS NULL OR p_keep_every < 0 OR p_grace_s IS NULL OR p_grace_s < 0 THEN
        RAISE EXCEPTION 'keep_every and grace must not be negative' USING ERRCODE = '22023';
    END IF;
    LOCK TABLE model_version IN SHARE ROW EXCLUSIVE MODE;
    CREATE TEMP TABLE IF NOT EXISTS gc_doomed (sha256 text PRIMARY KEY, size bigint, kind text,
                                               project text, version integer) ON COMMIT DROP;
    TRUNCATE gc_doomed;
    INSERT INTO gc_doomed
    SELECT f.sha256, f.size, f.kind,
           (SELECT p.name FROM model_version mv JOIN project p ON p.id = mv.project_id
             WHERE mv.checkpoint_sha256 = f.sha256 ORDER BY mv.version LIMIT 1),
           (SELECT min(mv.version) FROM model_version mv WHERE mv.checkpoint_sha256 = f.sha256)
      FROM file f
     WHERE f.created_at <= now() - make_interval(secs => p_grace_s)
       AND NOT EXISTS (SELECT 1 FROM dataset d WHERE d.manifest_sha256 = f.sha256)
       AND NOT EXISTS (SELECT 1 FROM shard s WHERE s.sha256 = f.sha256)
       AND NOT EXISTS (SELECT 1 FROM tokenizer t WHERE t.sha256 = f.sha256)
       AND NOT EXISTS (SELECT 1 FROM round r
                        WHERE r.checkpoint_sha256 = f.sha256 AND r.state <> 'committed')
       AND NOT EXISTS (SELECT 1 FROM file_gc_kept_versions(p_keep_last, p_keep_every) k
                         JOIN model_version mv
                           ON mv.project_id = k.project_id AND mv.version = k.version
                        WHERE mv.checkpoint_sha256 = f.sha256);
    IF NOT p_dry_run THEN
        UPDATE model_version mv SET checkpoint_sha256 = NULL
          FROM gc_doomed g WHERE mv.checkpoint_sha256 = g.sha256;
        UPDATE round r SET checkpoint_sha256 = NULL
          FROM gc_doomed g WHERE r.checkpoint_sha256 = g.sha256;
        DELETE FROM file f USING gc_doomed g WHERE f.sha256 = g.sha256;
    END IF;
    RETURN QUERY SELECT g.sha256, g.size, g.kind, g.project, g.version
                   FROM gc_doomed g ORDER BY g.project NULLS LAST, g.version, g.sha256;
END
$$;

-- Every stored file that must stay: the indexed ones (rows of `file`), the
-- group sums and mean gradient of every round that is not committed or
-- whose version has an open spot check, and the sum a peer alone in its
-- group uploaded until the server sketched it under the round's second
-- seed (round_group_sum_seed2_todo) or the check under it ran.  Any other file in the store is
-- garbage once older than the grace period.
CREATE OR REPLACE FUNCTION file_gc_referenced() RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT f.sha256 FROM file f
    UNION
    SELECT x.sha FROM round r
     CROSS JOIN LATERAL (SELECT g.sum_sha256 AS sha FROM round_group_sum g
                          WHERE g.project_id = r.project_id AND g.version = r.version
                         UNION ALL SELECT r.gradient_sha256) x
     WHERE x.sha IS NOT NULL
       AND (r.state <> 'committed'
            OR EXISTS (SELECT 1 FROM spot_check c
                        WHERE c.project_id = r.project_id AND c.version = r.version
                          AND c.state = 'open'))
    UNION
    SELECT g.sum_sha256 FROM round_group_sum g JOIN round r USING (project_id, version)
     WHERE r.seed2 IS NOT NULL AND r.seed2_checked_at IS NULL
       AND g.sketch IS NOT NULL AND g.sketch2 IS NULL
$$;

-- The bytes a project's checkpoints take in the store (a file shared with
-- another project, such as a common version 0, counts for each).  Shards
-- and manifests belong to datasets; group sums and mean gradients are not
-- indexed and live only until their round is committed.
CREATE OR REPLACE FUNCTION file_project_bytes(p_project bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(f.size), 0)::bigint FROM file f
     WHERE f.sha256 IN (SELECT mv.checkpoint_sha256 FROM model_version mv
                         WHERE mv.project_id = p_project)
$$;
