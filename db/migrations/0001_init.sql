-- cotrain schema, version 1: accounts, teams, hosts, datasets, the file
-- store's index, projects, model versions, the microbatch pool and work units.
-- Forward-only: never edit a migration after it has landed; add the next one.

CREATE TABLE team (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    description  text NOT NULL DEFAULT '' CHECK (length(description) <= 4000),
    founder_id   bigint,                    -- account that created it
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX team_name_key ON team (lower(name));

CREATE TABLE account (
    id               bigserial PRIMARY KEY,
    email            text NOT NULL CHECK (length(email) BETWEEN 3 AND 254),
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    -- "pbkdf2-sha256$<iterations>$<salt base64>$<hash base64>"
    password_hash    text NOT NULL,
    team_id          bigint REFERENCES team(id) ON DELETE SET NULL,
    -- random, for BOINC's cross-project id (cpid = md5(cross_project_id || email))
    cross_project_id text NOT NULL,
    is_admin         boolean NOT NULL DEFAULT false,
    disabled         boolean NOT NULL DEFAULT false,
    prefs            jsonb NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX account_email_key ON account (lower(email));
-- Account keys: random bearer secrets, one per log-in or client; only their
-- sha256 is stored.  Revocable one by one.
CREATE TABLE account_key (
    id          bigserial PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES account(id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    revoked     boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX account_key_account_idx ON account_key (account_id);

ALTER TABLE team ADD CONSTRAINT team_founder_fk FOREIGN KEY (founder_id) REFERENCES account(id) ON DELETE SET NULL;

CREATE TABLE host (
    id             bigserial PRIMARY KEY,
    account_id     bigint NOT NULL REFERENCES account(id),
    token_hash     bytea NOT NULL UNIQUE,   -- sha256 of the host token
    cpu_model      text NOT NULL DEFAULT '' CHECK (length(cpu_model) <= 256),
    cores          integer NOT NULL DEFAULT 1 CHECK (cores BETWEEN 1 AND 4096),
    memory_bytes   bigint NOT NULL DEFAULT 0 CHECK (memory_bytes >= 0),
    gpu            text NOT NULL DEFAULT '' CHECK (length(gpu) <= 256),
    flops          double precision NOT NULL CHECK (flops > 0),   -- measured, FLOP/s
    client_version text NOT NULL DEFAULT '' CHECK (length(client_version) <= 64),
    os_name        text NOT NULL DEFAULT '' CHECK (length(os_name) <= 64),
    os_version     text NOT NULL DEFAULT '' CHECK (length(os_version) <= 128),
    revoked        boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX host_account_idx ON host (account_id);

-- Index of the content-addressed file store: <data dir>/files/<aa>/<sha256>,
-- where <aa> is the first two hex digits.
CREATE TABLE file (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size        bigint NOT NULL CHECK (size >= 0),
    kind        text NOT NULL CHECK (kind IN ('shard', 'manifest', 'checkpoint')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dataset (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    tokenizer       text NOT NULL DEFAULT 'byte',
    n_tokens        bigint NOT NULL CHECK (n_tokens >= 0),
    manifest_sha256 text NOT NULL REFERENCES file(sha256),
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- A dataset's tokens, in order, split into shards; shard idx holds tokens
-- [first_token, first_token + n_tokens) of the dataset's token stream.
CREATE TABLE shard (
    dataset_id   bigint NOT NULL REFERENCES dataset(id) ON DELETE CASCADE,
    idx          integer NOT NULL CHECK (idx >= 0),
    first_token  bigint NOT NULL CHECK (first_token >= 0),
    n_tokens     bigint NOT NULL CHECK (n_tokens > 0),
    sha256       text NOT NULL REFERENCES file(sha256),
    PRIMARY KEY (dataset_id, idx)
);
CREATE INDEX shard_tokens_idx ON shard (dataset_id, first_token);

CREATE TABLE project (
    id               bigserial PRIMARY KEY,
    name             text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    title            text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    description      text NOT NULL DEFAULT '' CHECK (length(description) <= 10000),
    config           jsonb NOT NULL,          -- the project file, validated
    dataset_id       bigint NOT NULL REFERENCES dataset(id),
    seq_len          integer NOT NULL CHECK (seq_len > 0),
    microbatch_size  integer NOT NULL CHECK (microbatch_size > 0),   -- samples per microbatch
    target_batch     integer NOT NULL CHECK (target_batch > 0),      -- samples per optimizer step
    -- microbatches in one epoch of the dataset; stream microbatch g is
    -- microbatch (g % mb_per_epoch) of epoch (g / mb_per_epoch)
    mb_per_epoch     bigint NOT NULL CHECK (mb_per_epoch > 0),
    seed             bigint NOT NULL DEFAULT 0,
    flops_per_sample double precision NOT NULL CHECK (flops_per_sample > 0),
    wu_seconds       integer NOT NULL DEFAULT 180 CHECK (wu_seconds BETWEEN 1 AND 86400),
    -- first stream microbatch never yet carved into the pool
    frontier         bigint NOT NULL DEFAULT 0 CHECK (frontier >= 0),
    current_version  integer NOT NULL DEFAULT 0 CHECK (current_version >= 0),
    active           boolean NOT NULL DEFAULT true,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE model_version (
    project_id        bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    version           integer NOT NULL CHECK (version >= 0),
    checkpoint_sha256 text REFERENCES file(sha256),
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, version)
);

-- Free microbatch ranges [lo, hi) of the stream: returned remainders, and
-- chunks carved off the frontier.  A microbatch is in at most one row here or
-- in one live work unit, never both.
CREATE TABLE mb_pool (
    id          bigserial PRIMARY KEY,
    project_id  bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    lo          bigint NOT NULL CHECK (lo >= 0),
    hi          bigint NOT NULL,
    CHECK (lo < hi)
);
CREATE INDEX mb_pool_project_idx ON mb_pool (project_id, lo);

-- One row per range handed out.  mb_done counts microbatches finished from
-- lo onwards (the client works through its range in order).
CREATE TABLE work_unit (
    id              bigserial PRIMARY KEY,
    project_id      bigint NOT NULL REFERENCES project(id) ON DELETE CASCADE,
    host_id         bigint NOT NULL REFERENCES host(id),
    version         integer NOT NULL,
    lo              bigint NOT NULL CHECK (lo >= 0),
    hi              bigint NOT NULL,
    mb_done         bigint NOT NULL DEFAULT 0,
    samples_per_sec real NOT NULL DEFAULT 0,
    state           text NOT NULL DEFAULT 'live'
                    CHECK (state IN ('live', 'done', 'returned', 'expired')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    deadline        timestamptz NOT NULL,
    last_heartbeat  timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK (lo < hi),
    CHECK (mb_done BETWEEN 0 AND hi - lo)
);
CREATE INDEX work_unit_live_deadline_idx ON work_unit (deadline) WHERE state = 'live';
CREATE INDEX work_unit_host_idx ON work_unit (host_id) WHERE state = 'live';
CREATE INDEX work_unit_version_idx ON work_unit (project_id, version);
