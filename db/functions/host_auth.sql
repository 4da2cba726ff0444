-- cotrain functions: a host, authenticated by its token.
--
-- Every host-facing call (scheduler, rounds, spot checks, the NAT broker's
-- and the certificate route's statements in server/) names its host by the
-- sha256 of the host token it sent; this is the one place that says which
-- tokens are good.

-- The id of the host whose token hashes to p_token_hash, or NULL when there
-- is none, the host is revoked or its account is disabled.  PL/pgSQL, not
-- LANGUAGE sql: it is on every hot path, and a SQL function that cannot be
-- inlined is planned again on every call.
CREATE OR REPLACE FUNCTION host_auth(p_token_hash bytea) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT h.id FROM host h JOIN account a ON a.id = h.account_id
             WHERE h.token_hash = p_token_hash AND NOT h.revoked AND NOT a.disabled);
END
$$;
