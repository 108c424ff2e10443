-- An archive row keeps its backup's sha256 as its 32 bytes (bytea), not as 64 hex characters: 32 bytes a
-- row less. Readers take it as hex, the form the object store, the backup format and the checkpoints use:
-- `encode(backup_digest, 'hex') AS backup_sha256` (memory_lib.storage.packs.backup_sql).
--
-- A type change in place (one rewrite of the table, no dead rows left behind); the old CHECK allowed
-- only 64 lowercase hex digits, so every value decodes.

ALTER TABLE archived_memories DROP CONSTRAINT archived_memories_backup_sha256_check;
ALTER TABLE archived_memories ALTER COLUMN backup_sha256 TYPE bytea USING decode(backup_sha256, 'hex');
ALTER TABLE archived_memories RENAME COLUMN backup_sha256 TO backup_digest;
ALTER TABLE archived_memories ADD CONSTRAINT archived_memories_backup_digest_check
    CHECK (octet_length(backup_digest) = 32);
