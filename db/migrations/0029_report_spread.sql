-- cotrain schema, version 29: the window over which the hosts of a closing
-- round spread their reports (round_report_spread_ms, fixed when the round
-- closes; answers name it as "report_spread_ms"; doc/scale.md, "Runs L").
ALTER TABLE round ADD COLUMN report_spread_ms integer;
