-- The retention score of each hot memory (memory_lib.lifecycle.retention) and the superseded rule.
-- One row per hot memory, written by the nightly retention_scores asset; it goes with its memory
-- (ON DELETE CASCADE: archiving deletes the original, and a promoted memory starts a fresh row).
-- A row reflects the latest night scored: an older night re-run later does not overwrite it.
CREATE TABLE memory_retention (
    memory_id       uuid PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    user_id         text NOT NULL,
    score           double precision NOT NULL CHECK (score >= 0 AND score <= 1),
    floor           double precision NOT NULL CHECK (floor >= 0 AND floor < 1),
    at_floor        boolean NOT NULL,
    -- End of the first night of the current streak at the floor; NULL when above it. An access after
    -- it (last_touched_at > floor_since) restarts the streak.
    floor_since     timestamptz CHECK (at_floor = (floor_since IS NOT NULL)),
    last_touched_at timestamptz NOT NULL,  -- coalesce(last_accessed_at, created_at) when scored
    access_count    integer NOT NULL,
    scored_as_of    timestamptz NOT NULL,
    -- Nights at the floor, this one included (rounded: a 23 h or 25 h night across DST counts as one).
    days_at_floor   integer GENERATED ALWAYS AS (
        CASE WHEN floor_since IS NULL THEN 0
             ELSE round(extract(epoch FROM scored_as_of - floor_since) / 86400)::integer + 1 END) STORED
);
CREATE INDEX memory_retention_user ON memory_retention (user_id);
CREATE INDEX memory_retention_scored ON memory_retention (scored_as_of);

-- Superseded memories are archived the next night whatever their age: find them without a scan.
CREATE INDEX memories_superseded ON memories (updated_at) WHERE superseded_by IS NOT NULL;
