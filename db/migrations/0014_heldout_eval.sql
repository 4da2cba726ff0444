-- cotrain schema, version 14: held-out evaluation (doc/dataset.md, "The
-- held-out part"; doc/design.md, "Held-out evaluation").
--
-- dataset.heldout_tokens: the last tokens of the dataset's stream, set aside
-- by `cotrain-admin dataset import --heldout-fraction` and never handed out
-- as work: a project's epoch is cut from the first n_tokens - heldout_tokens
-- only.  Datasets imported before have none (0) and train on every token,
-- as before.
--
-- model_version.heldout_*: the server's evaluation of the version on its
-- project's fixed held-out sample: the mean cross-entropy in bits per byte
-- (byte tokenizer), the tokens it covered, the CPU seconds it took and when;
-- heldout_error when it could not be computed (not tried again).  NULL
-- until evaluated, and for versions a project does not evaluate.

ALTER TABLE dataset ADD COLUMN heldout_tokens bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT dataset_heldout_check CHECK (heldout_tokens >= 0 AND heldout_tokens < n_tokens);

ALTER TABLE model_version ADD COLUMN heldout_bpb double precision,
    ADD COLUMN heldout_tokens bigint,
    ADD COLUMN heldout_cpu_seconds double precision,
    ADD COLUMN heldout_at timestamptz,
    ADD COLUMN heldout_error text;

-- The evaluator's queue: versions not evaluated yet.
CREATE INDEX model_version_heldout_todo_idx ON model_version (project_id, version)
    WHERE heldout_at IS NULL;
