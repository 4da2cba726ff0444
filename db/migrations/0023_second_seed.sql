-- cotrain schema, version 23: a second sketch seed, drawn after the bytes
-- are pinned (doc/credit.md, "A second seed, drawn after the bytes are
-- pinned").
--
-- When a round commits the server draws seed2 at random (from nothing a
-- host sees) and hands it out with the outcome.  Each included peer then
-- sends the sketches under seed2 of what it kept: as a member, of each
-- block of its microbatches' gradient and of each result slice it
-- received; as an aggregator, of each member's slice as it decoded it and
-- of its result.  The server checks them as it checks those under the
-- work unit's seed before the commit (round_seed2.sql); a host that fails
-- is flagged (round_sketch_flag.seed2), denied, and left out of the
-- project's later rounds.
ALTER TABLE round ADD COLUMN seed2 bigint;
-- When the check under seed2 ran (all sketches in, or their deadline past).
ALTER TABLE round ADD COLUMN seed2_checked_at timestamptz;
ALTER TABLE round_member ADD COLUMN seed2_sketches jsonb;
ALTER TABLE round_sketch_flag ADD COLUMN seed2 boolean NOT NULL DEFAULT false;
-- A spot check of one block of a member's microbatches (drawn by
-- round_seed2_verify): the round's second seed, under which the checker
-- also sketches the block's gradient sum; its host's sketch of that block
-- closes fp_host.
ALTER TABLE spot_check ADD COLUMN seed2 bigint;
