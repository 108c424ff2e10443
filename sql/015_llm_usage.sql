-- LLM cost from real usage.
--
-- llm_usage: the ledger, one row per provider answer that was paid for (summaries that failed
-- validation included: they were billed too). Separate from archival_attempts, whose rows may be
-- pruned after commit. Tokens are the provider's `usage`, normalized (memory_lib.core.pricing): the four
-- counts are disjoint. cost_usd is priced when recorded from the price table then configured; priced
-- is false when the model had no price (cost unknown, recorded as 0).
CREATE TABLE llm_usage (
    id                          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recorded_at                 timestamptz NOT NULL DEFAULT now(),
    batch_key                   text,
    memory_id                   uuid,
    user_id                     text,
    purpose                     text NOT NULL DEFAULT 'summary',
    provider                    text NOT NULL,
    model                       text NOT NULL,
    mode                        text NOT NULL CHECK (mode IN ('sync', 'batch')),
    request_id                  text,
    outcome                     text NOT NULL CHECK (outcome IN ('ok', 'failed')),
    input_tokens                integer NOT NULL CHECK (input_tokens >= 0),
    output_tokens               integer NOT NULL CHECK (output_tokens >= 0),
    cache_creation_input_tokens integer NOT NULL DEFAULT 0 CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     integer NOT NULL DEFAULT 0 CHECK (cache_read_input_tokens >= 0),
    cost_usd                    numeric(16, 9) NOT NULL CHECK (cost_usd >= 0),
    priced                      boolean NOT NULL
);
CREATE INDEX llm_usage_batch ON llm_usage (batch_key, model);
CREATE INDEX llm_usage_memory ON llm_usage (memory_id);
-- A batch result is recorded once (request_id = provider batch id : memory id), even when a crash
-- makes the next run collect the same results again.
CREATE UNIQUE INDEX llm_usage_batch_result ON llm_usage (request_id) WHERE mode = 'batch';

-- What the model said besides the summary: typed entities and a domain guess (key_entities keeps
-- the names, as before).
ALTER TABLE archival_attempts ADD COLUMN summary_entities jsonb, ADD COLUMN domain_guess text;

-- Provider batches (Anthropic Message Batches, OpenAI Batch API) of one archival batch.
-- A row is written, with its deterministic submission key, BEFORE the provider is asked to create the
-- batch: after a crash between the two, the next run finds the row without a provider id and looks
-- the provider's recent batches up by that key (batch metadata) before it would submit again.
CREATE TABLE llm_batches (
    submission_key    text PRIMARY KEY,
    batch_key         text NOT NULL REFERENCES archival_batches (batch_key),
    provider          text NOT NULL,
    model             text NOT NULL,
    memory_ids        uuid[] NOT NULL,
    provider_batch_id text UNIQUE,
    status            text NOT NULL DEFAULT 'submitting'
                      CHECK (status IN ('submitting', 'submitted', 'ended', 'collected', 'expired', 'canceled',
                                        'failed')),
    request_counts    jsonb,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    ended_at          timestamptz,
    collected_at      timestamptz
);
CREATE INDEX llm_batches_open ON llm_batches (batch_key) WHERE status IN ('submitting', 'submitted', 'ended');
-- The provider batch a claimed memory waits in (its submission key); cleared when its result is read.
ALTER TABLE archival_attempts ADD COLUMN llm_submission text;
