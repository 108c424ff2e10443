-- Distribution keys: every primary key, unique constraint, unique index and foreign key of a per-user
-- table includes user_id, so each table can be hash-partitioned or distributed (Citus) by user_id, and a
-- row's keys never reach across users. Tables without user data (settings, schema_migrations, batches,
-- the pause, provider batches, embedding migrations) are reference/coordinator tables and keep their
-- keys; tests/storage/test_distribution_keys.py reads the catalog for both rules.
--
-- user_id comes last in each key: a lookup by id alone (maintenance, the nightly batch) keeps its index,
-- and a key's column order does not matter to foreign keys, ON CONFLICT, partitioning or Citus.
--
-- Safe on a populated database: every new key is implied by the one it replaces (id unique implies
-- (user_id, id) unique), and the rows a new foreign key checks are first made consistent with the rows
-- they reference. Rebuilding the keys' indexes is O(rows) and holds each table's lock until commit.

-- 1. The LLM ledger: every writer names the user, but the column was nullable. A row without one takes
-- its memory's user (from the attempt, the memory, the archive row or the audit log); a row no user can
-- be found for goes under the empty user id, which no user has (user ids are never empty).
UPDATE llm_usage u
   SET user_id = coalesce(
       (SELECT a.user_id FROM archival_attempts a WHERE a.memory_id = u.memory_id LIMIT 1),
       (SELECT m.user_id FROM memories m WHERE m.id = u.memory_id),
       (SELECT r.user_id FROM archived_memories r WHERE r.original_id = u.memory_id),
       (SELECT e.user_id FROM memory_events e WHERE e.memory_id = u.memory_id LIMIT 1),
       '')
 WHERE u.user_id IS NULL;
ALTER TABLE llm_usage ALTER COLUMN user_id SET NOT NULL,
    DROP CONSTRAINT llm_usage_pkey, ADD CONSTRAINT llm_usage_pkey PRIMARY KEY (id, user_id);
-- A batch result is still recorded once: request_id (provider batch id : memory id) names one user's memory.
DROP INDEX llm_usage_batch_result;
CREATE UNIQUE INDEX llm_usage_batch_result ON llm_usage (request_id, user_id) WHERE mode = 'batch';

-- 2. Hot memories: (id, user_id). memory_retention's foreign key points at the unique (user_id, id) that
-- incremental retention added; it moves to the new primary key, which makes that constraint redundant.
ALTER TABLE memory_retention DROP CONSTRAINT memory_retention_memory_fkey;
ALTER TABLE memories DROP CONSTRAINT memories_user_id_id_key,
    DROP CONSTRAINT memories_pkey, ADD CONSTRAINT memories_pkey PRIMARY KEY (id, user_id);
ALTER TABLE memory_retention ADD CONSTRAINT memory_retention_memory_fkey
    FOREIGN KEY (user_id, memory_id) REFERENCES memories (user_id, id) ON DELETE CASCADE;

-- 3. Archive rows: (id, user_id) and one archive row per (original_id, user_id). A link use goes with its
-- archive row through (user_id, archive_id); a use recorded under another user than its archive row's
-- (none is written so) takes the archive row's user first, or the new key would refuse it.
ALTER TABLE archive_link_uses DROP CONSTRAINT archive_link_uses_archive_id_fkey;
UPDATE archive_link_uses u SET user_id = r.user_id
  FROM archived_memories r WHERE r.id = u.archive_id AND u.user_id <> r.user_id;
ALTER TABLE archived_memories DROP CONSTRAINT archived_memories_original_id_key,
    ADD CONSTRAINT archived_memories_original_id_key UNIQUE (original_id, user_id),
    DROP CONSTRAINT archived_memories_pkey, ADD CONSTRAINT archived_memories_pkey PRIMARY KEY (id, user_id);
ALTER TABLE archive_link_uses
    DROP CONSTRAINT archive_link_uses_pkey, ADD CONSTRAINT archive_link_uses_pkey PRIMARY KEY (id, user_id),
    ADD CONSTRAINT archive_link_uses_archive_id_fkey
        FOREIGN KEY (user_id, archive_id) REFERENCES archived_memories (user_id, id) ON DELETE CASCADE;

-- 4. Archival checkpoints. The foreign key to archival_batches stays: batches are a reference table.
ALTER TABLE archival_attempts
    DROP CONSTRAINT archival_attempts_pkey,
    ADD CONSTRAINT archival_attempts_pkey PRIMARY KEY (batch_key, memory_id, user_id);
DROP INDEX archival_attempts_one_open;
CREATE UNIQUE INDEX archival_attempts_one_open ON archival_attempts (memory_id, user_id)
    WHERE status NOT IN ('archived', 'released');

-- 5. The per-user tables keyed by a generated id alone.
ALTER TABLE memory_events
    DROP CONSTRAINT memory_events_pkey, ADD CONSTRAINT memory_events_pkey PRIMARY KEY (id, user_id);
ALTER TABLE forget_requests
    DROP CONSTRAINT forget_requests_pkey, ADD CONSTRAINT forget_requests_pkey PRIMARY KEY (id, user_id);
ALTER TABLE memory_digests
    DROP CONSTRAINT memory_digests_pkey, ADD CONSTRAINT memory_digests_pkey PRIMARY KEY (id, user_id);
ALTER TABLE memory_facts
    DROP CONSTRAINT memory_facts_pkey, ADD CONSTRAINT memory_facts_pkey PRIMARY KEY (id, user_id);
ALTER TABLE key_moments
    DROP CONSTRAINT key_moments_pkey, ADD CONSTRAINT key_moments_pkey PRIMARY KEY (id, user_id);
