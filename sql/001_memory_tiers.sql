-- Hot memories, archive rows, the append-only audit log and the per-memory archival checkpoints.
-- {{EMBEDDING_DIM}} is filled in from settings when the schema is first created; the value is
-- recorded in memory_archive_settings so a later run with another dimension fails loudly.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE memory_archive_settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE memories (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id          text NOT NULL CHECK (user_id <> ''),
    content          text NOT NULL CHECK (content <> ''),
    content_sha256   text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    embedding        vector({{EMBEDDING_DIM}}) NOT NULL,
    embedding_model  text NOT NULL,
    embedding_dim    integer NOT NULL CHECK (embedding_dim = {{EMBEDDING_DIM}}),
    entity_links     uuid[] NOT NULL DEFAULT '{}',
    metadata         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    domain           text,
    category         text NOT NULL DEFAULT 'episodic'
                     CHECK (category IN ('core', 'episodic', 'semantic', 'procedural')),
    importance_score double precision NOT NULL DEFAULT 0.5
                     CHECK (importance_score >= 0 AND importance_score <= 1),
    access_count     integer NOT NULL DEFAULT 0 CHECK (access_count >= 0),
    last_accessed_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    pinned           boolean NOT NULL DEFAULT false,
    superseded_by    uuid,
    content_tsv      tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED
);

CREATE INDEX memories_embedding_hnsw ON memories
    USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
CREATE INDEX memories_user_created ON memories (user_id, created_at);
CREATE INDEX memories_content_tsv ON memories USING gin (content_tsv);
-- Candidate selection walks lowest importance, oldest first.
CREATE INDEX memories_archival_order ON memories (importance_score, created_at) WHERE NOT pinned;

-- ADR-004 "Archive Record Schema", plus tenancy, backup integrity and summarizer provenance.
-- Summary embeddings are halfvec: half the bytes of the hot tier's vectors, with no measurable loss
-- for ranking summaries; the original's exact float32 embedding lives in the backup object.
CREATE TABLE archived_memories (
    id                        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    original_id               uuid NOT NULL UNIQUE,
    user_id                   text NOT NULL CHECK (user_id <> ''),
    summary                   text NOT NULL CHECK (summary <> ''),
    summary_embedding         halfvec({{EMBEDDING_DIM}}) NOT NULL,
    summary_embedding_model   text NOT NULL,
    key_entities              text[] NOT NULL DEFAULT '{}',
    original_domain           text,
    original_category         text NOT NULL,
    original_embedding_model  text NOT NULL,
    original_updated_at       timestamptz NOT NULL,
    original_superseded_by    uuid,
    importance_score          double precision NOT NULL CHECK (importance_score >= 0 AND importance_score <= 1),
    access_count              integer NOT NULL DEFAULT 0 CHECK (access_count >= 0),
    last_accessed_at          timestamptz,
    expansion_count           integer NOT NULL DEFAULT 0,
    last_expanded_at          timestamptz,
    archived_at               timestamptz NOT NULL,
    original_created_at       timestamptz NOT NULL,
    archive_reason            text NOT NULL,
    storage_ref               text NOT NULL,
    storage_verified          boolean NOT NULL DEFAULT false,
    backup_sha256             text NOT NULL CHECK (backup_sha256 ~ '^[0-9a-f]{64}$'),
    backup_size_bytes         bigint NOT NULL CHECK (backup_size_bytes > 0),
    backup_version_id         text,
    schema_version            integer NOT NULL DEFAULT 1,
    summary_model             text NOT NULL,
    summarizer_kind           text NOT NULL,
    summary_input_tokens      integer NOT NULL DEFAULT 0,
    summary_output_tokens     integer NOT NULL DEFAULT 0,
    summary_cost_usd          numeric(12, 6) NOT NULL DEFAULT 0,
    metadata                  jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    summary_tsv               tsvector GENERATED ALWAYS AS (to_tsvector('english', summary)) STORED
);

CREATE INDEX archived_summary_hnsw ON archived_memories
    USING hnsw (summary_embedding halfvec_cosine_ops) WITH (m = 16, ef_construction = 64);
CREATE INDEX archived_user_created ON archived_memories (user_id, original_created_at);
CREATE INDEX archived_summary_tsv ON archived_memories USING gin (summary_tsv);

-- Append-only audit log: who did what to which memory, and when.
CREATE TABLE memory_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    memory_id   uuid NOT NULL,
    user_id     text NOT NULL,
    event_type  text NOT NULL CHECK (event_type IN
                ('created', 'updated', 'archived', 'restored', 'expanded', 'promoted', 'deleted', 'superseded')),
    actor       text NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX memory_events_memory ON memory_events (memory_id, occurred_at);
CREATE INDEX memory_events_user_type ON memory_events (user_id, event_type, occurred_at);

CREATE FUNCTION memory_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'memory_events is append-only: % is not allowed', TG_OP;
END $$;
CREATE TRIGGER memory_events_no_update BEFORE UPDATE OR DELETE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION memory_events_append_only();
CREATE TRIGGER memory_events_no_truncate BEFORE TRUNCATE ON memory_events
    FOR EACH STATEMENT EXECUTE FUNCTION memory_events_append_only();

-- One archival batch (a night, or an ad-hoc run); claiming is done once per batch.
CREATE TABLE archival_batches (
    batch_key     text PRIMARY KEY,
    as_of         timestamptz NOT NULL,
    criteria      jsonb NOT NULL,
    claimed_count integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Per-memory checkpoint: the last step that completed, and the last error, so a batch resumes
-- where it stopped and the error rate of a batch is a query.
CREATE TABLE archival_attempts (
    batch_key          text NOT NULL REFERENCES archival_batches (batch_key),
    memory_id          uuid NOT NULL,
    user_id            text NOT NULL,
    archive_reason     text NOT NULL,
    status             text NOT NULL DEFAULT 'claimed'
                       CHECK (status IN ('claimed', 'summarized', 'embedded', 'backed_up', 'archived', 'released')),
    failed_step        text,
    error              text,
    attempts           integer NOT NULL DEFAULT 0,
    summary            text,
    summary_model      text,
    summarizer_kind    text,
    key_entities       text[],
    input_tokens       integer,
    output_tokens      integer,
    cost_usd           numeric(12, 6),
    summary_embedding  halfvec({{EMBEDDING_DIM}}),
    summary_embedding_model text,
    backup_key         text,
    backup_ref         text,
    backup_sha256      text,
    backup_size_bytes  bigint,
    backup_version_id  text,
    backup_archived_at timestamptz,
    claimed_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_key, memory_id)
);
-- A memory is in at most one open attempt: two batches or two concurrent runs never share it.
CREATE UNIQUE INDEX archival_attempts_one_open ON archival_attempts (memory_id)
    WHERE status NOT IN ('archived', 'released');
CREATE INDEX archival_attempts_batch_status ON archival_attempts (batch_key, status);
