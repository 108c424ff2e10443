-- The write path and its lifecycle: TTL per memory, the archive reasons as a checked vocabulary, and
-- the indexes of the memory filters.
--
-- ttl_days: NULL = no TTL; 0 = a pinned canonical fact (the write path pins it); N > 0 = the memory
-- expires N days after its last write. expires_at is that instant (NULL when pinned or without TTL):
-- the nightly Slow Path archives an expired memory with reason 'ttl_expired', it is never dropped.
-- Chunks of one long text carry their parent in metadata.chunk (memory_lib.write.chunking), so the backup
-- object keeps it and a restored chunk is still one of its parent's.
ALTER TABLE memories
    ADD COLUMN ttl_days integer CHECK (ttl_days >= 0),
    ADD COLUMN expires_at timestamptz,
    ADD CONSTRAINT memories_expiry_needs_ttl CHECK (expires_at IS NULL OR ttl_days > 0);

-- Expired memories are found without a scan (memory_lib.lifecycle.eligibility).
CREATE INDEX memories_expires ON memories (expires_at) WHERE expires_at IS NOT NULL;

-- The filters' index: btree (user_id, type, ts_seen desc). `type` is category; ts_seen, the last time a memory
-- was written or read, is coalesce(last_accessed_at, created_at): an expression, so adding the index
-- does not rewrite the table (and its HNSW index).
CREATE INDEX memories_user_type_seen ON memories (user_id, category, (coalesce(last_accessed_at, created_at)) DESC);

-- A parent's chunks, found together (duplicates of a long text, search collapsing chunks to parents).
CREATE INDEX memories_chunk_parent ON memories (((metadata -> 'chunk' ->> 'parent_id')))
    WHERE metadata ? 'chunk';

-- The archive reasons, once (memory_lib.core.statuses.ArchiveReason;
-- tests/archival/test_liveness.py compares).
ALTER TABLE archival_attempts ADD CONSTRAINT archival_attempts_reason CHECK (archive_reason IN
    ('stale_low_importance', 'force_age', 'superseded', 'retention_floor', 'ttl_expired'));
ALTER TABLE archived_memories ADD CONSTRAINT archived_memories_reason CHECK (archive_reason IN
    ('stale_low_importance', 'force_age', 'superseded', 'retention_floor', 'ttl_expired'));

-- Archive rows keep their memory's tags (002) and now its chunk (parent id, index, count), so archived
-- search returns a parent once too.
CREATE OR REPLACE FUNCTION archived_memories_keep_tags() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    original_meta jsonb;
BEGIN
    IF NOT (NEW.metadata ? 'tags' AND NEW.metadata ? 'chunk') THEN
        SELECT m.metadata INTO original_meta
        FROM memories m WHERE m.id = NEW.original_id AND m.user_id = NEW.user_id;
        IF NOT NEW.metadata ? 'tags' AND jsonb_typeof(original_meta -> 'tags') = 'array' THEN
            NEW.metadata := NEW.metadata || jsonb_build_object('tags', original_meta -> 'tags');
        END IF;
        IF NOT NEW.metadata ? 'chunk' AND jsonb_typeof(original_meta -> 'chunk') = 'object' THEN
            NEW.metadata := NEW.metadata || jsonb_build_object('chunk', original_meta -> 'chunk');
        END IF;
    END IF;
    RETURN NEW;
END $$;
