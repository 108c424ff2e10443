-- Full text per user: one GIN index over (user_id, tsvector) instead of the tsvector alone (btree_gin,
-- a contrib extension that any user with CREATE on the database may install).
--
-- Every full-text lookup of search is one user's: before, Postgres intersected the term's GIN bitmap
-- (all users' matches) with a bitmap of the user's rows from a btree, rebuilt for every query term; at
-- 100k hot memories (4 users) that was ~10 ms a term, most of a search's time after the document count.
-- With user_id inside the GIN index, one index scan yields the user's matches of the term (~4 ms).
CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE INDEX memories_user_tsv ON memories USING gin (user_id, content_tsv);
DROP INDEX memories_content_tsv;

-- The archived summary's tsvector stays an expression (007): search uses it verbatim.
CREATE INDEX archived_user_summary_tsv ON archived_memories USING gin (user_id, to_tsvector('english', summary));
DROP INDEX archived_summary_tsv;
