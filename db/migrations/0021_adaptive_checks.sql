-- cotrain schema, version 21: spot-check rates that fall as a host's record
-- grows (doc/credit.md, "Spot checks").
--
-- A host is checked with probability first_rate while its record
-- (consecutive agreeing checks) is below trusted_after, and from there with
-- first_rate x decay^(record - trusted_after + 1), never below min_rate: each
-- agreeing check multiplies the rate by decay.  Any failure puts the record
-- back to 0.  With the new defaults (trusted_after 1, decay 0.5) a new host
-- is checked on its first round, then on about half, a quarter, ... of the
-- next ones; the checks of a demo-size run (33 rounds) cost 0.95% of its
-- compute where BOINC's rule (trusted_after 10, then 1/record) cost 2.3%,
-- and 6.25% over the first 10 rounds (tests/bench/bench-checks.sh).

ALTER TABLE spot_policy ADD COLUMN decay double precision NOT NULL DEFAULT 0.5
    CHECK (decay > 0 AND decay <= 1);
ALTER TABLE spot_policy ALTER COLUMN trusted_after SET DEFAULT 1;

-- Projects on the old default (10, from the table's default, not from
-- their project file or a change of it) take the new one.  (Plain SQL: a
-- migration runs before this build's function files.)
UPDATE spot_policy s SET trusted_after = 1
  FROM project p
 WHERE p.id = s.project_id AND s.trusted_after = 10
   AND NOT coalesce(p.config->'validation' ? 'trusted_after', false)
   AND NOT EXISTS (SELECT 1
                     FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p.config->'changes') = 'array'
                                                    THEN p.config->'changes' ELSE '[]' END) c
                    WHERE coalesce(c->'validation' ? 'trusted_after', false));
