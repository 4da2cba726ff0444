-- cotrain schema, version 13: the NAT ladder learns from what connected
-- before (doc/nat.md, "Plans from history").
--
-- round_link.rung may be 'lan': two hosts the NAT service sees at one public
-- address dial each other's local endpoint.  round_link.plan: the rung the
-- NAT service planned for the connection, as the dialer reports it (NULL:
-- not reported, as for every link stored before this migration).  A link
-- whose plan was 'punch' and whose rung is not is a failed punch; the
-- service plans the next meetings of the pair, and of a host whose punches
-- fail with everyone, from these (nat_meet_history in functions/nat.sql).

ALTER TABLE round_link DROP CONSTRAINT round_link_rung_check,
    ADD CONSTRAINT round_link_rung_check CHECK (rung IN ('lan', 'direct', 'punch', 'relay')),
    ADD COLUMN plan text CHECK (plan IN ('lan', 'direct', 'punch', 'relay'));

-- The pair's links in both directions, newest first.
CREATE INDEX round_link_pair_idx ON round_link (host_id, peer_id, reported_at DESC);
