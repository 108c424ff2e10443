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

-- A memory restored or re-promoted before this migration is hot since its last such event: a rollback
-- under way (restored, archival paused) stays rolled back when the pause is cleared. Its retention row
-- is computed again (the triggers watch the inputs they know, and this is a new one).
UPDATE memories m SET restored_at = e.at
  FROM (SELECT user_id, memory_id, max(occurred_at) AS at FROM memory_events
         WHERE event_type IN ('restored', 'promoted') GROUP BY user_id, memory_id) e
 WHERE m.user_id = e.user_id AND m.id = e.memory_id;
UPDATE memory_retention r SET pending = true, marks = r.marks + 1
  FROM memories m
 WHERE m.user_id = r.user_id AND m.id = r.memory_id AND m.restored_at IS NOT NULL;

-- 2. A restore keeps the memory's backup object (its pack may hold other members, which stay archived):
-- the restore's audit event ('restored' or 'promoted', details.storage_ref and sha256) is its record.
-- The orphan sweep counts an object such an event names as recorded (memory_lib.archival.integrity),
-- until forget redacts the event together with deleting the object. This index serves the sweep's
-- lookup from object refs (the form backup_objects.ref has) to those events.
CREATE INDEX memory_events_kept_backups ON memory_events (backup_object_ref(details ->> 'storage_ref'))
    WHERE event_type IN ('restored', 'promoted') AND NOT details ? 'redacted';
