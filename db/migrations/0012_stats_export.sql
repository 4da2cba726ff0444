-- cotrain schema, version 12: what BOINC's stats export needs
-- (server/export_stats.c, doc/credit.md "Stats export").
--
-- account.show_hosts: the owner's choice to show their hosts as theirs
-- (BOINC's user.show_hosts, on by default as BOINC's without
-- enable_privacy_by_default); host.gz names a host's owner only when on.
--
-- account.disabled_at, host.revoked_at: when an account was disabled or a
-- host revoked, so the export lists them in user_deleted.gz and
-- host_deleted.gz for 60 days, as BOINC keeps user_deleted and host_deleted
-- rows.  Kept by a trigger, created with its function in
-- db/functions/stats.sql; rows disabled or revoked before this migration
-- count from now.
--
-- host.cpid_seed: 32 random hex digits per host, the stand-in for the host
-- CPID a BOINC client reports; the exported host_cpid is
-- md5(cpid_seed || email), as BOINC's scheduler hashes the client's.

ALTER TABLE account ADD COLUMN show_hosts boolean NOT NULL DEFAULT true,
                    ADD COLUMN disabled_at timestamptz;
UPDATE account SET disabled_at = now() WHERE disabled;

ALTER TABLE host ADD COLUMN revoked_at timestamptz,
                 ADD COLUMN cpid_seed text NOT NULL
                     DEFAULT replace(gen_random_uuid()::text, '-', '')
                     CHECK (cpid_seed ~ '^[0-9a-f]{32}$');
UPDATE host SET revoked_at = now() WHERE revoked;
