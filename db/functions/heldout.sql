-- cotrain functions: held-out evaluation (doc/design.md, "Held-out
-- evaluation").  The server's evaluator thread (server/heldout_eval.c) asks
-- heldout_next for a committed version to evaluate and records the result
-- with heldout_store (heldout_store_mlm for an encoder); the API, the dashboard, /metrics and cotrain-admin
-- status read model_version.heldout_* (heldout_latest for the newest).

-- A project's evaluation settings from its project file (defaults as in
-- doc/project-file.md for projects created before they existed).
CREATE OR REPLACE FUNCTION heldout_every(p_config jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((p_config->>'eval_every')::integer, 1)
$$;

CREATE OR REPLACE FUNCTION heldout_sequences(p_config jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((p_config->>'eval_sequences')::integer, 32)
$$;

-- The next version to evaluate, at most one row: a committed version (at
-- or below the project's current one) with a checkpoint, not evaluated yet,
-- of a project that evaluates it (eval_every > 0, version a multiple of
-- it) on a dataset with a held-out part.  Newest commit first, so that a
-- backlog never delays the version everyone looks at.  The sample: the
-- first n_seq sequences of seq_len + 1 tokens of the held-out part, which
-- starts at heldout_first.
CREATE OR REPLACE FUNCTION heldout_next()
RETURNS TABLE (project_id bigint, project text, version integer, checkpoint_sha256 text,
               dataset_id bigint, heldout_first bigint, seq_len integer, n_seq bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.id, p.name, mv.version, mv.checkpoint_sha256, d.id, d.n_tokens - d.heldout_tokens,
           p.seq_len, least(heldout_sequences(p.config), (d.heldout_tokens - 1) / p.seq_len)
      FROM model_version mv
      JOIN project p ON p.id = mv.project_id
      JOIN dataset d ON d.id = p.dataset_id
     WHERE mv.heldout_at IS NULL AND mv.checkpoint_sha256 IS NOT NULL
       AND mv.version <= p.current_version
       AND d.heldout_tokens > p.seq_len
       AND heldout_every(p.config) > 0 AND mv.version % heldout_every(p.config) = 0
     ORDER BY mv.created_at DESC, mv.project_id
     LIMIT 1
$$;

-- Record an evaluation: bits per byte, tokens, CPU seconds, or an error
-- (p_bpb NULL).  Only the first result of a version counts; several
-- servers sharing the database compute the same value anyway.
CREATE OR REPLACE FUNCTION heldout_store(p_project bigint, p_version integer, p_bpb double precision,
                                         p_tokens bigint, p_cpu_seconds double precision, p_error text)
RETURNS void LANGUAGE sql AS $$
    UPDATE model_version
       SET heldout_bpb = p_bpb, heldout_tokens = p_tokens, heldout_cpu_seconds = p_cpu_seconds,
           heldout_error = p_error, heldout_at = now()
     WHERE project_id = p_project AND version = p_version AND heldout_at IS NULL
$$;

-- Record an encoder's evaluation: masked-LM loss (nats) and accuracy, the
-- predicted positions, CPU seconds, or an error (p_loss NULL).  As
-- heldout_store, only the first result of a version counts.
CREATE OR REPLACE FUNCTION heldout_store_mlm(p_project bigint, p_version integer,
                                             p_loss double precision, p_accuracy double precision,
                                             p_predicted bigint, p_cpu_seconds double precision,
                                             p_error text)
RETURNS void LANGUAGE sql AS $$
    UPDATE model_version
       SET heldout_mlm_loss = p_loss, heldout_mlm_accuracy = p_accuracy,
           heldout_tokens = p_predicted, heldout_cpu_seconds = p_cpu_seconds,
           heldout_error = p_error, heldout_at = now()
     WHERE project_id = p_project AND version = p_version AND heldout_at IS NULL
$$;

-- An encoder project's newest evaluated version and its masked-LM figures
-- (no row: none yet).
CREATE OR REPLACE FUNCTION heldout_mlm_latest(p_project bigint)
RETURNS TABLE (version integer, heldout_mlm_loss double precision,
               heldout_mlm_accuracy double precision, heldout_tokens bigint)
LANGUAGE sql STABLE AS $$
    SELECT mv.version, mv.heldout_mlm_loss, mv.heldout_mlm_accuracy, mv.heldout_tokens
      FROM model_version mv
     WHERE mv.project_id = p_project AND mv.heldout_mlm_loss IS NOT NULL
     ORDER BY mv.version DESC
     LIMIT 1
$$;

-- A project's newest evaluated version and its figures (no row: none yet).
CREATE OR REPLACE FUNCTION heldout_latest(p_project bigint)
RETURNS TABLE (version integer, heldout_bpb double precision, heldout_tokens bigint,
               heldout_cpu_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT mv.version, mv.heldout_bpb, mv.heldout_tokens, mv.heldout_cpu_seconds
      FROM model_version mv
     WHERE mv.project_id = p_project AND mv.heldout_bpb IS NOT NULL
     ORDER BY mv.version DESC
     LIMIT 1
$$;
