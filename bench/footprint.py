"""footprint: Postgres bytes per hot memory vs per archived memory (heap, TOAST, indexes), the saving, for
1536-d and 384-d embeddings; object-store bytes per memory.

The same memories are measured hot, then archived by memory_lib.pipeline.run_batch (offline
summarizer, hashing embedder, local object store). Both tables are rewritten with VACUUM FULL before
measuring, so neither carries load-order bloat. Vectors use pgvector's 'external' storage (never
compressed), so the figures do not depend on the vectors' values.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .archival import load_backlog, run_batched
from .common import (
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    ratio,
    scratch_dir,
)

NAME = "footprint"
DEFAULT_SIZES = (2000,)
SMOKE_SIZES = (150,)
DIMS = (1536, 384)


def relation_bytes(conn: psycopg.Connection, table: str) -> dict[str, int]:
    """heap (main fork + FSM/VM), TOAST (table + its index), indexes, and total, in bytes."""
    row = conn.execute(
        """SELECT pg_table_size(c.oid) - coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS heap,
                  coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS toast,
                  pg_indexes_size(c.oid) AS indexes,
                  pg_total_relation_size(c.oid) AS total
           FROM pg_class c WHERE c.oid = %s::regclass""",
        (table,),
    ).fetchone()
    return dict(row)


def index_bytes(conn: psycopg.Connection, table: str) -> dict[str, int]:
    rows = conn.execute(
        """SELECT i.indexrelid::regclass::text AS name, pg_relation_size(i.indexrelid) AS bytes
           FROM pg_index i WHERE i.indrelid = %s::regclass ORDER BY 2 DESC""",
        (table,),
    ).fetchall()
    return {r["name"]: r["bytes"] for r in rows}


def _per(b: dict[str, int], n: int) -> dict[str, float]:
    return {k: v / n for k, v in b.items()}


def measure_dim(server: Any, root: Any, dim: int, n: int) -> dict[str, Any]:
    from memory_lib.objectstore import LocalObjectStore

    name = f"fp_{dim}_{n}"
    url = server.create(name, dim)
    try:
        with bench_connect(url) as conn:
            load_backlog(conn, n, dim=dim)
            # What insert_memories writes alongside each memory: its 'created' audit event.
            conn.execute(
                """INSERT INTO memory_events (memory_id, user_id, event_type, actor, details)
                   SELECT id, user_id, 'created', 'bench', jsonb_build_object('category', category) FROM memories"""
            )
            conn.execute("VACUUM FULL ANALYZE memories")
            hot = relation_bytes(conn, "memories")
            hot_idx = index_bytes(conn, "memories")
            events_hot = relation_bytes(conn, "memory_events")
            store = LocalObjectStore(root / f"objects-{dim}", "bench")
            res = run_batched(conn, store, key=name, dim=dim)
            n_arch = conn.execute("SELECT count(*) AS n FROM archived_memories").fetchone()["n"]
            if n_arch != n or res["archived"] != n:
                raise AssertionError(f"expected {n} archived, got {n_arch}")
            conn.execute("VACUUM FULL ANALYZE archived_memories")
            conn.execute("VACUUM FULL ANALYZE archival_attempts")
            conn.execute("VACUUM FULL ANALYZE memory_events")
            arch = relation_bytes(conn, "archived_memories")
            arch_idx = index_bytes(conn, "archived_memories")
            attempts = relation_bytes(conn, "archival_attempts")
            events_all = relation_bytes(conn, "memory_events")
            backup = conn.execute(
                "SELECT sum(backup_size_bytes) AS total, avg(backup_size_bytes) AS mean FROM archived_memories"
            ).fetchone()
            files = [p for p in (root / f"objects-{dim}").rglob("*.json")]
            on_disk = sum(p.stat().st_size for p in files)
    finally:
        server.drop(name)
    return {
        "dim": dim, "n": n,
        "hot": _per(hot, n), "hot_indexes": _per(hot_idx, n),
        "archived": _per(arch, n), "archived_indexes": _per(arch_idx, n),
        "archival_attempts": _per(attempts, n),
        "memory_events_before": _per(events_hot, n), "memory_events_after": _per(events_all, n),
        "object_store": {"backup_bytes_per_memory": float(backup["mean"]), "objects": len(files),
                         "files_bytes_per_memory": on_disk / max(len(files), 1)},
        "saving_pct": 100 * (1 - arch["total"] / hot["total"]),
        "saving_pct_with_attempts": 100 * (1 - (arch["total"] + attempts["total"]) / hot["total"]),
    }  # fmt: skip


def run(opts: Options) -> Report:
    sizes = opts.sizes_or(DEFAULT_SIZES, SMOKE_SIZES)
    report = Report(NAME, {"sizes": sizes, "dims": list(DIMS)})
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-fp-") as root:
        report.machine = server.machine_info()
        for n in sizes:
            results = [measure_dim(server, root, dim, n) for dim in DIMS]
            rows = []
            for r in results:
                h, a, t = r["hot"], r["archived"], r["archival_attempts"]
                rows.append([r["dim"], "hot memory (baseline)", h["heap"], h["toast"], h["indexes"], h["total"], 0.0])
                rows.append([r["dim"], "archived memory", a["heap"], a["toast"], a["indexes"], a["total"],
                             r["saving_pct"]])  # fmt: skip
                rows.append([r["dim"], "+ its archival_attempts row (kept)", t["heap"], t["toast"], t["indexes"],
                             a["total"] + t["total"], r["saving_pct_with_attempts"]])  # fmt: skip
            report.tables.append(Table(
                f"Postgres bytes per memory, {n:,} memories measured hot then archived",
                ["dim", "row", "heap", "TOAST", "indexes", "total", "saving vs hot %"],
                rows,
                "Baseline: the same memories while hot (memories: row, vector in TOAST, HNSW + btree + GIN indexes). "
                "Archived = archived_memories (summary, halfvec summary embedding, its HNSW). Saving = 1 - archived / "
                "hot. The third row adds the archival_attempts checkpoint row each archived memory leaves behind "
                "(its summary and embedding are cleared once the archive row holds them).",
            ))  # fmt: skip
            idx_rows = []
            for r in results:
                for name, b in r["hot_indexes"].items():
                    idx_rows.append([r["dim"], "memories", name, b])
                for name, b in r["archived_indexes"].items():
                    idx_rows.append([r["dim"], "archived_memories", name, b])
            report.tables.append(Table(
                "Index bytes per memory", ["dim", "table", "index", "bytes/memory"], idx_rows,
            ))  # fmt: skip
            obj_rows = []
            for r in results:
                o = r["object_store"]
                ev_b, ev_a = r["memory_events_before"]["total"], r["memory_events_after"]["total"]
                obj_rows.append([r["dim"], o["backup_bytes_per_memory"], o["files_bytes_per_memory"],
                                 ratio(o["backup_bytes_per_memory"], r["hot"]["total"]), ev_b, ev_a])  # fmt: skip
            report.tables.append(Table(
                "Object storage and audit log per memory",
                ["dim", "backup object bytes", "bytes on disk (local store)", "backup / hot Postgres bytes",
                 "memory_events bytes (hot)", "memory_events bytes (after archiving)"],
                obj_rows,
                "Backup objects are the canonical JSON of the original (content, float32 embedding as shortest "
                "decimals, metadata); memory_events grows by one 'archived' event per memory.",
            ))  # fmt: skip
            report.figures[str(n)] = results
    return report
