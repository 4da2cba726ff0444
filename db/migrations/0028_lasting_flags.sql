-- cotrain schema, version 28: flags that keep a host out of its project's
-- later rounds, from a check under a second seed (as before) and from a
-- spot check of committed microbatch sketches that its checker and a third
-- host both disagreed with (doc/credit.md, "Spot checks").
--
-- round_sketch_flag.lasting marks both (round_sketch_bars and
-- round_banned_hosts read it); spot_check_id names the spot check of the
-- second kind.  round_seed2_banned and round_seed2_lock are now
-- round_banned_hosts and round_flag_lock (db/functions/round_sketch.sql).
ALTER TABLE round_sketch_flag ADD COLUMN lasting boolean NOT NULL DEFAULT false;
ALTER TABLE round_sketch_flag ADD COLUMN spot_check_id bigint REFERENCES spot_check(id) ON DELETE SET NULL;
UPDATE round_sketch_flag SET lasting = true WHERE seed2;
DROP FUNCTION IF EXISTS round_seed2_banned(bigint);
DROP FUNCTION IF EXISTS round_seed2_lock(bigint);
