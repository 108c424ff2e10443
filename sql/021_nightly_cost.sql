-- A night's cost grows with the night's work, not with the table.
--
-- 1. The claim takes the night's batch in its order (superseded and expiring memories first, then by
-- importance and age: memory_lib.lifecycle.eligibility.ORDER_SQL) from an index, and stops at the
-- batch size instead of sorting every hot memory.
CREATE INDEX memories_claim_order ON memories
    ((superseded_by IS NULL AND expires_at IS NULL), importance_score, created_at, id) WHERE NOT pinned;

-- 2. Retention scores kept incrementally (memory_lib.lifecycle.retention).
--
-- A row keeps the inputs of its memory's score (category, last touch, accesses, creation) and what
-- follows from them under the retention settings: the decay's half-life, the floor, the instant the
-- score reaches its floor (floor_at) and the first night of the streak at the floor (floor_since,
-- possibly a future night). The score as of any night is computed from these when read. Triggers on
-- memories mark a row `pending` when its inputs change (a write, an access, a new category); the
-- nightly step computes the pending rows only. A change of the settings marks every row pending.
ALTER TABLE memories ADD CONSTRAINT memories_user_id_id_key UNIQUE (user_id, id);

CREATE TABLE memory_retention_v2 (
    user_id         text NOT NULL,
    memory_id       uuid NOT NULL,
    -- The inputs changed since the row was last computed (or it was never computed).
    pending         boolean NOT NULL DEFAULT true,
    -- Bumped by every mark: a night computing from inputs read before a concurrent mark leaves the row
    -- pending (it compares the count it read with the row's when it writes).
    marks           integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL,       -- the memory's; a night before it does not score it
    category        text,
    last_touched_at timestamptz,                -- coalesce(last_accessed_at, created_at) when computed
    access_count    integer,
    half_life_days  double precision,           -- half_life_c * (1 + retrieval_boost * ln(1 + accesses)); NULL: no decay
    floor           double precision CHECK (floor >= 0 AND floor < 1),
    floor_at        timestamptz,                -- score <= floor + floor_tolerance from here on; NULL: never
    -- The night (its end) from which these inputs were observed: a streak never starts before it.
    scored_as_of    timestamptz,
    -- The end of the first night at the floor: greatest(scored_as_of, the night end at or after floor_at).
    floor_since     timestamptz,
    CONSTRAINT memory_retention_v2_pkey PRIMARY KEY (user_id, memory_id),
    CONSTRAINT memory_retention_v2_memory_fkey FOREIGN KEY (user_id, memory_id)
        REFERENCES memories (user_id, id) ON DELETE CASCADE,
    CHECK (pending OR (category IS NOT NULL AND last_touched_at IS NOT NULL AND access_count IS NOT NULL
                       AND floor IS NOT NULL AND scored_as_of IS NOT NULL))
);

-- Every hot memory gets a pending row. Where the old row still holds the memory's current inputs, its
-- observation night carries over (the start of a streak at the floor, else the night last scored), so
-- streaks survive the upgrade; the next night computes the rest.
INSERT INTO memory_retention_v2 (user_id, memory_id, created_at, category, last_touched_at, access_count, scored_as_of)
SELECT m.user_id, m.id, m.created_at, m.category, o.last_touched_at, o.access_count,
       coalesce(o.floor_since, o.scored_as_of)
FROM memories m
LEFT JOIN memory_retention o
       ON o.memory_id = m.id AND o.last_touched_at = coalesce(m.last_accessed_at, m.created_at)
      AND o.access_count = m.access_count;

DROP TABLE memory_retention;
ALTER TABLE memory_retention_v2 RENAME TO memory_retention;
ALTER TABLE memory_retention RENAME CONSTRAINT memory_retention_v2_pkey TO memory_retention_pkey;
ALTER TABLE memory_retention RENAME CONSTRAINT memory_retention_v2_memory_fkey TO memory_retention_memory_fkey;
-- The night's work: pending rows of memories created by the end of the night, by user.
CREATE INDEX memory_retention_pending ON memory_retention (user_id, created_at) WHERE pending;
-- Retention archival: streaks that began early enough.
CREATE INDEX memory_retention_floor_since ON memory_retention (floor_since) WHERE floor_since IS NOT NULL;

-- Statement-level triggers with transition tables: a bulk insert (COPY) costs one statement here.
CREATE FUNCTION memory_retention_track_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_retention (user_id, memory_id, created_at)
    SELECT n.user_id, n.id, n.created_at FROM memory_retention_new_rows n
    ON CONFLICT (user_id, memory_id) DO UPDATE
        SET pending = true, marks = memory_retention.marks + 1, created_at = EXCLUDED.created_at;
    RETURN NULL;
END $$;
CREATE TRIGGER memory_retention_track_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS memory_retention_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_retention_track_insert();

-- Only a change of the score's inputs marks the row; other updates (content, tags, supersession) do not.
CREATE FUNCTION memory_retention_track_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memory_retention r SET pending = true, marks = r.marks + 1, created_at = n.created_at
    FROM memory_retention_new_rows n JOIN memory_retention_old_rows o ON o.id = n.id AND o.user_id = n.user_id
    WHERE r.user_id = n.user_id AND r.memory_id = n.id
      AND (n.last_accessed_at, n.access_count, n.category, n.created_at)
          IS DISTINCT FROM (o.last_accessed_at, o.access_count, o.category, o.created_at);
    RETURN NULL;
END $$;
CREATE TRIGGER memory_retention_track_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS memory_retention_old_rows NEW TABLE AS memory_retention_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_retention_track_update();
