-- Changing the embedder (model and/or dimension): dual-write, backfill, flip.
--
-- One row per re-embedding migration. The second vector columns themselves (embedding_next, ...) are
-- added when a re-embedding starts (memory_lib.lifecycle), not here: their dimension is the
-- target's, known only then.
-- State machine: running (writes fill the active and the *_next columns; the backfill fills *_next)
-- -> flipped (the target is active; the old vectors live on in *_prev and are still kept up to date, so
-- a flip back loses nothing) -> running again (flip back) ... -> finished (drop_old dropped *_prev)
-- or aborted (abort dropped *_next while running).
CREATE TABLE embedding_migrations (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_model  text NOT NULL CHECK (source_model <> ''),
    source_dim    integer NOT NULL CHECK (source_dim > 0),
    target_model  text NOT NULL CHECK (target_model <> ''),
    target_dim    integer NOT NULL CHECK (target_dim > 0),
    state         text NOT NULL DEFAULT 'running'
                  CHECK (state IN ('running', 'flipped', 'finished', 'aborted')),
    started_at    timestamptz NOT NULL DEFAULT now(),
    started_by    text NOT NULL,
    flipped_at    timestamptz,  -- the last flip (or flip back)
    flipped_by    text,
    flips         integer NOT NULL DEFAULT 0,  -- flips and flips back, counted
    finished_at   timestamptz,
    finished_by   text,
    CHECK (target_model <> source_model OR target_dim <> source_dim)
);
-- At most one migration is open: two sets of second columns would not know which one a write fills.
CREATE UNIQUE INDEX embedding_migrations_one_open ON embedding_migrations ((true))
    WHERE state IN ('running', 'flipped');
