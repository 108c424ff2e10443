-- What a restore leaves behind: a memory that stays hot, and a backup kept on record.
--
-- 1. A restore (or a re-promotion) is a use and a new start. memories.restored_at is when the memory
-- last came back from the archive (NULL: never archived, or archived and never back). The archival
-- criteria count a memory's age and its time since its last use from it when it is later
-- (memory_lib.lifecycle.eligibility), and so does its retention score (memory_lib.lifecycle.retention):
-- the night after a restore does not archive again what the restore brought back. The row's other
-- columns are restored exactly as they were archived; this one is the hot tier's own bookkeeping, set
-- only by the restore's INSERT (memory_lib.lifecycle.promotion.restore_many_rows_plan), never updated.
ALTER TABLE memories ADD COLUMN restored_at timestamptz;

-- 2. A restore keeps the memory's backup object (its pack may hold other members, which stay archived):
-- the restore's audit event ('restored' or 'promoted', details.storage_ref and sha256) is its record.
-- The orphan sweep counts an object such an event names as recorded (memory_lib.archival.integrity),
-- until forget redacts the event together with deleting the object. This index serves the sweep's
-- lookup from object refs (the form backup_objects.ref has) to those events.
CREATE INDEX memory_events_kept_backups ON memory_events (backup_object_ref(details ->> 'storage_ref'))
    WHERE event_type IN ('restored', 'promoted') AND NOT details ? 'redacted';
