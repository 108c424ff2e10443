-- Bookkeeping that a distributed schema can run: per row, touching only the row's own user.
--
-- Distributed Postgres (Citus) runs a table's triggers on each shard, where a row trigger may read and
-- write the same user's rows of colocated tables (they live on the same worker), but a statement trigger
-- with a transition table cannot run at all ("could not find named tuplestore"). One node keeps the
-- statement triggers of the term statistics and the retention tracking: they aggregate a bulk write
-- (an archival chunk updates each of a user's terms once, where a trigger per row would update it once
-- per row). `bookkeeping_per_row()` swaps them for the row triggers below that give the same rows; the
-- distribution statements (docs/how-to/distributed-postgres.md) call it before distributing. The
-- statistics lock the user's corpus row first, then its terms in lexeme order, so two writers of one
-- user queue instead of deadlocking.

CREATE FUNCTION term_stats_doc(p_user text, p_doc tsvector, p_sign integer) RETURNS void
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

-- Updates were already per row (only when the document or its liveness changes); inserts and deletes
-- use the same functions once per row after `bookkeeping_per_row()`.
CREATE OR REPLACE FUNCTION memories_term_stats_update() RETURNS trigger
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

CREATE OR REPLACE FUNCTION archived_term_stats_update() RETURNS trigger
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

-- Retention per row: a new memory gets its row; a change of an input of its score marks the row pending.
CREATE FUNCTION memory_retention_track() RETURNS trigger
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

-- Idempotent: run again, it leaves the row triggers as they are.
CREATE FUNCTION bookkeeping_per_row() RETURNS void
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

-- The audit log's one allowed update, a redaction, is recognized by its data, not by a session setting
-- (a setting made on the coordinator never reaches the worker where the row and its trigger are): the
-- new details are exactly the redacted form of the old ones for a forget request recorded for the same
-- user, and nothing else changes.
CREATE OR REPLACE FUNCTION memory_events_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
END $$;

CREATE OR REPLACE FUNCTION redact_memory_events(p_request uuid, p_user_id text, p_memory_ids uuid[], p_actor text)
    RETURNS integer
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

-- A rebuild of the statistics (after a TRUNCATE) aggregates each tier by user on its own: a statement
-- grouped by the distribution column runs on every worker at once, where a view joining both tiers and
-- unnesting its documents could not be planned. The view is gone with it.
CREATE OR REPLACE FUNCTION term_stats_rebuild() RETURNS void
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

DROP VIEW term_documents;

-- == archival ==

-- == write ==

-- == retrieval ==

-- == lifecycle ==

-- == storage ==
