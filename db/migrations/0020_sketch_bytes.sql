-- cotrain schema, version 20: the averaged bytes tied to the committed
-- sketches (doc/credit.md, "Tied to the bytes").
--
-- With its outcome each peer reports the sketches of what it averaged: as
-- an aggregator, of every member's slice as received and of the sum it
-- returned; as a member, of every result slice it received.  Before a
-- round commits the server checks them against each other and against the
-- sketches the members committed with their reports; a host that fails is
-- flagged here, denied its credit, and the round reruns without it.

-- What the peer's outcome reported (db/functions/round_sketch.sql).  A
-- peer its group left out but which aggregated a range reports 'dropped'
-- with the sketches of what it aggregated: the checks of the others'
-- slices need them.
ALTER TABLE round_member ADD COLUMN sketches jsonb;
ALTER TABLE round_member DROP CONSTRAINT round_member_outcome_check;
ALTER TABLE round_member ADD CONSTRAINT round_member_outcome_check
    CHECK (outcome IN ('ok', 'failed', 'dropped'));

-- One row per failed check: the host, in which role, why, and the check's
-- distance beside its tolerance (both relative to the larger sketch).
CREATE TABLE round_sketch_flag (
    id          bigserial PRIMARY KEY,
    project_id  bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version     integer NOT NULL,
    attempt     integer NOT NULL,
    host_id     bigint NOT NULL REFERENCES host(id) ON DELETE CASCADE,
    role        text NOT NULL CHECK (role IN ('member', 'aggregator')),
    reason      text NOT NULL,
    distance    double precision NOT NULL,
    tolerance   double precision NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX round_sketch_flag_host_idx ON round_sketch_flag (host_id);
CREATE INDEX round_sketch_flag_round_idx ON round_sketch_flag (project_id, version);

-- round_outcome_links takes the sketches now (db/functions/nat.sql).
DROP FUNCTION round_outcome_links(bytea, text, integer, bigint, text, jsonb, text, jsonb);
