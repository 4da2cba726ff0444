-- cotrain schema, version 22: averaging across groups peer to peer
-- (doc/averaging.md, "Across groups"; cotrain-server --round-cross-peers).
--
-- A round planned with cross_peers averages across its groups between the
-- peers: the server gets from each group the hash of the round's mean its
-- members hold (round_group_sum.sum_sha256, no bytes), and from one peer
-- the checkpoint of v+1 that most included peers hold, never a gradient.
ALTER TABLE round ADD COLUMN cross_peers boolean NOT NULL DEFAULT false;
