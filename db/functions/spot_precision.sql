-- The least tolerance a spot check of p_project can have, set by the
-- precision its GPU hosts compute in (the project file's "precision",
-- doc/project-file.md): a host's gradient on a GPU and a checker's on a CPU
-- differ by the products' rounding, not by any fault.  Measured on an H200
-- (tests/test_gpu_kernels.c, tests/bench/gpu-runs/): bf16 gradients against the
-- CPU's have a cosine of 0.99998 (relative L2 difference about 6e-3), fp32
-- ones agree to 2e-6; the floors leave five times that margin.  A project
-- without the key (created before it existed) computes in bf16.
CREATE OR REPLACE FUNCTION spot_precision_floor(p_project bigint) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE coalesce((SELECT config->>'precision' FROM project WHERE id = p_project), 'bf16')
               WHEN 'fp32' THEN 0.0
               WHEN 'tf32' THEN 1e-2
               ELSE 3e-2
           END
$$;
