-- cotrain schema, version 11: functions live in db/functions/.
--
-- From here on every function has one current definition, in a file of
-- db/functions/ per concern, that `cotrain-admin db migrate` applies after
-- the migrations whenever the file's sha256 differs from the one recorded
-- in schema_function_files (db/README).  Migrations keep table changes and
-- data moves; a function is never copied into a migration to change it.
--
-- This drops what those definitions no longer use: the scheduler's
-- functions of 0002, renamed *_v2 in 0003 and wrapped by functions that
-- added the round's state, are folded into those (db/functions/sched.sql);
-- spot_host (0006) is host_auth (db/functions/host_auth.sql), which every
-- function that takes a host token now calls.  The callers left in the
-- database until the function files are applied, in the same transaction,
-- are PL/pgSQL and resolve the names they call only when they run.

DROP FUNCTION sched_assign_v2(bytea, bigint, text, bigint, bigint);
DROP FUNCTION sched_heartbeat_v2(bytea, bigint, bigint, real);
DROP FUNCTION sched_handback_v2(bytea, bigint, bigint);
DROP FUNCTION sched_finish_v2(bytea, bigint);
DROP FUNCTION spot_host(bytea);
