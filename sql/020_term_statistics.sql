-- Full text that finds an archived memory by its original's words, ranked by BM25 statistics kept on
-- write (memory_lib/retrieval/sql.py reads them; tests/retrieval/test_term_statistics.py checks them).

-- 1. The lexical fingerprint of an archive row: the original's lexemes its summary lacks (stripped of
-- positions), so a name, number, date or rare word of the original still finds the row whatever the
-- summarizer kept. An archive row's full-text document is archive_document(summary, lexemes): the
-- summary's lexemes and the fingerprint's. NULL when the summary kept every lexeme (an extractive summary
-- of a short memory): the fingerprint costs only what the summary dropped. One rule, here.
CREATE FUNCTION archive_fingerprint(summary text, original tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN nullif(ts_delete(strip(original), tsvector_to_array(to_tsvector('english'::regconfig, summary))),
                  ''::tsvector);

CREATE FUNCTION archive_document(summary text, fingerprint tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_tsvector('english'::regconfig, summary) || coalesce(fingerprint, ''::tsvector);

ALTER TABLE archived_memories ADD COLUMN lexemes tsvector;

-- Written as the row is inserted, while the original is still in `memories` (the archival step inserts
-- the archive row, then deletes the original, in one transaction). A row inserted without its original
-- (an import) has no fingerprint: its summary alone is its document.
CREATE FUNCTION archived_memories_lexemes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lexemes IS NULL THEN
        NEW.lexemes := archive_fingerprint(
            NEW.summary,
            (SELECT m.content_tsv FROM memories m WHERE m.id = NEW.original_id AND m.user_id = NEW.user_id));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER archived_memories_lexemes BEFORE INSERT ON archived_memories
    FOR EACH ROW EXECUTE FUNCTION archived_memories_lexemes();
-- (Rows archived before this migration: their originals are in object storage only; their summary
-- alone is their document until they are restored and archived again.)

-- The document search matches and counts, indexed per user. Written out (not a function) so that the
-- search's expression and the index's are the same text.
CREATE INDEX archived_user_lexemes ON archived_memories
    USING gin (user_id, (to_tsvector('english'::regconfig, summary) || coalesce(lexemes, ''::tsvector)));
DROP INDEX archived_user_summary_tsv;

-- 2. BM25 statistics per user, over the user's live memories of both tiers (a hot memory's document is
-- content_tsv, an archive row's its summary's lexemes and its fingerprint; superseded memories are not
-- counted). `term_documents` defines that corpus; the tables below are its aggregates, kept exact by the
-- triggers further down, so a search reads one row per query term instead of counting postings.
CREATE VIEW term_documents AS
    SELECT user_id, content_tsv AS doc FROM memories WHERE superseded_by IS NULL
    UNION ALL
    SELECT user_id, archive_document(summary, lexemes) AS doc
    FROM archived_memories WHERE original_superseded_by IS NULL;

-- docs = N, lexemes = the sum of the documents' lengths (distinct lexemes each): avgdl = lexemes / docs.
CREATE TABLE user_corpus_stats (
    user_id text PRIMARY KEY,
    docs    bigint NOT NULL,
    lexemes bigint NOT NULL
);
-- df: in how many of the user's documents the lexeme occurs. Rows at 0 are deleted.
CREATE TABLE user_term_stats (
    user_id text NOT NULL,
    lexeme  text NOT NULL,
    df      integer NOT NULL,
    PRIMARY KEY (user_id, lexeme)
);

-- Add (sign 1) or remove (sign -1) documents. Locks: each user's corpus row first, in user order, then
-- the terms in (user, lexeme) order; a user's statistics change one transaction at a time, so two
-- writers of one user queue on the corpus row instead of deadlocking on terms.
CREATE FUNCTION term_stats_apply(p_users text[], p_docs tsvector[], p_sign integer) RETURNS void
    LANGUAGE plpgsql AS $$
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

-- From scratch (the migration, and after a TRUNCATE of either table).
CREATE FUNCTION term_stats_rebuild() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM user_term_stats;
    DELETE FROM user_corpus_stats;
    INSERT INTO user_corpus_stats (user_id, docs, lexemes)
    SELECT user_id, count(*), coalesce(sum(length(doc)), 0) FROM term_documents GROUP BY user_id;
    INSERT INTO user_term_stats (user_id, lexeme, df)
    SELECT user_id, l, count(*) FROM term_documents, unnest(tsvector_to_array(doc)) AS l GROUP BY user_id, l;
END $$;

-- Inserts and deletes: once per statement over the changed rows (a bulk load or an archival chunk
-- aggregates its terms). Updates: per row, only when the document or its liveness changes (access
-- counts, scores and embeddings do not touch the statistics).
CREATE FUNCTION memories_term_stats_rows() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER memories_term_stats_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_term_stats_rows();
CREATE TRIGGER memories_term_stats_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_term_stats_rows();

CREATE FUNCTION memories_term_stats_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.superseded_by IS NULL THEN
        PERFORM term_stats_apply(ARRAY[OLD.user_id], ARRAY[OLD.content_tsv], -1);
    END IF;
    IF NEW.superseded_by IS NULL THEN
        PERFORM term_stats_apply(ARRAY[NEW.user_id], ARRAY[NEW.content_tsv], 1);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_term_stats_update AFTER UPDATE ON memories FOR EACH ROW
    WHEN (OLD.content_tsv IS DISTINCT FROM NEW.content_tsv OR OLD.user_id IS DISTINCT FROM NEW.user_id
          OR (OLD.superseded_by IS NULL) <> (NEW.superseded_by IS NULL))
    EXECUTE FUNCTION memories_term_stats_update();

CREATE FUNCTION archived_term_stats_rows() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER archived_term_stats_insert AFTER INSERT ON archived_memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION archived_term_stats_rows();
CREATE TRIGGER archived_term_stats_delete AFTER DELETE ON archived_memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION archived_term_stats_rows();

CREATE FUNCTION archived_term_stats_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.original_superseded_by IS NULL THEN
        PERFORM term_stats_apply(ARRAY[OLD.user_id], ARRAY[archive_document(OLD.summary, OLD.lexemes)], -1);
    END IF;
    IF NEW.original_superseded_by IS NULL THEN
        PERFORM term_stats_apply(ARRAY[NEW.user_id], ARRAY[archive_document(NEW.summary, NEW.lexemes)], 1);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER archived_term_stats_update AFTER UPDATE ON archived_memories FOR EACH ROW
    WHEN (OLD.lexemes IS DISTINCT FROM NEW.lexemes OR OLD.summary IS DISTINCT FROM NEW.summary
          OR OLD.user_id IS DISTINCT FROM NEW.user_id
          OR (OLD.original_superseded_by IS NULL) <> (NEW.original_superseded_by IS NULL))
    EXECUTE FUNCTION archived_term_stats_update();

CREATE FUNCTION term_stats_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM term_stats_rebuild();
    RETURN NULL;
END $$;
CREATE TRIGGER memories_term_stats_truncate AFTER TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION term_stats_truncated();
CREATE TRIGGER archived_term_stats_truncate AFTER TRUNCATE ON archived_memories
    FOR EACH STATEMENT EXECUTE FUNCTION term_stats_truncated();

SELECT term_stats_rebuild();
