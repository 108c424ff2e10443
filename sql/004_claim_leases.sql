-- Liveness of archival claims: no memory stays claimed forever.
-- A batch holds its open attempts under a lease that every step renews. Once the batch is finished
-- (its commit step ran) or its lease expired (the run died), a later batch takes its open attempts
-- over, keeping their checkpoints (summary, embedding, backup), so nothing is paid for twice and
-- nothing stays claimed by a dead run.
ALTER TABLE archival_batches
    ADD COLUMN lease_owner      text,
    ADD COLUMN lease_host       text,
    ADD COLUMN lease_pid        integer,
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN finished_at      timestamptz;

-- Where a taken-over attempt came from, and when it was released for good (max_attempts reached).
ALTER TABLE archival_attempts
    ADD COLUMN taken_over_from text,
    ADD COLUMN released_at     timestamptz;

CREATE INDEX archival_batches_unfinished ON archival_batches (lease_expires_at) WHERE finished_at IS NULL;
CREATE INDEX archival_attempts_released ON archival_attempts (memory_id) WHERE status = 'released';
