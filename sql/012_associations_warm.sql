-- Reactivation through associations, and the warm tier in time.

-- Hot memories that link to a memory id (entity_links @> ARRAY[id]): which hot memories point at an
-- archived one, found without a scan (memory_lib.retrieval.associations).
CREATE INDEX memories_entity_links ON memories USING gin (entity_links);

-- A use (record_access) of an archived memory that a live hot memory of the same user links to. The
-- re-promotion rule (memory_lib.lifecycle.promotion) counts these with the 'expanded' events in its window.
-- Rows go with their archive row: a memory promoted, then archived again, starts from zero.
CREATE TABLE archive_link_uses (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    archive_id  uuid NOT NULL REFERENCES archived_memories (id) ON DELETE CASCADE,
    user_id     text NOT NULL,
    original_id uuid NOT NULL,
    linked_from uuid NOT NULL,  -- the hot memory whose entity_links name original_id, at the use
    used_at     timestamptz NOT NULL
);
CREATE INDEX archive_link_uses_archive ON archive_link_uses (archive_id, used_at);
CREATE INDEX archive_link_uses_used_at ON archive_link_uses (used_at);

-- Month-scoped phase 2 reads archive rows through an index on (user_id, original_created_at): 001's, which
-- migration 014 replaces by (user_id, original_created_at, original_id) for keyset pages. A time-scoped
-- search is a range scan of that index (memory_lib.retrieval.warm), no new index.
