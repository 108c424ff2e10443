-- Forget (right to erasure) and the memory API's audit events.
--
-- forget_requests is the erasure log: a request is recorded first (with the manifest of memory ids and
-- backup object keys it covers), then objects are deleted (every version), then rows, then it is marked
-- done; a re-run resumes an unfinished request. It holds ids and keys only, never content.
CREATE TABLE forget_requests (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id                 text NOT NULL CHECK (user_id <> ''),
    memory_id               uuid,  -- NULL: every memory of the user (forget_user)
    actor                   text NOT NULL CHECK (actor <> ''),
    status                  text NOT NULL DEFAULT 'pending'
                            CHECK (status IN ('pending', 'objects_deleted', 'rows_deleted', 'done')),
    memory_ids              uuid[] NOT NULL DEFAULT '{}',
    object_keys             text[] NOT NULL DEFAULT '{}',
    object_versions_deleted integer NOT NULL DEFAULT 0,
    rows_deleted            jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(rows_deleted) = 'object'),
    requested_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at            timestamptz,
    CHECK ((status = 'done') = (completed_at IS NOT NULL))
);
-- One unfinished request per user and scope: a second call resumes it.
CREATE UNIQUE INDEX forget_requests_one_open ON forget_requests
    (user_id, coalesce(memory_id, '00000000-0000-0000-0000-000000000000'::uuid)) WHERE status <> 'done';
CREATE INDEX forget_requests_user ON forget_requests (user_id, requested_at);

-- Two audit events: 'forgotten' (the tombstone: ids, sha256, time, actor, no content) and 'redacted'
-- (the audit of a redaction of the memory's earlier events).
ALTER TABLE memory_events DROP CONSTRAINT memory_events_event_type_check;
ALTER TABLE memory_events ADD CONSTRAINT memory_events_event_type_check CHECK (event_type IN
    ('created', 'updated', 'archived', 'restored', 'expanded', 'promoted', 'deleted', 'superseded',
     'stubbed', 'unstubbed', 'forgotten', 'redacted'));

-- What a redacted event keeps of its details: identifiers and digests only. Everything else (the
-- words a supersede removed or added, reasons, categories) is dropped.
CREATE FUNCTION memory_events_redacted(details jsonb, request uuid) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(key, value) FILTER (WHERE key IN
               ('archive_id', 'storage_ref', 'sha256', 'batch_key', 'superseded_by', 'supersedes')), '{}'::jsonb)
           || jsonb_build_object('redacted', request::text)
    FROM jsonb_each(details)
$$;

-- The audit log stays append-only: DELETE and TRUNCATE are always refused, and UPDATE is refused
-- except for exactly one change, made through redact_memory_events below: the details replaced by
-- memory_events_redacted(details, <the request named in the transaction-local setting>), every other
-- column unchanged. Setting the GUC by hand therefore allows nothing but that redaction.
CREATE OR REPLACE FUNCTION memory_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    request text := nullif(current_setting('memory_archive.redacting', true), '');
BEGIN
    IF TG_OP = 'UPDATE' AND request IS NOT NULL
       AND NEW.id = OLD.id AND NEW.memory_id = OLD.memory_id AND NEW.user_id = OLD.user_id
       AND NEW.event_type = OLD.event_type AND NEW.actor = OLD.actor AND NEW.occurred_at = OLD.occurred_at
       AND NOT OLD.details ? 'redacted'
       AND NEW.details = memory_events_redacted(OLD.details, request::uuid) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'memory_events is append-only: % is not allowed', TG_OP;
END $$;

-- The one controlled path that redacts: the content of a user's events (all of them, or those of
-- p_memory_ids) is dropped, and one 'redacted' event per memory records who did it and for which
-- request. SECURITY DEFINER: an application role needs EXECUTE on this, not UPDATE on memory_events.
CREATE FUNCTION redact_memory_events(p_request uuid, p_user_id text, p_memory_ids uuid[], p_actor text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n integer;
BEGIN
    PERFORM set_config('memory_archive.redacting', p_request::text, true);
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
    PERFORM set_config('memory_archive.redacting', '', true);
    RETURN n;
END $$;

-- list(): keyset pages over (created_at, id) per user in both tiers. These serve every range of
-- (user_id, created_at) the two-column indexes of 001 served (month-scoped phase 2 included), so those
-- go: one index per tier, not two (each costs bytes on every row).
CREATE INDEX memories_user_created_id ON memories (user_id, created_at DESC, id DESC);
CREATE INDEX archived_user_created_id ON archived_memories (user_id, original_created_at DESC, original_id DESC);
DROP INDEX memories_user_created;
DROP INDEX archived_user_created;
