-- Stubs, the third tier. An archive row not expanded for stub_after_days keeps its
-- summary (so its full-text entry, the GIN index on to_tsvector(summary), stays) but drops its summary
-- vector: summary_bits NULL is not in the HNSW index, so vector search never returns it. Nothing is
-- lost: the original is still in object storage, and expanding the stub re-embeds the summary
-- (memory_lib.lifecycle.stubs). stubbed_at is the end of the night it became a stub; NULL for a
-- searchable row.
ALTER TABLE archived_memories ADD COLUMN stubbed_at timestamptz,
                              ALTER COLUMN summary_bits DROP NOT NULL,
                              ADD CONSTRAINT archived_stub_without_vector
                                  CHECK ((stubbed_at IS NULL) = (summary_bits IS NOT NULL));
-- The nightly backup check reads every stub of a shard; tier counts count them.
CREATE INDEX archived_stubs ON archived_memories (user_id, stubbed_at) WHERE stubbed_at IS NOT NULL;
-- Becoming a stub and getting the vector back are tier changes: audited like the others.
ALTER TABLE memory_events DROP CONSTRAINT memory_events_event_type_check,
    ADD CONSTRAINT memory_events_event_type_check CHECK (event_type IN
        ('created', 'updated', 'archived', 'restored', 'expanded', 'promoted', 'deleted', 'superseded',
         'stubbed', 'unstubbed'));
