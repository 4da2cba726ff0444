-- cotrain schema, version 17: spot checks on per-microbatch sketches
-- (doc/credit.md, "Spot checks").
--
-- A host sends with each work unit's report the sketch of every
-- microbatch's gradient (shared/common/sketch.h) under its round's sketch
-- seed.  A spot check then recomputes only a few of those microbatches
-- (spot_policy.microbatches) and compares them with what the host
-- committed; a disagreement is settled by a third host.

-- The secret the round sketch seeds are derived from (spot_sketch_seed).
ALTER TABLE project ADD COLUMN sketch_secret uuid NOT NULL DEFAULT gen_random_uuid();

-- How many microbatches a check recomputes.
ALTER TABLE spot_policy ADD COLUMN microbatches integer NOT NULL DEFAULT 2
    CHECK (microbatches BETWEEN 1 AND 64);

-- The sketches a work unit's report committed: mb_done rows of k values,
-- row i for stream microbatch lo + i, flattened.
CREATE TABLE work_unit_sketch (
    work_unit_id   bigint PRIMARY KEY REFERENCES work_unit(id) ON DELETE CASCADE,
    k              integer NOT NULL CHECK (k BETWEEN 1 AND 256),
    sketches       double precision[] NOT NULL
);

-- A check of microbatches (NULL: of the whole range [lo, hi), as before):
-- fp_host holds the host's committed sketches of them, set when the check
-- opens, so the host need not answer (nor be attached).  A checker that
-- disagrees with them (disputed_at) brings a third host.
ALTER TABLE spot_check
    ADD COLUMN microbatches bigint[],
    ADD COLUMN disputed_at timestamptz,
    ADD COLUMN third_id bigint REFERENCES host(id) ON DELETE SET NULL,
    ADD COLUMN third_assigned_at timestamptz,
    ADD COLUMN fp_third double precision[],
    ADD COLUMN outcome text;
CREATE INDEX spot_check_third_idx ON spot_check (third_id) WHERE state = 'open';

-- round_report takes the sketches now (db/functions/round_report.sql).
DROP FUNCTION round_report(bytea, bigint, bigint, bigint, text, double precision, boolean, jsonb,
                           double precision);

-- Pending credit is shown beside the totals (credit_pending_*): what a
-- holder's open spot checks still hold back.
CREATE INDEX credit_grant_account_pending_idx ON credit_grant (account_id) WHERE status = 'pending';
CREATE INDEX credit_grant_team_pending_idx ON credit_grant (team_id) WHERE status = 'pending';
