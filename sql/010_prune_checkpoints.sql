-- Checkpoint rows of archived memories are deleted once their night's commit passed its tier audit
-- (memory_lib.archival.integrity.audit_batch): the archive row, its 'archived' audit event and the
-- backup object hold what they recorded, and each kept 0.7 KB of Postgres per archived memory. The
-- batch keeps how many it archived, so batch_status and the night's totals still count them.
ALTER TABLE archival_batches ADD COLUMN archived_pruned integer NOT NULL DEFAULT 0;
