-- The retrievability gate's result per night, written by the archive_rows asset and read by the
-- read-only archive_retrievable check; and an index for the per-night lookups of archive rows.
ALTER TABLE archival_batches ADD COLUMN retrievability jsonb;
CREATE INDEX archived_memories_batch_key ON archived_memories ((metadata ->> 'batch_key'));
