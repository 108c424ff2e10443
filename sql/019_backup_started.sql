-- When a batch's backup step first started. A backup step that finds it already set follows a run
-- that may have died between a pack's PUT and its checkpoint: it looks for such packs in the folders
-- of the batch's users and deletes them (memory_lib.archival.integrity.purge_unrecorded_packs). A first run
-- lists nothing.
ALTER TABLE archival_batches ADD COLUMN backup_started_at timestamptz;
