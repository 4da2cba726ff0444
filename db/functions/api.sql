-- cotrain functions: the v1 API's small helpers and a project's public
-- information (doc/api.md).  Every host-facing function answers (status,
-- body): an HTTP status and the JSON text the server relays as is; errors
-- are api_error() bodies.

-- The JSON error body of the v1 API; hint omitted when NULL.
CREATE OR REPLACE FUNCTION api_error(p_code text, p_message text, p_hint text DEFAULT NULL)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT json_build_object('error',
        json_strip_nulls(json_build_object('code', p_code, 'message', p_message, 'hint', p_hint)))::text
$$;

-- {"url", "sha256", "size"} of a stored file, or NULL.
CREATE OR REPLACE FUNCTION api_file_ref(p_sha256 text) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_build_object('url', '/files/' || f.sha256, 'sha256', f.sha256, 'size', f.size)
              FROM file f WHERE f.sha256 = p_sha256);
END
$$;

-- Public information about a project, as (status, body).
CREATE OR REPLACE FUNCTION api_project_info(p_name text)
RETURNS TABLE (status integer, body text) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v jsonb;
BEGIN
    SELECT jsonb_build_object(
        'name', p.name, 'title', p.title, 'description', p.description,
        'config', p.config,
        'dataset', jsonb_build_object('name', d.name, 'tokenizer', d.tokenizer,
                                      'n_tokens', d.n_tokens,
                                      'heldout_tokens', d.heldout_tokens,
                                      'manifest', api_file_ref(d.manifest_sha256)),
        'seq_len', p.seq_len, 'microbatch_size', p.microbatch_size,
        'target_batch', p.target_batch, 'mb_per_epoch', p.mb_per_epoch, 'seed', p.seed,
        'flops_per_sample', p.flops_per_sample, 'wu_seconds', p.wu_seconds,
        'active', p.active, 'current_version', p.current_version,
        'accumulated_samples', sched_accumulated(p.id, p.current_version, p.microbatch_size),
        'checkpoint', (SELECT api_file_ref(mv.checkpoint_sha256) FROM model_version mv
                        WHERE mv.project_id = p.id AND mv.version = p.current_version),
        'eval_every', heldout_every(p.config),
        'heldout_bpb', (SELECT h.heldout_bpb FROM heldout_latest(p.id) h),
        'heldout_version', (SELECT h.version FROM heldout_latest(p.id) h),
        'heldout_mlm_loss', (SELECT h.heldout_mlm_loss FROM heldout_mlm_latest(p.id) h),
        'heldout_mlm_accuracy', (SELECT h.heldout_mlm_accuracy FROM heldout_mlm_latest(p.id) h),
        'heldout_mlm_version', (SELECT h.version FROM heldout_mlm_latest(p.id) h),
        'created_at', p.created_at)
      INTO v
      FROM project p JOIN dataset d ON d.id = p.dataset_id
     WHERE p.name = p_name;
    IF v IS NULL THEN
        RETURN QUERY SELECT 404, api_error('not_found', format('project "%s" does not exist', p_name));
        RETURN;
    END IF;
    RETURN QUERY SELECT 200, v::text;
END
$$;
