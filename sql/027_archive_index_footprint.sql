-- Smaller archive indexes (per archived memory at 384-d, 20,000 memories; docs/performance.md):
--
-- 1. The full-text GIN index without its pending list (fastupdate = off). With it, a night's inserts leave
--    the index at 150-208 bytes a row, pages a plain VACUUM empties but keeps; without it, ~54. Archive
--    rows are written once, by the nightly batch, so the slower insert (60-80 µs a row) is paid there.
-- 2. The HNSW graphs over the summary bits with m = 12 instead of 16: 297 bytes a row instead of 344,
--    with no loss of graph recall@10 on 100k summaries (0.983 against 0.973 for m = 16).
--
-- Index options cannot be changed in place on every layout (ALTER INDEX ... SET is refused on a
-- partitioned table's index and rebuilds nothing), so each index is dropped and built again under its
-- name, from its own definition: on one node, on a table hash-partitioned by user (each partition's index
-- then renamed `<name>_p000` ..., as memory_lib.storage.partitioning names them), and on Citus, which
-- sends DROP and CREATE INDEX to every shard. The bits index is found by its method, not its name: a
-- re-embedding names the index it builds after its migration (archived_memories_summary_bits_m1_hnsw),
-- and one in progress has a second such index on its secondary column.
--
-- Cost: both indexes are rebuilt, under the archive table's exclusive lock until commit (searches of the
-- archive wait). Measured on 2 cores: 1.1 s for 20,000 archive rows at 384-d (~6 s per 100k); an HNSW
-- build over 100k random bit vectors, the hard case, took 18 s. A graph larger than
-- maintenance_work_mem builds much more slowly: raise it for the migrating role on a large archive.

DROP INDEX archived_user_lexemes;
CREATE INDEX archived_user_lexemes ON archived_memories
    USING gin (user_id, (to_tsvector('english'::regconfig, summary) || coalesce(lexemes, ''::tsvector)))
    WITH (fastupdate = off);

DO $$
DECLARE
    ix record;
BEGIN
    FOR ix IN
        SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_am am ON am.oid = c.relam
        WHERE i.indrelid = 'archived_memories'::regclass AND am.amname = 'hnsw'
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP INDEX %I', ix.relname);
        -- A partitioned table's index reads "ON ONLY": built here on the table, so on every partition.
        EXECUTE regexp_replace(replace(ix.def, ' ON ONLY ', ' ON '), ' WITH \([^)]*\)$', '')
            || ' WITH (m = 12, ef_construction = 64)';
    END LOOP;
END $$;

-- On a partitioned table the partitions' indexes were named by the server: name them after the table's.
DO $$
DECLARE
    ix record;
BEGIN
    FOR ix IN
        SELECT child.relname AS child, parent.relname || substring(t.relname FROM '_p[0-9]{3}$') AS name
        FROM pg_index pi
        JOIN pg_class parent ON parent.oid = pi.indexrelid
        JOIN pg_inherits h ON h.inhparent = pi.indexrelid
        JOIN pg_class child ON child.oid = h.inhrelid
        JOIN pg_index ci ON ci.indexrelid = child.oid
        JOIN pg_class t ON t.oid = ci.indrelid
        WHERE pi.indrelid = 'archived_memories'::regclass
          AND t.relname ~ '_p[0-9]{3}$'
          AND child.relname <> parent.relname || substring(t.relname FROM '_p[0-9]{3}$')
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.child, ix.name);
    END LOOP;
END $$;
