-- Backup objects: an archive row names its backup object by a number, not by its whole ref.
--
-- A night's memories of one user share one backup object (a pack), so every archive row used to repeat
-- the pack's full ref (scheme, bucket or root, prefix, owner tag, batch key, the pack's 64-hex content
-- hash): 150-220 bytes a row, the largest column of the table. The ref now lives once per object in
-- backup_objects; the row keeps the object's id and, for a pack member, the member's offset (its size is
-- backup_size_bytes). An archive row's storage_ref is composed from them, in the form the object store
-- reads: "<object ref>" for a whole object, "<object ref>#bytes=<first>-<last>" for a pack member.
--
-- The ref's form is parsed and composed by the three functions below, the SQL side of
-- memory_lib/storage/objectstore.py (member_ref, locate); readers compose it with
-- memory_lib.storage.packs.ref_sql. They are pure: Citus can run them on every worker.
--
-- backup_objects is per user (a pack holds one user's memories): its keys include user_id, so it can be
-- partitioned or distributed by user_id next to archived_memories. A row no archive row points at any
-- more (its members were restored or forgotten) is harmless; forget deletes a user's.

CREATE FUNCTION backup_object_ref(ref text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN split_part(ref, '#', 1);

CREATE FUNCTION backup_member_offset(ref text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN substring(ref FROM '#bytes=([0-9]+)-[0-9]+$')::bigint;

CREATE FUNCTION backup_ref(object_ref text, member_offset bigint, size bigint) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN object_ref || coalesce('#bytes=' || member_offset || '-' || (member_offset + size - 1), '');

CREATE TABLE backup_objects (
    id       bigint GENERATED ALWAYS AS IDENTITY,
    user_id  text NOT NULL CHECK (user_id <> ''),
    ref      text NOT NULL CHECK (ref <> '' AND position('#' IN ref) = 0),
    PRIMARY KEY (id, user_id),
    UNIQUE (ref, user_id)
);

ALTER TABLE archived_memories ADD COLUMN backup_object bigint, ADD COLUMN backup_offset bigint
    CHECK (backup_offset >= 0);

INSERT INTO backup_objects (user_id, ref)
SELECT DISTINCT user_id, backup_object_ref(storage_ref) FROM archived_memories;

UPDATE archived_memories a
   SET backup_object = o.id, backup_offset = backup_member_offset(a.storage_ref)
  FROM backup_objects o
 WHERE o.user_id = a.user_id AND o.ref = backup_object_ref(a.storage_ref);

-- Nothing is dropped unless every row's ref composes back to exactly what it was (a member's range
-- always spans backup_size_bytes: the archiver writes it so).
DO $$
DECLARE bad text;
BEGIN
    SELECT a.storage_ref INTO bad FROM archived_memories a JOIN backup_objects o
        ON o.id = a.backup_object AND o.user_id = a.user_id
     WHERE backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) IS DISTINCT FROM a.storage_ref
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'archived_memories.storage_ref % does not compose back from its object and range', bad;
    END IF;
END $$;

ALTER TABLE archived_memories ALTER COLUMN backup_object SET NOT NULL,
    DROP COLUMN storage_ref,
    ADD CONSTRAINT archived_memories_backup_object_fkey
        FOREIGN KEY (backup_object, user_id) REFERENCES backup_objects (id, user_id);
