-- cotrain schema, version 26: the optimizer moments of v+1 that each peer
-- reports, and the uploaders whose checkpoint was refused (doc/averaging.md,
-- "Across groups between the peers").
--
-- Across groups between the peers the server takes v+1 from one peer and
-- checked only its parameters against the majority's hash: its optimizer
-- moments were the uploader's word.  Each peer now reports the sha256 of
-- its moments (first, then second, as fp32) with its outcome; an uploaded
-- checkpoint's moments must hash to what a strict majority of the included
-- peers reported, else it is refused and the next peer of the majority is
-- asked (checkpoint_refused).  NULL from clients that do not report it.
ALTER TABLE round_member ADD COLUMN moments_sha256 text
    CHECK (moments_sha256 ~ '^[0-9a-f]{64}$');
ALTER TABLE round_member ADD COLUMN checkpoint_refused boolean NOT NULL DEFAULT false;
