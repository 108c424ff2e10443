-- The tier audit of a committed night (every memory exactly once in hot or archive, the night's backups
-- present), written by the archive_rows asset and the CLI after their commit, read by the read-only
-- tiers_consistent check: the check reports the audit instead of repeating it (and its HEADs).
ALTER TABLE archival_batches ADD COLUMN tier_audit jsonb;
