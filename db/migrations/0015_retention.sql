-- cotrain schema, version 15: file store retention (doc/design.md, "Retention
-- and backup").
--
-- model_version.pinned: a version whose checkpoint the file store's garbage
-- collector never removes, whatever the retention policy (set by
-- `cotrain-admin model pin` and `model export --pin`).

ALTER TABLE model_version ADD COLUMN pinned boolean NOT NULL DEFAULT false;

-- The collector looks up what still needs a version's checkpoint: live work
-- units and open spot checks of that version.
CREATE INDEX work_unit_live_version_idx ON work_unit (project_id, version) WHERE state = 'live';
CREATE INDEX spot_check_open_version_idx ON spot_check (project_id, version) WHERE state = 'open';
