-- cotrain schema, version 31: the rest of what the NAT service's plans need
-- kept in the host row, so that a restarted server plans a host's meetings
-- from its row until its next registration (doc/nat.md, "What the server
-- keeps").  Before, a restarted server knew no host's class for up to the
-- clients' 5 minutes between registrations, and relayed every pair.
--
-- Written by server/reachability.c with nat_class: the port the host says
-- it can be dialed on (its "direct" endpoint with nat_public_addr), and its
-- own address and listening port (its "lan" endpoint).
ALTER TABLE host
    ADD COLUMN nat_advertised_port integer CHECK (nat_advertised_port BETWEEN 0 AND 65535),
    ADD COLUMN nat_local_addr text CHECK (length(nat_local_addr) <= 64),
    ADD COLUMN nat_local_port integer CHECK (nat_local_port BETWEEN 0 AND 65535);
