-- The Slow Path's operator switch and its history.
-- After a failed gate (error rate or backup fidelity) archival pauses: nightly runs claim and archive
-- nothing until an operator clears the pause. One row holds the current state; every change is also
-- appended to archival_pause_events, and every night that ran while paused to archival_skipped_nights.

CREATE TABLE archival_pause (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    paused     boolean NOT NULL DEFAULT false,
    reason     text,
    actor      text,
    batch_key  text,
    details    jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(details) = 'object'),
    changed_at timestamptz NOT NULL DEFAULT now(),
    CHECK (NOT paused OR (reason IS NOT NULL AND actor IS NOT NULL))
);
INSERT INTO archival_pause (singleton, paused) VALUES (true, false);

CREATE TABLE archival_pause_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text NOT NULL CHECK (action IN ('paused', 'cleared')),
    reason      text NOT NULL CHECK (reason <> ''),
    actor       text NOT NULL CHECK (actor <> ''),
    batch_key   text,
    details     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(details) = 'object'),
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE archival_skipped_nights (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    batch_key      text NOT NULL,
    step           text NOT NULL,
    reason         text NOT NULL,
    pause_event_id bigint REFERENCES archival_pause_events (id),
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX archival_skipped_nights_batch ON archival_skipped_nights (batch_key, recorded_at);

CREATE FUNCTION slow_path_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP;
END $$;
CREATE TRIGGER archival_pause_events_no_update BEFORE UPDATE OR DELETE ON archival_pause_events
    FOR EACH ROW EXECUTE FUNCTION slow_path_append_only();
CREATE TRIGGER archival_pause_events_no_truncate BEFORE TRUNCATE ON archival_pause_events
    FOR EACH STATEMENT EXECUTE FUNCTION slow_path_append_only();
CREATE TRIGGER archival_skipped_nights_no_update BEFORE UPDATE OR DELETE ON archival_skipped_nights
    FOR EACH ROW EXECUTE FUNCTION slow_path_append_only();

-- The fidelity check and rollback look attempts up by their backup object.
CREATE INDEX archival_attempts_backup_key ON archival_attempts (backup_key) WHERE backup_key IS NOT NULL;
