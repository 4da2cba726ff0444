-- cotrain schema, version 19: held-out evaluation of encoders (doc/design.md,
-- "Held-out evaluation").
--
-- model_version.heldout_mlm_loss, heldout_mlm_accuracy: an ALBERT or BERT
-- version's masked-LM cross-entropy (nats, mean over the predicted
-- positions) and the fraction of them whose arg-max is the original token,
-- on its project's held-out sample masked from a fixed evaluation seed
-- (server/heldout_eval.h); heldout_tokens then counts the predicted
-- positions.  NULL for a GPT, whose figure stays heldout_bpb, and until
-- evaluated.

ALTER TABLE model_version ADD COLUMN heldout_mlm_loss double precision,
    ADD COLUMN heldout_mlm_accuracy double precision,
    ADD CONSTRAINT model_version_heldout_mlm_check
        CHECK (heldout_mlm_accuracy IS NULL OR heldout_mlm_accuracy BETWEEN 0 AND 1);
