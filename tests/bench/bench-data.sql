-- cotrain benchmarks: 100,000 users (and as many hosts), 1,000 teams and
-- 1,000,000 ledger rows with their totals, on a freshly migrated database.
-- Used by tests/bench/bench-leaderboard.sh and tests/bench/bench-export.sh.
INSERT INTO file (sha256, size, kind) VALUES (repeat('a', 64), 1, 'manifest'), (repeat('b', 64), 1, 'checkpoint');
INSERT INTO dataset (name, n_tokens, manifest_sha256) VALUES ('bench', 1000000, repeat('a', 64));
INSERT INTO project (name, title, config, dataset_id, seq_len, microbatch_size, target_batch, mb_per_epoch, flops_per_sample)
VALUES ('bench', 'Bench', '{}', 1, 256, 8, 4096, 100000, 1e12);
INSERT INTO team (name) SELECT 'team ' || i FROM generate_series(1, 1000) i;
INSERT INTO account (email, name, password_hash, cross_project_id, team_id)
SELECT 'user' || i || '@example.org', 'user ' || i, 'x', md5(i::text), 1 + i % 1000
  FROM generate_series(1, 100000) i;
INSERT INTO host (account_id, token_hash, flops, cpu_model)
SELECT i, sha256(i::text::bytea), 1e10, 'CPU ' || (i % 17) FROM generate_series(1, 100000) i;
-- 1,000,000 grants: 10 rounds x 100,000 hosts, skewed samples.
INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, team_id, samples, flops,
                          credit, status, created_at, granted_at)
SELECT 'round', 1, v, h, h, 1 + h % 1000, s, s * 1e12, s * 1e12 / 4.32e11, 'granted',
       now() - make_interval(days => 10 - v), now() - make_interval(days => 10 - v)
  FROM generate_series(0, 9) v, generate_series(1, 100000) h,
       LATERAL (SELECT (1 + (h * 7919 + v * 104729) % 5000)::bigint AS s) x;
INSERT INTO host_credit (host_id, total, rac, rac_time, rac_key)
SELECT host_id, sum(credit), sum(credit) / 10, now(), credit_rac_key(sum(credit) / 10, now())
  FROM credit_grant GROUP BY host_id;
INSERT INTO account_credit (account_id, total, rac, rac_time, rac_key)
SELECT account_id, sum(credit), sum(credit) / 10, now() - make_interval(secs => account_id % 86400),
       credit_rac_key(sum(credit) / 10, now() - make_interval(secs => account_id % 86400))
  FROM credit_grant GROUP BY account_id;
INSERT INTO team_credit (team_id, total, rac, rac_time, rac_key)
SELECT team_id, sum(credit), sum(credit) / 10, now(), credit_rac_key(sum(credit) / 10, now())
  FROM credit_grant GROUP BY team_id;
VACUUM ANALYZE;
