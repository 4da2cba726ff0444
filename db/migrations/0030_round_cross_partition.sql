-- cotrain schema, version 30: a round's slices across groups kept once, on
-- the round, instead of each aggregator's share of them on its member row
-- (doc/scale.md, runs N).
--
-- Version 27 kept every aggregator's slices with their holders
-- (round_member.cross_slices): about 10 KB for each of 1,000 members, 10 MB
-- of JSON written by each plan, which made storing a plan of 1,000 hosts
-- take 0.33 s.  The whole partition (round_cross_partition) is about 30
-- slices, 160 KB: round_plan_store keeps it in round.cross_partition, and a
-- plan's answers take each aggregator's slices from it by range.  NULL for
-- rounds that average through the server or in one group; a round planned
-- before this version computes the partition when asked.
ALTER TABLE round ADD COLUMN cross_partition jsonb;
ALTER TABLE round_member DROP COLUMN cross_slices;
