-- cotrain schema, version 18: one host per machine and account (BOINC's
-- host identity), and host merging.
--
-- host.machine_id: what the client says identifies its machine for this
-- project, the hex sha256 of a random secret kept in its state folder and the
-- project's base URL and name (doc/client.md, "Machine identity"); NULL for hosts
-- registered before, or by clients that send none.  A registration with the
-- machine id of a live (not revoked) host of the same account gets that host
-- back with a new token (db/functions/hosts.sql, host_register), so detaching
-- and attaching again keeps the host, its credit and its pending checks.
-- host.merged_into: set on a host that `cotrain-admin host merge` folded into
-- another (host_merge); such a host is also revoked.
ALTER TABLE host ADD COLUMN machine_id text CHECK (machine_id ~ '^[0-9a-f]{64}$'),
                 ADD COLUMN merged_into bigint REFERENCES host(id);
CREATE UNIQUE INDEX host_machine_idx ON host (account_id, machine_id)
    WHERE machine_id IS NOT NULL AND NOT revoked;
