-- Consolidation above the per-memory summary: digests and facts.
--
-- Level 1 is each archived memory's own summary (archived_memories.summary). Levels 2+ are digests of
-- a period per user (2 = a month, 3 = a year, one hierarchy: a level-N digest is built from level N-1),
-- facts are subject/predicate/object triples with a validity interval, and key moments are a month's
-- high-importance events. All of it is derived data: it is rebuilt from memories (hot or archived) and
-- never the only copy of anything. Provenance uses memory ids, which stay the same across tiers
-- (memories.id = archived_memories.original_id), so a digest keeps pointing at a memory it covers
-- whether that memory is hot, archived or restored.
CREATE TABLE memory_digests (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id            text NOT NULL CHECK (user_id <> ''),
    level              smallint NOT NULL CHECK (level >= 2),
    period_start       date NOT NULL,
    period_end         date NOT NULL CHECK (period_end > period_start),  -- exclusive
    summary            text NOT NULL CHECK (summary <> ''),
    -- a digest's shape: keyTopics, keyPeople, emotionalHighlights, ...
    body               jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(body) = 'object'),
    -- Few rows per user: full precision costs little and ranks best.
    embedding          vector({{EMBEDDING_DIM}}) NOT NULL,
    embedding_model    text NOT NULL,
    source_memory_ids  uuid[] NOT NULL,
    source_digest_ids  uuid[] NOT NULL DEFAULT '{}',
    -- sha256 over the covered memories' (id, updated_at) and the lower digests' ids: a covered memory
    -- that changes (forget, restore, supersede) changes it, and the digest is rebuilt.
    source_fingerprint text NOT NULL,
    summarizer_kind    text NOT NULL,
    summary_model      text NOT NULL,
    built_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, level, period_start)
);
CREATE INDEX memory_digests_tsv ON memory_digests USING gin (to_tsvector('english', summary));
CREATE INDEX memory_digests_sources ON memory_digests USING gin (source_memory_ids);

CREATE TABLE memory_facts (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id            text NOT NULL CHECK (user_id <> ''),
    kind               text NOT NULL CHECK (kind IN ('person', 'project', 'place', 'preference', 'date', 'other')),
    subject            text NOT NULL CHECK (subject <> ''),
    predicate          text NOT NULL CHECK (predicate <> ''),
    object             text NOT NULL CHECK (object <> ''),
    -- A newer value closes the older one (valid_to set), it does not delete it.
    valid_from         timestamptz NOT NULL,
    valid_to           timestamptz CHECK (valid_to IS NULL OR valid_to >= valid_from),
    source_memory_ids  uuid[] NOT NULL CHECK (cardinality(source_memory_ids) > 0),
    extractor          text NOT NULL,  -- the model, or the offline rule-based extractor by name
    confidence         double precision CHECK (confidence IS NULL OR (confidence >= 0 AND confidence <= 1)),
    embedding          vector({{EMBEDDING_DIM}}) NOT NULL,
    embedding_model    text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- Added by the builders (memory_lib.consolidation.facts): the month (period_start of the memories'
    -- month) the fact was extracted from, so one month's facts are rebuilt alone; and whether the
    -- predicate holds one value at a time (lives in, manager): only those form validity chains.
    source_month       date NOT NULL CHECK (extract(day FROM source_month) = 1),
    single_valued      boolean NOT NULL DEFAULT false
);
CREATE INDEX memory_facts_user_month ON memory_facts (user_id, source_month);
-- A writer that does not know source_month (a hand-made fact, a test) gets the month of valid_from (UTC).
CREATE FUNCTION memory_facts_default_month() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.source_month IS NULL THEN
        NEW.source_month := date_trunc('month', NEW.valid_from AT TIME ZONE 'UTC')::date;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER memory_facts_source_month BEFORE INSERT ON memory_facts
    FOR EACH ROW EXECUTE FUNCTION memory_facts_default_month();
CREATE INDEX memory_facts_subject ON memory_facts (user_id, lower(subject), predicate, valid_from DESC);
CREATE INDEX memory_facts_tsv ON memory_facts
    USING gin (to_tsvector('english', subject || ' ' || predicate || ' ' || object));
CREATE INDEX memory_facts_sources ON memory_facts USING gin (source_memory_ids);

CREATE TABLE key_moments (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id      text NOT NULL CHECK (user_id <> ''),
    month        date NOT NULL CHECK (extract(day FROM month) = 1),
    memory_id    uuid NOT NULL,  -- the source memory, hot or archived
    title        text NOT NULL CHECK (title <> ''),
    importance   double precision NOT NULL CHECK (importance >= 0 AND importance <= 1),
    occurred_at  timestamptz NOT NULL,
    built_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, memory_id)
);
CREATE INDEX key_moments_user_month ON key_moments (user_id, month);

-- What each (user, family, period) was last built from: a build whose sources' fingerprint is unchanged
-- writes nothing (and calls no LLM). Facts and key moments use it; digests keep their own
-- source_fingerprint. Derived bookkeeping: deleting a row only makes the next run rebuild that period.
CREATE TABLE consolidation_builds (
    user_id            text NOT NULL CHECK (user_id <> ''),
    family             text NOT NULL CHECK (family IN ('facts', 'key_moments')),
    period_start       date NOT NULL,
    source_fingerprint text NOT NULL,
    builder            text NOT NULL,
    built_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, family, period_start)
);
