-- The row version (xmin) of the hot row each backup was serialized from. While the live row still
-- has that xmin it has not changed since, so the backup's recorded sha256 still describes it and the
-- fidelity check and commit need not serialize the row again; a different xmin (any UPDATE, or a
-- dump and restore) falls back to serializing and comparing the sha256, as before.
ALTER TABLE archival_attempts ADD COLUMN backup_row_xmin bigint;
