-- Archived summaries keep one bit per embedding dimension (pgvector binary_quantize: the sign), searched
-- by Hamming distance over an HNSW index: 1/16 of the halfvec's bytes, and a much smaller index. Ranking
-- estimates the cosine from the Hamming distance (memory_lib.retrieval.sql); the exact float32 embedding of
-- the original stays in its backup object. `bench footprint` measures bytes and LoCoMo recall of this
-- and the alternatives (halfvec, int8 re-ranking, truncated vectors) side by side.
--
-- summary_embedding stays as the write interface: writers still insert the halfvec summary embedding,
-- and a trigger stores its bits and clears it, so no row keeps the halfvec at rest.
ALTER TABLE archived_memories ADD COLUMN summary_bits bit({{EMBEDDING_DIM}}),
                              ALTER COLUMN summary_embedding DROP NOT NULL;
UPDATE archived_memories
   SET summary_bits = binary_quantize(summary_embedding)::bit({{EMBEDDING_DIM}}), summary_embedding = NULL;
ALTER TABLE archived_memories ALTER COLUMN summary_bits SET NOT NULL,
                              ADD CONSTRAINT archived_summary_embedding_not_kept CHECK (summary_embedding IS NULL);

CREATE FUNCTION archived_memories_quantize() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.summary_embedding IS NOT NULL THEN
        NEW.summary_bits := binary_quantize(NEW.summary_embedding)::bit({{EMBEDDING_DIM}});
        NEW.summary_embedding := NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER archived_memories_quantize BEFORE INSERT OR UPDATE OF summary_embedding ON archived_memories
    FOR EACH ROW EXECUTE FUNCTION archived_memories_quantize();

DROP INDEX archived_summary_hnsw;
CREATE INDEX archived_summary_bits_hnsw ON archived_memories
    USING hnsw (summary_bits bit_hamming_ops) WITH (m = 16, ef_construction = 64);

-- The summary's tsvector is computed, not stored (~150 bytes a row): the GIN index is on the expression,
-- which search uses verbatim; summaries are short, so ranking the few matches recomputes it cheaply.
ALTER TABLE archived_memories DROP COLUMN summary_tsv;
CREATE INDEX archived_summary_tsv ON archived_memories USING gin (to_tsvector('english', summary));
