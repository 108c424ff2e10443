-- Retrieval and the write path: a dedupe key for upserts, tag indexes for filters, archive rows that
-- keep their memory's tags, and an index for counting expansions (the re-promotion rule).

-- sha256 of (user_id, normalized text), set by the write path (memory_lib.write). NULL for rows
-- written by other paths (bulk loads, restores): the write path also matches those by content_sha256.
ALTER TABLE memories ADD COLUMN dedupe_key text CHECK (dedupe_key ~ '^[0-9a-f]{64}$');
-- Carried through archival so a restored memory is deduplicated exactly as before.
ALTER TABLE archived_memories ADD COLUMN original_dedupe_key text;
-- One live memory per text and user. A superseded memory keeps its key as history.
CREATE UNIQUE INDEX memories_dedupe_live ON memories (user_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND superseded_by IS NULL;

-- Tags are metadata->'tags', a JSON array of strings; filters use containment (@>).
CREATE INDEX memories_tags ON memories USING gin ((metadata -> 'tags') jsonb_path_ops);
CREATE INDEX archived_tags ON archived_memories USING gin ((metadata -> 'tags') jsonb_path_ops);

-- An archive row's metadata holds batch provenance, not the memory's; copy the tags over when the
-- row is inserted (the original is still in `memories` then) so archived search can filter and
-- score by tag. Restores bring the tags back from the backup object, which keeps all metadata.
CREATE FUNCTION archived_memories_keep_tags() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    original_tags jsonb;
BEGIN
    IF NOT NEW.metadata ? 'tags' THEN
        SELECT m.metadata -> 'tags' INTO original_tags
        FROM memories m WHERE m.id = NEW.original_id AND m.user_id = NEW.user_id;
        IF jsonb_typeof(original_tags) = 'array' THEN
            NEW.metadata := NEW.metadata || jsonb_build_object('tags', original_tags);
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER archived_memories_keep_tags BEFORE INSERT ON archived_memories
    FOR EACH ROW EXECUTE FUNCTION archived_memories_keep_tags();

-- The nightly promotion sweep counts recent 'expanded' events across users.
CREATE INDEX memory_events_expanded ON memory_events (occurred_at) WHERE event_type = 'expanded';
