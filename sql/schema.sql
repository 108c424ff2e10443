-- The schema the migrations in this folder make, generated for reading: the numbered migrations
-- are the truth, and tests/storage/test_schema_dump.py keeps this file equal to them.
-- Regenerate with `make schema` (python -m memory_lib.storage.schema_dump); never edit it by hand.
-- A database migrated from nothing on PostgreSQL 18.6 (embedded), dumped by pg_dump 18.6
-- --schema-only and normalized; embedding dim 1536, the default (vector columns follow the
-- dim a database was created with); tables not partitioned by user (storage.partitioning).
-- pg_dump of another PostgreSQL major prints the same schema differently.

CREATE EXTENSION IF NOT EXISTS btree_gin WITH SCHEMA public;

CREATE EXTENSION IF NOT EXISTS vector WITH SCHEMA public;

CREATE FUNCTION public.archive_document(summary text, fingerprint tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (to_tsvector('english'::regconfig, summary) || COALESCE(fingerprint, ''::tsvector));

CREATE FUNCTION public.archive_fingerprint(summary text, original tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN NULLIF(ts_delete(strip(original), tsvector_to_array(to_tsvector('english'::regconfig, summary))), ''::tsvector);

CREATE FUNCTION public.archived_memories_keep_tags() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.archived_memories_lexemes() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.lexemes IS NULL THEN
        NEW.lexemes := archive_fingerprint(
            NEW.summary,
            (SELECT m.content_tsv FROM memories m WHERE m.id = NEW.original_id AND m.user_id = NEW.user_id));
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.archived_memories_quantize() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.summary_embedding IS NOT NULL THEN
        NEW.summary_bits := binary_quantize(NEW.summary_embedding)::bit(1536);
        NEW.summary_embedding := NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.archived_term_stats_rows() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM term_stats_apply(array_agg(user_id), array_agg(archive_document(summary, lexemes)), 1)
        FROM new_rows WHERE original_superseded_by IS NULL;
    ELSE
        PERFORM term_stats_apply(array_agg(user_id), array_agg(archive_document(summary, lexemes)), -1)
        FROM old_rows WHERE original_superseded_by IS NULL;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.archived_term_stats_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.original_superseded_by IS NULL THEN
        PERFORM term_stats_doc(OLD.user_id, archive_document(OLD.summary, OLD.lexemes), -1);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.original_superseded_by IS NULL THEN
        PERFORM term_stats_doc(NEW.user_id, archive_document(NEW.summary, NEW.lexemes), 1);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.backup_member_offset(ref text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ("substring"(ref, '#bytes=([0-9]+)-[0-9]+$'::text))::bigint;

CREATE FUNCTION public.backup_object_ref(ref text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN split_part(ref, '#'::text, 1);

CREATE FUNCTION public.backup_ref(object_ref text, member_offset bigint, size bigint) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (object_ref || COALESCE(((('#bytes='::text || member_offset) || '-'::text) || ((member_offset + size) - 1)), ''::text));

CREATE FUNCTION public.bookkeeping_per_row() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    DROP TRIGGER IF EXISTS memories_term_stats_insert ON memories;
    DROP TRIGGER IF EXISTS memories_term_stats_delete ON memories;
    DROP TRIGGER IF EXISTS archived_term_stats_insert ON archived_memories;
    DROP TRIGGER IF EXISTS archived_term_stats_delete ON archived_memories;
    DROP TRIGGER IF EXISTS memory_retention_track_insert ON memories;
    DROP TRIGGER IF EXISTS memory_retention_track_update ON memories;
    CREATE TRIGGER memories_term_stats_insert AFTER INSERT ON memories
        FOR EACH ROW EXECUTE FUNCTION memories_term_stats_update();
    CREATE TRIGGER memories_term_stats_delete AFTER DELETE ON memories
        FOR EACH ROW EXECUTE FUNCTION memories_term_stats_update();
    CREATE TRIGGER archived_term_stats_insert AFTER INSERT ON archived_memories
        FOR EACH ROW EXECUTE FUNCTION archived_term_stats_update();
    CREATE TRIGGER archived_term_stats_delete AFTER DELETE ON archived_memories
        FOR EACH ROW EXECUTE FUNCTION archived_term_stats_update();
    CREATE TRIGGER memory_retention_track_insert AFTER INSERT ON memories
        FOR EACH ROW EXECUTE FUNCTION memory_retention_track();
    CREATE TRIGGER memory_retention_track_update AFTER UPDATE ON memories
        FOR EACH ROW
        WHEN ((OLD.last_accessed_at, OLD.access_count, OLD.category, OLD.created_at)
              IS DISTINCT FROM (NEW.last_accessed_at, NEW.access_count, NEW.category, NEW.created_at))
        EXECUTE FUNCTION memory_retention_track();
END $$;

CREATE FUNCTION public.memories_term_stats_rows() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM term_stats_apply(array_agg(user_id), array_agg(content_tsv), 1)
        FROM new_rows WHERE superseded_by IS NULL;
    ELSE
        PERFORM term_stats_apply(array_agg(user_id), array_agg(content_tsv), -1)
        FROM old_rows WHERE superseded_by IS NULL;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.memories_term_stats_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.superseded_by IS NULL THEN
        PERFORM term_stats_doc(OLD.user_id, OLD.content_tsv, -1);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.superseded_by IS NULL THEN
        PERFORM term_stats_doc(NEW.user_id, NEW.content_tsv, 1);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.memory_events_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $_$
DECLARE
    request uuid;
BEGIN
    IF TG_OP = 'UPDATE' AND NOT OLD.details ? 'redacted'
       AND NEW.details ->> 'redacted' ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        request := (NEW.details ->> 'redacted')::uuid;
        IF NEW.id = OLD.id AND NEW.memory_id = OLD.memory_id AND NEW.user_id = OLD.user_id
           AND NEW.event_type = OLD.event_type AND NEW.actor = OLD.actor AND NEW.occurred_at = OLD.occurred_at
           AND NEW.details = memory_events_redacted(OLD.details, request)
           AND EXISTS (SELECT 1 FROM forget_requests f WHERE f.user_id = OLD.user_id AND f.id = request) THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'memory_events is append-only: % is not allowed', TG_OP;
END $_$;

CREATE FUNCTION public.memory_events_redacted(details jsonb, request uuid) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT coalesce(jsonb_object_agg(key, value) FILTER (WHERE key IN
               ('archive_id', 'storage_ref', 'sha256', 'batch_key', 'superseded_by', 'supersedes')), '{}'::jsonb)
           || jsonb_build_object('redacted', request::text)
    FROM jsonb_each(details)
$$;

CREATE FUNCTION public.memory_facts_default_month() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.source_month IS NULL THEN
        NEW.source_month := date_trunc('month', NEW.valid_from AT TIME ZONE 'UTC')::date;
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.memory_retention_track() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO memory_retention (user_id, memory_id, created_at)
        VALUES (NEW.user_id, NEW.id, NEW.created_at)
        ON CONFLICT (user_id, memory_id) DO UPDATE
            SET pending = true, marks = memory_retention.marks + 1, created_at = EXCLUDED.created_at;
    ELSE
        UPDATE memory_retention r SET pending = true, marks = r.marks + 1, created_at = NEW.created_at
        WHERE r.user_id = NEW.user_id AND r.memory_id = NEW.id;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.memory_retention_track_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO memory_retention (user_id, memory_id, created_at)
    SELECT n.user_id, n.id, n.created_at FROM memory_retention_new_rows n
    ON CONFLICT (user_id, memory_id) DO UPDATE
        SET pending = true, marks = memory_retention.marks + 1, created_at = EXCLUDED.created_at;
    RETURN NULL;
END $$;

CREATE FUNCTION public.memory_retention_track_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE memory_retention r SET pending = true, marks = r.marks + 1, created_at = n.created_at
    FROM memory_retention_new_rows n JOIN memory_retention_old_rows o ON o.id = n.id AND o.user_id = n.user_id
    WHERE r.user_id = n.user_id AND r.memory_id = n.id
      AND (n.last_accessed_at, n.access_count, n.category, n.created_at)
          IS DISTINCT FROM (o.last_accessed_at, o.access_count, o.category, o.created_at);
    RETURN NULL;
END $$;

CREATE FUNCTION public.redact_memory_events(p_request uuid, p_user_id text, p_memory_ids uuid[], p_actor text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
DECLARE
    n integer;
BEGIN
    WITH r AS (
        UPDATE memory_events SET details = memory_events_redacted(details, p_request)
        WHERE user_id = p_user_id AND (p_memory_ids IS NULL OR memory_id = ANY (p_memory_ids))
          AND event_type NOT IN ('forgotten', 'redacted') AND NOT details ? 'redacted'
        RETURNING memory_id
    )
    INSERT INTO memory_events (memory_id, user_id, event_type, actor, details)
    SELECT memory_id, p_user_id, 'redacted', p_actor,
           jsonb_build_object('forget_request', p_request::text, 'events', count(*))
    FROM r GROUP BY memory_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION public.slow_path_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP;
END $$;

CREATE FUNCTION public.term_stats_apply(p_users text[], p_docs tsvector[], p_sign integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF coalesce(cardinality(p_users), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO user_corpus_stats AS s (user_id, docs, lexemes)
    SELECT u, p_sign * count(*), p_sign * coalesce(sum(length(d)), 0)
    FROM unnest(p_users, p_docs) AS x(u, d) GROUP BY u ORDER BY u
    ON CONFLICT (user_id) DO UPDATE SET docs = s.docs + excluded.docs, lexemes = s.lexemes + excluded.lexemes;
    INSERT INTO user_term_stats AS s (user_id, lexeme, df)
    SELECT u, l, p_sign * count(*)
    FROM unnest(p_users, p_docs) AS x(u, d), unnest(tsvector_to_array(d)) AS l
    GROUP BY u, l ORDER BY u, l
    ON CONFLICT (user_id, lexeme) DO UPDATE SET df = s.df + excluded.df;
    IF p_sign < 0 THEN
        DELETE FROM user_term_stats s
        USING (SELECT DISTINCT u, l FROM unnest(p_users, p_docs) AS x(u, d), unnest(tsvector_to_array(d)) AS l) AS t
        WHERE s.user_id = t.u AND s.lexeme = t.l AND s.df <= 0;
        DELETE FROM user_corpus_stats s WHERE s.user_id = ANY(p_users) AND s.docs <= 0;
    END IF;
END $$;

CREATE FUNCTION public.term_stats_doc(p_user text, p_doc tsvector, p_sign integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO user_corpus_stats AS s (user_id, docs, lexemes)
    VALUES (p_user, p_sign, p_sign * coalesce(length(p_doc), 0))
    ON CONFLICT (user_id) DO UPDATE SET docs = s.docs + excluded.docs, lexemes = s.lexemes + excluded.lexemes;
    IF p_doc IS NOT NULL AND length(p_doc) > 0 THEN
        INSERT INTO user_term_stats AS s (user_id, lexeme, df)
        SELECT p_user, l, p_sign FROM unnest(tsvector_to_array(p_doc)) AS l ORDER BY l
        ON CONFLICT (user_id, lexeme) DO UPDATE SET df = s.df + excluded.df;
    END IF;
    IF p_sign < 0 THEN
        DELETE FROM user_term_stats s
        WHERE s.user_id = p_user AND s.lexeme = ANY (tsvector_to_array(p_doc)) AND s.df <= 0;
        DELETE FROM user_corpus_stats s WHERE s.user_id = p_user AND s.docs <= 0;
    END IF;
END $$;

CREATE FUNCTION public.term_stats_rebuild() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM user_term_stats;
    DELETE FROM user_corpus_stats;
    INSERT INTO user_corpus_stats AS s (user_id, docs, lexemes)
    SELECT user_id, count(*), coalesce(sum(length(content_tsv)), 0)
    FROM memories WHERE superseded_by IS NULL GROUP BY user_id;
    INSERT INTO user_corpus_stats AS s (user_id, docs, lexemes)
    SELECT user_id, count(*), coalesce(sum(length(archive_document(summary, lexemes))), 0)
    FROM archived_memories WHERE original_superseded_by IS NULL GROUP BY user_id
    ON CONFLICT (user_id) DO UPDATE SET docs = s.docs + excluded.docs, lexemes = s.lexemes + excluded.lexemes;
    INSERT INTO user_term_stats AS s (user_id, lexeme, df)
    SELECT user_id, l, count(*)
    FROM memories, unnest(tsvector_to_array(content_tsv)) AS l WHERE superseded_by IS NULL GROUP BY user_id, l;
    INSERT INTO user_term_stats AS s (user_id, lexeme, df)
    SELECT user_id, l, count(*)
    FROM archived_memories, unnest(tsvector_to_array(archive_document(summary, lexemes))) AS l
    WHERE original_superseded_by IS NULL GROUP BY user_id, l
    ON CONFLICT (user_id, lexeme) DO UPDATE SET df = s.df + excluded.df;
END $$;

CREATE FUNCTION public.term_stats_truncated() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM term_stats_rebuild();
    RETURN NULL;
END $$;

CREATE TABLE public.archival_attempts (
    batch_key text NOT NULL,
    memory_id uuid NOT NULL,
    user_id text NOT NULL,
    archive_reason text NOT NULL,
    status text DEFAULT 'claimed'::text NOT NULL,
    failed_step text,
    error text,
    attempts integer DEFAULT 0 NOT NULL,
    summary text,
    summary_model text,
    summarizer_kind text,
    key_entities text[],
    input_tokens integer,
    output_tokens integer,
    cost_usd numeric(12,6),
    summary_embedding public.halfvec(1536),
    summary_embedding_model text,
    backup_key text,
    backup_ref text,
    backup_sha256 text,
    backup_size_bytes bigint,
    backup_version_id text,
    backup_archived_at timestamp with time zone,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    taken_over_from text,
    released_at timestamp with time zone,
    backup_row_xmin bigint,
    summary_entities jsonb,
    domain_guess text,
    llm_submission text,
    CONSTRAINT archival_attempts_reason CHECK ((archive_reason = ANY (ARRAY['stale_low_importance'::text, 'force_age'::text, 'superseded'::text, 'retention_floor'::text, 'ttl_expired'::text]))),
    CONSTRAINT archival_attempts_status_check CHECK ((status = ANY (ARRAY['claimed'::text, 'summarized'::text, 'embedded'::text, 'backed_up'::text, 'archived'::text, 'released'::text])))
);

CREATE TABLE public.archival_batches (
    batch_key text NOT NULL,
    as_of timestamp with time zone NOT NULL,
    criteria jsonb NOT NULL,
    claimed_count integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_host text,
    lease_pid integer,
    lease_expires_at timestamp with time zone,
    finished_at timestamp with time zone,
    retrievability jsonb,
    tier_audit jsonb,
    archived_pruned integer DEFAULT 0 NOT NULL,
    backup_started_at timestamp with time zone
);

CREATE TABLE public.archival_pause (
    singleton boolean DEFAULT true NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    reason text,
    actor text,
    batch_key text,
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT archival_pause_check CHECK (((NOT paused) OR ((reason IS NOT NULL) AND (actor IS NOT NULL)))),
    CONSTRAINT archival_pause_details_check CHECK ((jsonb_typeof(details) = 'object'::text)),
    CONSTRAINT archival_pause_singleton_check CHECK (singleton)
);

CREATE TABLE public.archival_pause_events (
    id bigint NOT NULL,
    action text NOT NULL,
    reason text NOT NULL,
    actor text NOT NULL,
    batch_key text,
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    occurred_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT archival_pause_events_action_check CHECK ((action = ANY (ARRAY['paused'::text, 'cleared'::text]))),
    CONSTRAINT archival_pause_events_actor_check CHECK ((actor <> ''::text)),
    CONSTRAINT archival_pause_events_details_check CHECK ((jsonb_typeof(details) = 'object'::text)),
    CONSTRAINT archival_pause_events_reason_check CHECK ((reason <> ''::text))
);

ALTER TABLE public.archival_pause_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.archival_pause_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.archival_skipped_nights (
    id bigint NOT NULL,
    batch_key text NOT NULL,
    step text NOT NULL,
    reason text NOT NULL,
    pause_event_id bigint,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

ALTER TABLE public.archival_skipped_nights ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.archival_skipped_nights_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.archive_link_uses (
    id bigint NOT NULL,
    archive_id uuid NOT NULL,
    user_id text NOT NULL,
    original_id uuid NOT NULL,
    linked_from uuid NOT NULL,
    used_at timestamp with time zone NOT NULL
);

ALTER TABLE public.archive_link_uses ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.archive_link_uses_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.archived_memories (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    original_id uuid NOT NULL,
    user_id text NOT NULL,
    summary text NOT NULL,
    summary_embedding public.halfvec(1536),
    summary_embedding_model text NOT NULL,
    key_entities text[] DEFAULT '{}'::text[] NOT NULL,
    original_domain text,
    original_category text NOT NULL,
    original_embedding_model text NOT NULL,
    original_updated_at timestamp with time zone NOT NULL,
    original_superseded_by uuid,
    importance_score double precision NOT NULL,
    access_count integer DEFAULT 0 NOT NULL,
    last_accessed_at timestamp with time zone,
    expansion_count integer DEFAULT 0 NOT NULL,
    last_expanded_at timestamp with time zone,
    archived_at timestamp with time zone NOT NULL,
    original_created_at timestamp with time zone NOT NULL,
    archive_reason text NOT NULL,
    storage_verified boolean DEFAULT false NOT NULL,
    backup_digest bytea CONSTRAINT archived_memories_backup_sha256_not_null NOT NULL,
    backup_size_bytes bigint NOT NULL,
    backup_version_id text,
    schema_version integer DEFAULT 1 NOT NULL,
    summary_model text NOT NULL,
    summarizer_kind text NOT NULL,
    summary_input_tokens integer DEFAULT 0 NOT NULL,
    summary_output_tokens integer DEFAULT 0 NOT NULL,
    summary_cost_usd numeric(12,6) DEFAULT 0 NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    original_dedupe_key text,
    summary_bits bit(1536),
    stubbed_at timestamp with time zone,
    lexemes tsvector,
    backup_object bigint NOT NULL,
    backup_offset bigint,
    CONSTRAINT archived_memories_access_count_check CHECK ((access_count >= 0)),
    CONSTRAINT archived_memories_backup_digest_check CHECK ((octet_length(backup_digest) = 32)),
    CONSTRAINT archived_memories_backup_offset_check CHECK ((backup_offset >= 0)),
    CONSTRAINT archived_memories_backup_size_bytes_check CHECK ((backup_size_bytes > 0)),
    CONSTRAINT archived_memories_importance_score_check CHECK (((importance_score >= (0)::double precision) AND (importance_score <= (1)::double precision))),
    CONSTRAINT archived_memories_metadata_check CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT archived_memories_reason CHECK ((archive_reason = ANY (ARRAY['stale_low_importance'::text, 'force_age'::text, 'superseded'::text, 'retention_floor'::text, 'ttl_expired'::text]))),
    CONSTRAINT archived_memories_summary_check CHECK ((summary <> ''::text)),
    CONSTRAINT archived_memories_user_id_check CHECK ((user_id <> ''::text)),
    CONSTRAINT archived_stub_without_vector CHECK (((stubbed_at IS NULL) = (summary_bits IS NOT NULL))),
    CONSTRAINT archived_summary_embedding_not_kept CHECK ((summary_embedding IS NULL))
);

CREATE TABLE public.backup_objects (
    id bigint NOT NULL,
    user_id text NOT NULL,
    ref text NOT NULL,
    CONSTRAINT backup_objects_ref_check CHECK (((ref <> ''::text) AND (POSITION(('#'::text) IN (ref)) = 0))),
    CONSTRAINT backup_objects_user_id_check CHECK ((user_id <> ''::text))
);

ALTER TABLE public.backup_objects ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.backup_objects_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.consolidation_builds (
    user_id text NOT NULL,
    family text NOT NULL,
    period_start date NOT NULL,
    source_fingerprint text NOT NULL,
    builder text NOT NULL,
    built_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT consolidation_builds_family_check CHECK ((family = ANY (ARRAY['facts'::text, 'key_moments'::text]))),
    CONSTRAINT consolidation_builds_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.embedding_migrations (
    id integer NOT NULL,
    source_model text NOT NULL,
    source_dim integer NOT NULL,
    target_model text NOT NULL,
    target_dim integer NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    started_by text NOT NULL,
    flipped_at timestamp with time zone,
    flipped_by text,
    flips integer DEFAULT 0 NOT NULL,
    finished_at timestamp with time zone,
    finished_by text,
    CONSTRAINT embedding_migrations_check CHECK (((target_model <> source_model) OR (target_dim <> source_dim))),
    CONSTRAINT embedding_migrations_source_dim_check CHECK ((source_dim > 0)),
    CONSTRAINT embedding_migrations_source_model_check CHECK ((source_model <> ''::text)),
    CONSTRAINT embedding_migrations_state_check CHECK ((state = ANY (ARRAY['running'::text, 'flipped'::text, 'finished'::text, 'aborted'::text]))),
    CONSTRAINT embedding_migrations_target_dim_check CHECK ((target_dim > 0)),
    CONSTRAINT embedding_migrations_target_model_check CHECK ((target_model <> ''::text))
);

ALTER TABLE public.embedding_migrations ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.embedding_migrations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.forget_requests (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    user_id text NOT NULL,
    memory_id uuid,
    actor text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    memory_ids uuid[] DEFAULT '{}'::uuid[] NOT NULL,
    object_keys text[] DEFAULT '{}'::text[] NOT NULL,
    object_versions_deleted integer DEFAULT 0 NOT NULL,
    rows_deleted jsonb DEFAULT '{}'::jsonb NOT NULL,
    requested_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    completed_at timestamp with time zone,
    CONSTRAINT forget_requests_actor_check CHECK ((actor <> ''::text)),
    CONSTRAINT forget_requests_check CHECK (((status = 'done'::text) = (completed_at IS NOT NULL))),
    CONSTRAINT forget_requests_rows_deleted_check CHECK ((jsonb_typeof(rows_deleted) = 'object'::text)),
    CONSTRAINT forget_requests_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'objects_deleted'::text, 'rows_deleted'::text, 'done'::text]))),
    CONSTRAINT forget_requests_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.key_moments (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    user_id text NOT NULL,
    month date NOT NULL,
    memory_id uuid NOT NULL,
    title text NOT NULL,
    importance double precision NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    built_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT key_moments_importance_check CHECK (((importance >= (0)::double precision) AND (importance <= (1)::double precision))),
    CONSTRAINT key_moments_month_check CHECK ((EXTRACT(day FROM month) = (1)::numeric)),
    CONSTRAINT key_moments_title_check CHECK ((title <> ''::text)),
    CONSTRAINT key_moments_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.llm_batches (
    submission_key text NOT NULL,
    batch_key text NOT NULL,
    provider text NOT NULL,
    model text NOT NULL,
    memory_ids uuid[] NOT NULL,
    provider_batch_id text,
    status text DEFAULT 'submitting'::text NOT NULL,
    request_counts jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    submitted_at timestamp with time zone,
    ended_at timestamp with time zone,
    collected_at timestamp with time zone,
    CONSTRAINT llm_batches_status_check CHECK ((status = ANY (ARRAY['submitting'::text, 'submitted'::text, 'ended'::text, 'collected'::text, 'expired'::text, 'canceled'::text, 'failed'::text])))
);

CREATE TABLE public.llm_usage (
    id bigint NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    batch_key text,
    memory_id uuid,
    user_id text NOT NULL,
    purpose text DEFAULT 'summary'::text NOT NULL,
    provider text NOT NULL,
    model text NOT NULL,
    mode text NOT NULL,
    request_id text,
    outcome text NOT NULL,
    input_tokens integer NOT NULL,
    output_tokens integer NOT NULL,
    cache_creation_input_tokens integer DEFAULT 0 NOT NULL,
    cache_read_input_tokens integer DEFAULT 0 NOT NULL,
    cost_usd numeric(16,9) NOT NULL,
    priced boolean NOT NULL,
    CONSTRAINT llm_usage_cache_creation_input_tokens_check CHECK ((cache_creation_input_tokens >= 0)),
    CONSTRAINT llm_usage_cache_read_input_tokens_check CHECK ((cache_read_input_tokens >= 0)),
    CONSTRAINT llm_usage_cost_usd_check CHECK ((cost_usd >= (0)::numeric)),
    CONSTRAINT llm_usage_input_tokens_check CHECK ((input_tokens >= 0)),
    CONSTRAINT llm_usage_mode_check CHECK ((mode = ANY (ARRAY['sync'::text, 'batch'::text]))),
    CONSTRAINT llm_usage_outcome_check CHECK ((outcome = ANY (ARRAY['ok'::text, 'failed'::text]))),
    CONSTRAINT llm_usage_output_tokens_check CHECK ((output_tokens >= 0))
);

ALTER TABLE public.llm_usage ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.llm_usage_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.memories (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    user_id text NOT NULL,
    content text NOT NULL,
    content_sha256 text NOT NULL,
    embedding public.vector(1536) NOT NULL,
    embedding_model text NOT NULL,
    embedding_dim integer NOT NULL,
    entity_links uuid[] DEFAULT '{}'::uuid[] NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    domain text,
    category text DEFAULT 'episodic'::text NOT NULL,
    importance_score double precision DEFAULT 0.5 NOT NULL,
    access_count integer DEFAULT 0 NOT NULL,
    last_accessed_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    pinned boolean DEFAULT false NOT NULL,
    superseded_by uuid,
    content_tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, content)) STORED,
    dedupe_key text,
    ttl_days integer,
    expires_at timestamp with time zone,
    restored_at timestamp with time zone,
    CONSTRAINT memories_access_count_check CHECK ((access_count >= 0)),
    CONSTRAINT memories_category_check CHECK ((category = ANY (ARRAY['core'::text, 'episodic'::text, 'semantic'::text, 'procedural'::text]))),
    CONSTRAINT memories_content_check CHECK ((content <> ''::text)),
    CONSTRAINT memories_content_sha256_check CHECK ((content_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT memories_dedupe_key_check CHECK ((dedupe_key ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT memories_embedding_dim_check CHECK ((embedding_dim = 1536)),
    CONSTRAINT memories_expiry_needs_ttl CHECK (((expires_at IS NULL) OR (ttl_days > 0))),
    CONSTRAINT memories_importance_score_check CHECK (((importance_score >= (0)::double precision) AND (importance_score <= (1)::double precision))),
    CONSTRAINT memories_metadata_check CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT memories_ttl_days_check CHECK ((ttl_days >= 0)),
    CONSTRAINT memories_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.memory_archive_settings (
    key text NOT NULL,
    value text NOT NULL
);

CREATE TABLE public.memory_digests (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    user_id text NOT NULL,
    level smallint NOT NULL,
    period_start date NOT NULL,
    period_end date NOT NULL,
    summary text NOT NULL,
    body jsonb DEFAULT '{}'::jsonb NOT NULL,
    embedding public.vector(1536) NOT NULL,
    embedding_model text NOT NULL,
    source_memory_ids uuid[] NOT NULL,
    source_digest_ids uuid[] DEFAULT '{}'::uuid[] NOT NULL,
    source_fingerprint text NOT NULL,
    summarizer_kind text NOT NULL,
    summary_model text NOT NULL,
    built_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT memory_digests_body_check CHECK ((jsonb_typeof(body) = 'object'::text)),
    CONSTRAINT memory_digests_check CHECK ((period_end > period_start)),
    CONSTRAINT memory_digests_level_check CHECK ((level >= 2)),
    CONSTRAINT memory_digests_summary_check CHECK ((summary <> ''::text)),
    CONSTRAINT memory_digests_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.memory_events (
    id bigint NOT NULL,
    memory_id uuid NOT NULL,
    user_id text NOT NULL,
    event_type text NOT NULL,
    actor text NOT NULL,
    occurred_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT memory_events_event_type_check CHECK ((event_type = ANY (ARRAY['created'::text, 'updated'::text, 'archived'::text, 'restored'::text, 'expanded'::text, 'promoted'::text, 'deleted'::text, 'superseded'::text, 'stubbed'::text, 'unstubbed'::text, 'forgotten'::text, 'redacted'::text])))
);

ALTER TABLE public.memory_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.memory_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.memory_facts (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    user_id text NOT NULL,
    kind text NOT NULL,
    subject text NOT NULL,
    predicate text NOT NULL,
    object text NOT NULL,
    valid_from timestamp with time zone NOT NULL,
    valid_to timestamp with time zone,
    source_memory_ids uuid[] NOT NULL,
    extractor text NOT NULL,
    confidence double precision,
    embedding public.vector(1536) NOT NULL,
    embedding_model text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    source_month date NOT NULL,
    single_valued boolean DEFAULT false NOT NULL,
    CONSTRAINT memory_facts_check CHECK (((valid_to IS NULL) OR (valid_to >= valid_from))),
    CONSTRAINT memory_facts_confidence_check CHECK (((confidence IS NULL) OR ((confidence >= (0)::double precision) AND (confidence <= (1)::double precision)))),
    CONSTRAINT memory_facts_kind_check CHECK ((kind = ANY (ARRAY['person'::text, 'project'::text, 'place'::text, 'preference'::text, 'date'::text, 'other'::text]))),
    CONSTRAINT memory_facts_object_check CHECK ((object <> ''::text)),
    CONSTRAINT memory_facts_predicate_check CHECK ((predicate <> ''::text)),
    CONSTRAINT memory_facts_source_memory_ids_check CHECK ((cardinality(source_memory_ids) > 0)),
    CONSTRAINT memory_facts_source_month_check CHECK ((EXTRACT(day FROM source_month) = (1)::numeric)),
    CONSTRAINT memory_facts_subject_check CHECK ((subject <> ''::text)),
    CONSTRAINT memory_facts_user_id_check CHECK ((user_id <> ''::text))
);

CREATE TABLE public.memory_retention (
    user_id text CONSTRAINT memory_retention_v2_user_id_not_null NOT NULL,
    memory_id uuid CONSTRAINT memory_retention_v2_memory_id_not_null NOT NULL,
    pending boolean DEFAULT true CONSTRAINT memory_retention_v2_pending_not_null NOT NULL,
    marks integer DEFAULT 0 CONSTRAINT memory_retention_v2_marks_not_null NOT NULL,
    created_at timestamp with time zone CONSTRAINT memory_retention_v2_created_at_not_null NOT NULL,
    category text,
    last_touched_at timestamp with time zone,
    access_count integer,
    half_life_days double precision,
    floor double precision,
    floor_at timestamp with time zone,
    scored_as_of timestamp with time zone,
    floor_since timestamp with time zone,
    CONSTRAINT memory_retention_v2_check CHECK ((pending OR ((category IS NOT NULL) AND (last_touched_at IS NOT NULL) AND (access_count IS NOT NULL) AND (floor IS NOT NULL) AND (scored_as_of IS NOT NULL)))),
    CONSTRAINT memory_retention_v2_floor_check CHECK (((floor >= (0)::double precision) AND (floor < (1)::double precision)))
);

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.user_corpus_stats (
    user_id text NOT NULL,
    docs bigint NOT NULL,
    lexemes bigint NOT NULL
);

CREATE TABLE public.user_term_stats (
    user_id text NOT NULL,
    lexeme text NOT NULL,
    df integer NOT NULL
);

ALTER TABLE ONLY public.archival_attempts
    ADD CONSTRAINT archival_attempts_pkey PRIMARY KEY (batch_key, memory_id, user_id);

ALTER TABLE ONLY public.archival_batches
    ADD CONSTRAINT archival_batches_pkey PRIMARY KEY (batch_key);

ALTER TABLE ONLY public.archival_pause_events
    ADD CONSTRAINT archival_pause_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.archival_pause
    ADD CONSTRAINT archival_pause_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY public.archival_skipped_nights
    ADD CONSTRAINT archival_skipped_nights_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.archive_link_uses
    ADD CONSTRAINT archive_link_uses_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.archived_memories
    ADD CONSTRAINT archived_memories_original_id_key UNIQUE (original_id, user_id);

ALTER TABLE ONLY public.archived_memories
    ADD CONSTRAINT archived_memories_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.backup_objects
    ADD CONSTRAINT backup_objects_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.backup_objects
    ADD CONSTRAINT backup_objects_ref_user_id_key UNIQUE (ref, user_id);

ALTER TABLE ONLY public.consolidation_builds
    ADD CONSTRAINT consolidation_builds_pkey PRIMARY KEY (user_id, family, period_start);

ALTER TABLE ONLY public.embedding_migrations
    ADD CONSTRAINT embedding_migrations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.forget_requests
    ADD CONSTRAINT forget_requests_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.key_moments
    ADD CONSTRAINT key_moments_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.key_moments
    ADD CONSTRAINT key_moments_user_id_memory_id_key UNIQUE (user_id, memory_id);

ALTER TABLE ONLY public.llm_batches
    ADD CONSTRAINT llm_batches_pkey PRIMARY KEY (submission_key);

ALTER TABLE ONLY public.llm_batches
    ADD CONSTRAINT llm_batches_provider_batch_id_key UNIQUE (provider_batch_id);

ALTER TABLE ONLY public.llm_usage
    ADD CONSTRAINT llm_usage_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.memories
    ADD CONSTRAINT memories_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.memory_archive_settings
    ADD CONSTRAINT memory_archive_settings_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.memory_digests
    ADD CONSTRAINT memory_digests_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.memory_digests
    ADD CONSTRAINT memory_digests_user_id_level_period_start_key UNIQUE (user_id, level, period_start);

ALTER TABLE ONLY public.memory_events
    ADD CONSTRAINT memory_events_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.memory_facts
    ADD CONSTRAINT memory_facts_pkey PRIMARY KEY (id, user_id);

ALTER TABLE ONLY public.memory_retention
    ADD CONSTRAINT memory_retention_pkey PRIMARY KEY (user_id, memory_id);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.user_corpus_stats
    ADD CONSTRAINT user_corpus_stats_pkey PRIMARY KEY (user_id);

ALTER TABLE ONLY public.user_term_stats
    ADD CONSTRAINT user_term_stats_pkey PRIMARY KEY (user_id, lexeme);

CREATE INDEX archival_attempts_backup_key ON public.archival_attempts USING btree (backup_key) WHERE (backup_key IS NOT NULL);

CREATE INDEX archival_attempts_batch_status ON public.archival_attempts USING btree (batch_key, status);

CREATE UNIQUE INDEX archival_attempts_one_open ON public.archival_attempts USING btree (memory_id, user_id) WHERE (status <> ALL (ARRAY['archived'::text, 'released'::text]));

CREATE INDEX archival_attempts_released ON public.archival_attempts USING btree (memory_id) WHERE (status = 'released'::text);

CREATE INDEX archival_batches_unfinished ON public.archival_batches USING btree (lease_expires_at) WHERE (finished_at IS NULL);

CREATE INDEX archival_skipped_nights_batch ON public.archival_skipped_nights USING btree (batch_key, recorded_at);

CREATE INDEX archive_link_uses_archive ON public.archive_link_uses USING btree (archive_id, used_at);

CREATE INDEX archive_link_uses_used_at ON public.archive_link_uses USING btree (used_at);

CREATE INDEX archived_memories_batch_key ON public.archived_memories USING btree (((metadata ->> 'batch_key'::text)));

CREATE INDEX archived_stubs ON public.archived_memories USING btree (user_id, stubbed_at) WHERE (stubbed_at IS NOT NULL);

CREATE INDEX archived_summary_bits_hnsw ON public.archived_memories USING hnsw (summary_bits public.bit_hamming_ops) WITH (m='12', ef_construction='64');

CREATE INDEX archived_tags ON public.archived_memories USING gin (((metadata -> 'tags'::text)) jsonb_path_ops);

CREATE INDEX archived_user_created_id ON public.archived_memories USING btree (user_id, original_created_at DESC, original_id DESC);

CREATE INDEX archived_user_lexemes ON public.archived_memories USING gin (user_id, ((to_tsvector('english'::regconfig, summary) || COALESCE(lexemes, ''::tsvector)))) WITH (fastupdate=off);

CREATE UNIQUE INDEX embedding_migrations_one_open ON public.embedding_migrations USING btree ((true)) WHERE (state = ANY (ARRAY['running'::text, 'flipped'::text]));

CREATE UNIQUE INDEX forget_requests_one_open ON public.forget_requests USING btree (user_id, COALESCE(memory_id, '00000000-0000-0000-0000-000000000000'::uuid)) WHERE (status <> 'done'::text);

CREATE INDEX forget_requests_user ON public.forget_requests USING btree (user_id, requested_at);

CREATE INDEX key_moments_user_month ON public.key_moments USING btree (user_id, month);

CREATE INDEX llm_batches_open ON public.llm_batches USING btree (batch_key) WHERE (status = ANY (ARRAY['submitting'::text, 'submitted'::text, 'ended'::text]));

CREATE INDEX llm_usage_batch ON public.llm_usage USING btree (batch_key, model);

CREATE UNIQUE INDEX llm_usage_batch_result ON public.llm_usage USING btree (request_id, user_id) WHERE (mode = 'batch'::text);

CREATE INDEX llm_usage_memory ON public.llm_usage USING btree (memory_id);

CREATE INDEX memories_archival_order ON public.memories USING btree (importance_score, created_at) WHERE (NOT pinned);

CREATE INDEX memories_chunk_parent ON public.memories USING btree ((((metadata -> 'chunk'::text) ->> 'parent_id'::text))) WHERE (metadata ? 'chunk'::text);

CREATE INDEX memories_claim_order ON public.memories USING btree ((((superseded_by IS NULL) AND (expires_at IS NULL))), importance_score, created_at, id) WHERE (NOT pinned);

CREATE UNIQUE INDEX memories_dedupe_live ON public.memories USING btree (user_id, dedupe_key) WHERE ((dedupe_key IS NOT NULL) AND (superseded_by IS NULL));

CREATE INDEX memories_embedding_hnsw ON public.memories USING hnsw (embedding public.vector_cosine_ops) WITH (m='16', ef_construction='64');

CREATE INDEX memories_entity_links ON public.memories USING gin (entity_links);

CREATE INDEX memories_expires ON public.memories USING btree (expires_at) WHERE (expires_at IS NOT NULL);

CREATE INDEX memories_superseded ON public.memories USING btree (updated_at) WHERE (superseded_by IS NOT NULL);

CREATE INDEX memories_tags ON public.memories USING gin (((metadata -> 'tags'::text)) jsonb_path_ops);

CREATE INDEX memories_user_created_id ON public.memories USING btree (user_id, created_at DESC, id DESC);

CREATE INDEX memories_user_tsv ON public.memories USING gin (user_id, content_tsv);

CREATE INDEX memories_user_type_seen ON public.memories USING btree (user_id, category, COALESCE(last_accessed_at, created_at) DESC);

CREATE INDEX memory_digests_sources ON public.memory_digests USING gin (source_memory_ids);

CREATE INDEX memory_digests_tsv ON public.memory_digests USING gin (to_tsvector('english'::regconfig, summary));

CREATE INDEX memory_events_expanded ON public.memory_events USING btree (occurred_at) WHERE (event_type = 'expanded'::text);

CREATE INDEX memory_events_kept_backups ON public.memory_events USING btree (public.backup_object_ref((details ->> 'storage_ref'::text))) WHERE ((event_type = ANY (ARRAY['restored'::text, 'promoted'::text])) AND (NOT (details ? 'redacted'::text)));

CREATE INDEX memory_events_memory ON public.memory_events USING btree (memory_id, occurred_at);

CREATE INDEX memory_events_user_type ON public.memory_events USING btree (user_id, event_type, occurred_at);

CREATE INDEX memory_facts_sources ON public.memory_facts USING gin (source_memory_ids);

CREATE INDEX memory_facts_subject ON public.memory_facts USING btree (user_id, lower(subject), predicate, valid_from DESC);

CREATE INDEX memory_facts_tsv ON public.memory_facts USING gin (to_tsvector('english'::regconfig, ((((subject || ' '::text) || predicate) || ' '::text) || object)));

CREATE INDEX memory_facts_user_month ON public.memory_facts USING btree (user_id, source_month);

CREATE INDEX memory_retention_floor_since ON public.memory_retention USING btree (floor_since) WHERE (floor_since IS NOT NULL);

CREATE INDEX memory_retention_pending ON public.memory_retention USING btree (user_id, created_at) WHERE pending;

CREATE TRIGGER archival_pause_events_no_truncate BEFORE TRUNCATE ON public.archival_pause_events FOR EACH STATEMENT EXECUTE FUNCTION public.slow_path_append_only();

CREATE TRIGGER archival_pause_events_no_update BEFORE DELETE OR UPDATE ON public.archival_pause_events FOR EACH ROW EXECUTE FUNCTION public.slow_path_append_only();

CREATE TRIGGER archival_skipped_nights_no_update BEFORE DELETE OR UPDATE ON public.archival_skipped_nights FOR EACH ROW EXECUTE FUNCTION public.slow_path_append_only();

CREATE TRIGGER archived_memories_keep_tags BEFORE INSERT ON public.archived_memories FOR EACH ROW EXECUTE FUNCTION public.archived_memories_keep_tags();

CREATE TRIGGER archived_memories_lexemes BEFORE INSERT ON public.archived_memories FOR EACH ROW EXECUTE FUNCTION public.archived_memories_lexemes();

CREATE TRIGGER archived_memories_quantize BEFORE INSERT OR UPDATE OF summary_embedding ON public.archived_memories FOR EACH ROW EXECUTE FUNCTION public.archived_memories_quantize();

CREATE TRIGGER archived_term_stats_delete AFTER DELETE ON public.archived_memories REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION public.archived_term_stats_rows();

CREATE TRIGGER archived_term_stats_insert AFTER INSERT ON public.archived_memories REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.archived_term_stats_rows();

CREATE TRIGGER archived_term_stats_truncate AFTER TRUNCATE ON public.archived_memories FOR EACH STATEMENT EXECUTE FUNCTION public.term_stats_truncated();

CREATE TRIGGER archived_term_stats_update AFTER UPDATE ON public.archived_memories FOR EACH ROW WHEN (((old.lexemes IS DISTINCT FROM new.lexemes) OR (old.summary IS DISTINCT FROM new.summary) OR (old.user_id IS DISTINCT FROM new.user_id) OR ((old.original_superseded_by IS NULL) <> (new.original_superseded_by IS NULL)))) EXECUTE FUNCTION public.archived_term_stats_update();

CREATE TRIGGER memories_term_stats_delete AFTER DELETE ON public.memories REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION public.memories_term_stats_rows();

CREATE TRIGGER memories_term_stats_insert AFTER INSERT ON public.memories REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.memories_term_stats_rows();

CREATE TRIGGER memories_term_stats_truncate AFTER TRUNCATE ON public.memories FOR EACH STATEMENT EXECUTE FUNCTION public.term_stats_truncated();

CREATE TRIGGER memories_term_stats_update AFTER UPDATE ON public.memories FOR EACH ROW WHEN (((old.content_tsv IS DISTINCT FROM new.content_tsv) OR (old.user_id IS DISTINCT FROM new.user_id) OR ((old.superseded_by IS NULL) <> (new.superseded_by IS NULL)))) EXECUTE FUNCTION public.memories_term_stats_update();

CREATE TRIGGER memory_events_no_truncate BEFORE TRUNCATE ON public.memory_events FOR EACH STATEMENT EXECUTE FUNCTION public.memory_events_append_only();

CREATE TRIGGER memory_events_no_update BEFORE DELETE OR UPDATE ON public.memory_events FOR EACH ROW EXECUTE FUNCTION public.memory_events_append_only();

CREATE TRIGGER memory_facts_source_month BEFORE INSERT ON public.memory_facts FOR EACH ROW EXECUTE FUNCTION public.memory_facts_default_month();

CREATE TRIGGER memory_retention_track_insert AFTER INSERT ON public.memories REFERENCING NEW TABLE AS memory_retention_new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.memory_retention_track_insert();

CREATE TRIGGER memory_retention_track_update AFTER UPDATE ON public.memories REFERENCING OLD TABLE AS memory_retention_old_rows NEW TABLE AS memory_retention_new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.memory_retention_track_update();

ALTER TABLE ONLY public.archival_attempts
    ADD CONSTRAINT archival_attempts_batch_key_fkey FOREIGN KEY (batch_key) REFERENCES public.archival_batches(batch_key);

ALTER TABLE ONLY public.archival_skipped_nights
    ADD CONSTRAINT archival_skipped_nights_pause_event_id_fkey FOREIGN KEY (pause_event_id) REFERENCES public.archival_pause_events(id);

ALTER TABLE ONLY public.archive_link_uses
    ADD CONSTRAINT archive_link_uses_archive_id_fkey FOREIGN KEY (user_id, archive_id) REFERENCES public.archived_memories(user_id, id) ON DELETE CASCADE;

ALTER TABLE ONLY public.archived_memories
    ADD CONSTRAINT archived_memories_backup_object_fkey FOREIGN KEY (backup_object, user_id) REFERENCES public.backup_objects(id, user_id);

ALTER TABLE ONLY public.llm_batches
    ADD CONSTRAINT llm_batches_batch_key_fkey FOREIGN KEY (batch_key) REFERENCES public.archival_batches(batch_key);

ALTER TABLE ONLY public.memory_retention
    ADD CONSTRAINT memory_retention_memory_fkey FOREIGN KEY (user_id, memory_id) REFERENCES public.memories(user_id, id) ON DELETE CASCADE;
