"""footprint: Postgres bytes per hot memory vs per archived memory (heap, TOAST, indexes), the saving, for
1536-d and 384-d embeddings; object-store bytes per memory; and the ways to store a summary's vector
side by side: bytes per archived memory vs LoCoMo tiered recall@10.

The same memories are measured hot, then archived by memory_lib.archival.pipeline.run_batch (offline
summarizer, hashing embedder, local object store). Each tier is measured twice: as the product's writes
leave it (the hot HNSW index takes every row through its insert path, as `add` does; the archive's indexes
take the night's inserts; then a plain VACUUM, as autovacuum runs it), which is what a user's table
holds; and compacted by VACUUM FULL, which rebuilds every index (btrees and GIN come out much smaller; the
HNSW graphs do not). Vectors use pgvector's 'external' storage (never compressed), so the figures do not
depend on the vectors' values. pgvector's HNSW stores identical vectors once (an element keeps up to 10
heap tids), so the run reports how many distinct summary vectors the archive holds.

Representations (bench.representations): each variant's columns and index are added to the archived
table, filled, measured after VACUUM FULL and removed again; "no vector" is measured last by dropping
the bit column. Recall: LoCoMo (bench locomo's data and archival, all-MiniLM-L6-v2, 384-d, default
RetrievalConfig, phase 2 auto), every variant answering the same questions on the same tiered
database; the summary vectors are the embedder's vectors of the stored summaries.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from memory_lib.llm.embedding import HashingEmbedder
from testing.rows import one

from .archival import load_backlog, run_batched
from .common import (
    LOCOMO_DEFAULT,
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    local_embedder,
    local_embedder_available,
    percentiles_ms,
    ratio,
    scratch_dir,
)
from .representations import Representation, int8_codes, variants

NAME = "footprint"
# Two sizes: every index has pages of its own (a metapage, a root, GIN's pending list) that a small table
# pays per row; the growth table gives what each further memory costs.
DEFAULT_SIZES = (2000, 20000)
SMOKE_SIZES = (150,)
DIMS = (1536, 384)


def relation_bytes(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """heap (main fork + FSM/VM), TOAST (table + its index), indexes, and total, in bytes."""
    row = conn.execute(
        """SELECT pg_table_size(c.oid) - coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS heap,
                  coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS toast,
                  pg_indexes_size(c.oid) AS indexes,
                  pg_total_relation_size(c.oid) AS total
           FROM pg_class c WHERE c.oid = %s::regclass""",
        (table,),
    ).fetchone()
    assert row is not None
    return dict(row)


def index_bytes(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    rows = conn.execute(
        """SELECT i.indexrelid::regclass::text AS name, pg_relation_size(i.indexrelid) AS bytes
           FROM pg_index i WHERE i.indrelid = %s::regclass ORDER BY 2 DESC""",
        (table,),
    ).fetchall()
    return {r["name"]: r["bytes"] for r in rows}


def _per(b: dict[str, int], n: int) -> dict[str, float]:
    return {k: v / n for k, v in b.items()}


def measure_dim(server: Any, root: Any, dim: int, n: int) -> dict[str, Any]:
    from memory_lib.storage.objectstore import LocalObjectStore

    name = f"fp_{dim}_{n}"
    url = server.create(name, dim)
    try:
        with bench_connect(url) as conn:
            load_backlog(conn, n, dim=dim, index_inserts=True)
            # What insert_memories writes alongside each memory: its 'created' audit event.
            conn.execute(
                """INSERT INTO memory_events (memory_id, user_id, event_type, actor, details)
                   SELECT id, user_id, 'created', 'bench', jsonb_build_object('category', category) FROM memories"""
            )
            conn.execute("VACUUM ANALYZE memories")
            hot_written, hot_idx_written = relation_bytes(conn, "memories"), index_bytes(conn, "memories")
            conn.execute("VACUUM FULL ANALYZE memories")
            hot = relation_bytes(conn, "memories")
            hot_idx = index_bytes(conn, "memories")
            events_hot = relation_bytes(conn, "memory_events")
            store = LocalObjectStore(root / f"objects-{dim}", "bench")
            res = run_batched(conn, store, key=name, dim=dim)
            n_arch = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
            if n_arch != n or res["archived"] != n:
                raise AssertionError(f"expected {n} archived, got {n_arch}")
            conn.execute("VACUUM ANALYZE archived_memories")
            conn.execute("VACUUM ANALYZE backup_objects")
            arch_written, arch_idx_written = (
                relation_bytes(conn, "archived_memories"),
                index_bytes(conn, "archived_memories"),
            )
            objects_written = relation_bytes(conn, "backup_objects")
            distinct_bits = one(
                conn.execute("SELECT count(DISTINCT summary_bits) AS n FROM archived_memories")
            )["n"]
            conn.execute("VACUUM FULL ANALYZE archived_memories")
            conn.execute("VACUUM FULL ANALYZE archival_attempts")
            conn.execute("VACUUM FULL ANALYZE memory_events")
            conn.execute("VACUUM FULL ANALYZE backup_objects")
            arch = relation_bytes(conn, "archived_memories")
            objects = relation_bytes(conn, "backup_objects")  # one row per backup object: its ref
            arch_idx = index_bytes(conn, "archived_memories")
            attempts = relation_bytes(conn, "archival_attempts")
            events_all = relation_bytes(conn, "memory_events")
            backup = conn.execute(
                "SELECT sum(backup_size_bytes) AS total, avg(backup_size_bytes) AS mean FROM archived_memories"
            ).fetchone()
            assert backup is not None
            # objects the rows point to: lone backups and packs (memory_lib.storage.packs)
            recorded = one(
                conn.execute("SELECT count(DISTINCT (user_id, backup_object)) AS n FROM archived_memories")
            )["n"]
            files = [p for p in (root / f"objects-{dim}").rglob("*") if p.suffix in (".json", ".jsonl")]
            on_disk = sum(p.stat().st_size for p in files)
            reps = representation_bytes(
                conn, dim, n, objects["total"] / n
            )  # last: it rewrites archived_memories
    finally:
        server.drop(name)
    return {
        "dim": dim,
        "n": n,
        "hot": _per(hot, n),
        "hot_indexes": _per(hot_idx, n),
        "archived": _per(arch, n),
        "archived_indexes": _per(arch_idx, n),
        "backup_objects": _per(objects, n),
        # What an archived memory costs in all: its row and indexes, and its share of backup_objects.
        "archived_total": (arch["total"] + objects["total"]) / n,
        "archival_attempts": _per(attempts, n),
        "memory_events_before": _per(events_hot, n),
        "memory_events_after": _per(events_all, n),
        "object_store": {
            "backup_bytes_per_memory": float(backup["mean"]),
            "objects": len(files),
            "objects_recorded": recorded,
            "files_bytes_per_memory": on_disk / n,
        },
        "saving_pct": 100 * (1 - (arch["total"] + objects["total"]) / hot["total"]),
        # The same as the product's writes leave both tiers (before VACUUM FULL).
        "written": {
            "hot": _per(hot_written, n),
            "hot_indexes": _per(hot_idx_written, n),
            "archived": _per(arch_written, n),
            "archived_indexes": _per(arch_idx_written, n),
            "backup_objects": _per(objects_written, n),
            "archived_total": (arch_written["total"] + objects_written["total"]) / n,
        },
        "distinct_summary_bits": distinct_bits,
        "saving_pct_with_attempts": 100
        * (1 - (arch["total"] + objects["total"] + attempts["total"]) / hot["total"]),
        "representations": reps,
    }


def run(opts: Options) -> Report:
    sizes = opts.sizes_or(DEFAULT_SIZES, SMOKE_SIZES)
    report = Report(NAME, {"sizes": sizes, "dims": list(DIMS)})
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-fp-") as root:
        report.machine = server.machine_info()
        for n in sizes:
            results = [measure_dim(server, root, dim, n) for dim in DIMS]
            rows = []
            for r in results:
                h, a, o, t = r["hot"], r["archived"], r["backup_objects"], r["archival_attempts"]
                rows.append(
                    [r["dim"], "hot memory (baseline)", h["heap"], h["toast"], h["indexes"], h["total"], 0.0]
                )
                rows.append(
                    [
                        r["dim"],
                        "archived memory (archived_memories + backup_objects)",
                        a["heap"] + o["heap"],
                        a["toast"] + o["toast"],
                        a["indexes"] + o["indexes"],
                        r["archived_total"],
                        r["saving_pct"],
                    ]
                )
                rows.append(
                    [
                        r["dim"],
                        "+ archival_attempts rows left (pruned after the audit)",
                        t["heap"],
                        t["toast"],
                        t["indexes"],
                        r["archived_total"] + t["total"],
                        r["saving_pct_with_attempts"],
                    ]
                )
            report.tables.append(
                Table(
                    f"Postgres bytes per memory, {n:,} memories measured hot then archived",
                    ["dim", "row", "heap", "TOAST", "indexes", "total", "saving vs hot %"],
                    rows,
                    "Baseline: the same memories while hot (memories: row, vector in TOAST, HNSW + btree + GIN indexes). "
                    "Archived = archived_memories (summary, bit summary vector, its HNSW) and its share of "
                    "backup_objects (one row per backup object, a pack's ref stored once). Saving = 1 - archived / "
                    "hot. The third row adds what archival_attempts keeps per archived memory after the run: its "
                    "checkpoint rows are pruned once the night's tier audit passes (migration 010), so what is left "
                    "is the empty table and its indexes.",
                )
            )
            report.tables.append(_written_table(results, n))
            idx_rows = []
            for r in results:
                w = r["written"]
                for name, b in r["hot_indexes"].items():
                    idx_rows.append([r["dim"], "memories", name, w["hot_indexes"].get(name), b])
                for name, b in r["archived_indexes"].items():
                    idx_rows.append([r["dim"], "archived_memories", name, w["archived_indexes"].get(name), b])
            report.tables.append(
                Table(
                    "Index bytes per memory",
                    ["dim", "table", "index", "as written", "compacted"],
                    idx_rows,
                    "As written: after the inserts and a plain VACUUM; compacted: after VACUUM FULL, which "
                    "rebuilds the index.",
                )
            )
            obj_rows = []
            for r in results:
                o = r["object_store"]
                ev_b, ev_a = r["memory_events_before"]["total"], r["memory_events_after"]["total"]
                obj_rows.append(
                    [
                        r["dim"],
                        o["backup_bytes_per_memory"],
                        o["files_bytes_per_memory"],
                        ratio(o["backup_bytes_per_memory"], r["hot"]["total"]),
                        ev_b,
                        ev_a,
                    ]
                )
            report.tables.append(
                Table(
                    "Object storage and audit log per memory",
                    [
                        "dim",
                        "backup object bytes",
                        "bytes on disk (local store)",
                        "backup / hot Postgres bytes",
                        "memory_events bytes (hot)",
                        "memory_events bytes (after archiving)",
                    ],
                    obj_rows,
                    "Backup documents are the canonical JSON of the original (content, float32 embedding as shortest "
                    "decimals, metadata); a user's memories of one night share one JSON Lines object (a pack, from "
                    "archival.pack_min_members on), one newline each; memory_events grows by one 'archived' event "
                    "per memory.",
                )
            )
            report.figures[str(n)] = results
        if len(sizes) > 1:
            _growth_table(report, sizes)
        recall = locomo_recall(server, root, opts)
    report.figures["locomo"] = recall
    last = report.figures[str(sizes[-1])]
    _representation_table(report, last, recall)
    default = variants(DIMS[0])[1].key
    # Stable keys: the default representation's archived bytes / hot bytes per dim, with and without
    # what archival_attempts keeps per archived memory (its rows are pruned after the audit).
    report.figures["archived_vs_hot"] = {
        str(r["dim"]): r["representations"][default] / r["hot"]["total"] for r in last
    }
    report.figures["archived_vs_hot_with_checkpoint"] = {
        str(r["dim"]): (r["representations"][default] + r["archival_attempts"]["total"]) / r["hot"]["total"]
        for r in last
    }
    report.figures["default_representation"] = default
    # What a user's tables hold: both tiers as the product's writes leave them.
    report.figures["archived_vs_hot_written"] = {
        str(r["dim"]): r["written"]["archived_total"] / r["written"]["hot"]["total"] for r in last
    }
    return report


def _written_table(results: list[dict[str, Any]], n: int) -> Table:
    rows = []
    for r in results:
        w = r["written"]
        rows.append(
            [
                r["dim"],
                w["hot"]["total"],
                w["archived_total"],
                100 * w["archived_total"] / w["hot"]["total"],
                r["hot"]["total"],
                r["archived_total"],
                100 * r["archived_total"] / r["hot"]["total"],
                r["distinct_summary_bits"],
            ]
        )
    return Table(
        f"Postgres bytes per memory as written and compacted, {n:,} memories",
        [
            "dim",
            "hot as written",
            "archived as written",
            "archived / hot as written %",
            "hot compacted",
            "archived compacted",
            "archived / hot compacted %",
            "distinct summary vectors",
        ],
        rows,
        "As written: the hot rows went through every index's insert path (the HNSW graph too, as `add` "
        "does), the archive rows through the night's inserts, then a plain VACUUM, as autovacuum runs it: "
        "what a user's tables hold. Compacted: after VACUUM FULL, which rebuilds every index. Archived "
        "includes backup_objects. The HNSW index stores identical vectors once: repeated summaries would "
        "make its graph smaller than distinct memories get.",
    )


def _growth_table(report: Report, sizes: list[int]) -> None:
    """What each further memory costs: the bytes added between the two largest sizes, per memory added."""
    a, b = sizes[-2], sizes[-1]
    rows = []
    growth: dict[str, dict[str, float]] = {}
    for dim in DIMS:
        small = next(r for r in report.figures[str(a)] if r["dim"] == dim)
        large = next(r for r in report.figures[str(b)] if r["dim"] == dim)

        # Bytes in all at each size, per memory added between them.
        hot = (large["hot"]["total"] * b - small["hot"]["total"] * a) / (b - a)
        arch = (large["archived_total"] * b - small["archived_total"] * a) / (b - a)
        growth[str(dim)] = {"hot": hot, "archived": arch, "ratio": arch / hot}
        rows.append(
            [
                dim,
                small["hot"]["total"],
                large["hot"]["total"],
                hot,
                large["archived_total"],
                arch,
                100 * arch / hot,
            ]
        )
    report.figures["growth"] = growth
    report.tables.append(
        Table(
            f"Bytes per memory as the tables grow ({a:,} to {b:,} memories)",
            [
                "dim",
                f"hot at {a:,}",
                f"hot at {b:,}",
                "hot, each memory added",
                f"archived at {b:,}",
                "archived, each memory added",
                "archived / hot added %",
            ],
            rows,
            "Each memory added = (bytes at the larger size - bytes at the smaller) / memories added: the pages "
            "every index has whatever its size (metapage, root, GIN pending list) drop out. Archived includes "
            "backup_objects.",
        )
    )


def _representation_table(report: Report, results: list[dict[str, Any]], recall: dict[str, Any]) -> None:
    by_dim = {r["dim"]: r for r in results}
    base_recall = recall.get("recall_at_10", {}).get("halfvec")
    rows = []
    for rep in variants(384):
        name = rep.key
        row: list[Any] = [rep.name.replace("first 192 dims", "first half of the dims")]
        for dim in DIMS:
            r = by_dim[dim]
            b, hot, ck = r["representations"][name], r["hot"]["total"], r["archival_attempts"]["total"]
            row += [b, 100 * b / hot, 100 * (b + ck) / hot]
        rec = recall.get("recall_at_10", {}).get(name)
        ms = recall.get("search_ms", {}).get(name, {})
        row += [rec, ratio(rec, base_recall) if rec is not None and base_recall else None, ms.get("p50")]
        rows.append(row)
    n = results[0]["n"]
    report.tables.insert(
        0,
        Table(
            f"Summary vectors: Postgres bytes per archived memory vs LoCoMo tiered recall@10 ({n:,} memories per dim)",
            [
                "representation",
                "bytes 1536-d",
                "% of hot 1536-d",
                "% with checkpoint row",
                "bytes 384-d",
                "% of hot 384-d",
                "% with checkpoint row",
                "tiered recall@10",
                "recall vs halfvec",
                "search p50 ms",
            ],
            rows,
            "Baseline (same run): the halfvec representation used before migration 007, and the same memories hot "
            f"({by_dim[1536]['hot']['total']:,.0f} B at 1536-d, {by_dim[384]['hot']['total']:,.0f} B at 384-d). Bytes = "
            "archived_memories heap + TOAST + every index per archived memory; the checkpoint column adds what "
            f"archival_attempts keeps per archived memory ({by_dim[384]['archival_attempts']['total']:,.0f} B: rows "
            "pruned after the audit). "
            f"Targets: <= 10% of hot at 1536-d, <= 25% at 384-d, recall >= 0.95x halfvec. Recall: "
            f"{recall.get('embedder', '?')} ({recall.get('dim', '?')}-d), {recall.get('questions', 0)} LoCoMo questions, "
            "default RetrievalConfig, limit 20, phase 2 auto; truncation is a Matryoshka technique (OpenAI "
            "`dimensions=`), MiniLM is not trained for it.",
        ),
    )


# --------------------------------------------------------------------------- representations


def _split(ddl: list[str]) -> tuple[list[str], list[str]]:
    """(ALTERs, CREATE INDEXes): indexes are built after the columns are filled, as after a bulk load."""
    return [s for s in ddl if not s.startswith("CREATE INDEX")], [
        s for s in ddl if s.startswith("CREATE INDEX")
    ]


def fill_variant(
    conn: psycopg.Connection[Any], rep: Representation, dim: int, ids: list[Any], vecs: np.ndarray
) -> None:
    """Add the variant's columns, write them from `vecs` (one per archive id), build its index."""
    alters, indexes = _split(rep.ddl(dim))
    for stmt in alters:
        conn.execute(stmt)
    if rep.fill is not None:
        values: list[Any]
        if rep.fill == "halfvec":
            column, cast, values = "bench_half", "::vector::halfvec", list(vecs)
        elif rep.fill == "truncated":
            column, cast, values = "bench_trunc", "::vector::halfvec", list(vecs[:, : dim // 2])
        else:
            column, cast, values = "bench_i8", "::bytea", int8_codes(vecs)
        with conn.cursor() as cur:
            cur.executemany(
                f"UPDATE archived_memories SET {column} = %s{cast} WHERE id = %s",
                list(zip(values, ids, strict=True)),
            )
    for stmt in indexes:
        conn.execute(stmt)


def drop_variant(conn: psycopg.Connection[Any]) -> None:
    for col in ("bench_half", "bench_trunc", "bench_i8"):
        conn.execute(f"ALTER TABLE archived_memories DROP COLUMN IF EXISTS {col}")


def representation_bytes(conn: psycopg.Connection[Any], dim: int, n: int, objects: float) -> dict[str, float]:
    """Total Postgres bytes per archived memory (table + TOAST + indexes, and its share of backup_objects,
    `objects` bytes per memory) under each representation."""

    def total() -> float:
        conn.execute("VACUUM FULL ANALYZE archived_memories")
        return relation_bytes(conn, "archived_memories")["total"] / n + objects

    rows = conn.execute("SELECT id, summary FROM archived_memories ORDER BY id").fetchall()
    ids = [r["id"] for r in rows]
    vecs = np.asarray(HashingEmbedder(dim).embed([r["summary"] for r in rows]), dtype=np.float32)
    with_bits = total()
    extra: dict[str, float] = {}
    for rep in variants(dim):
        fill_variant(conn, rep, dim, ids, vecs)
        extra[rep.key] = total() - with_bits
        drop_variant(conn)
    conn.execute("DROP INDEX archived_summary_bits_hnsw")
    conn.execute("ALTER TABLE archived_memories DROP COLUMN summary_bits")
    no_vector = total()
    bits = with_bits - no_vector
    return {rep.key: no_vector + extra[rep.key] + (bits if rep.keeps_bits else 0.0) for rep in variants(dim)}


def locomo_recall(server: Any, root: Path, opts: Options) -> dict[str, Any]:
    """Tiered recall@10 and phase-2 latency of every representation on LoCoMo, same questions, one run."""
    from memory_lib.core.plans import run_plan
    from memory_lib.retrieval.search import search_plan
    from memory_lib.retrieval.types import SearchRequest
    from memory_lib.storage.objectstore import LocalObjectStore

    from .locomo import DEFAULT, _recalls
    from .locomo_data import TOP, load_conversations
    from .locomo_load import archive_old, load_turns, settle

    path = opts.data or LOCOMO_DEFAULT
    if not path.exists():
        return {"skipped": f"LoCoMo data not found at {path}"}
    convs = load_conversations(path)
    max_questions = opts.queries or (25 if opts.smoke else None)
    if opts.smoke:
        convs = convs[:1]
    wanted = (opts.embedders or (None,))[0] or (
        "hashing" if opts.smoke or not local_embedder_available() else "local"
    )
    embedder: Any = local_embedder() if wanted == "local" else HashingEmbedder(384)
    config = DEFAULT.model_copy(update={"limit": TOP})
    recalls: dict[str, list[float]] = defaultdict(list)
    latency: dict[str, list[float]] = defaultdict(list)
    reps: list[Representation] = []
    for i, conv in enumerate(convs):
        db = f"fp_locomo_{i}"
        with bench_connect(server.create(db, embedder.dim), prepare=True) as conn:
            load_turns(conn, conv, embedder)
            archive_old(conn, conv, embedder, LocalObjectStore(root / f"locomo-{i}", "bench"))
            rows = conn.execute("SELECT id, summary FROM archived_memories ORDER BY id").fetchall()
            svecs = np.asarray(embedder.embed([r["summary"] for r in rows]), dtype=np.float32)
            reps = variants(embedder.dim)
            for rep in reps:
                fill_variant(conn, rep, embedder.dim, [r["id"] for r in rows], svecs)
            settle(conn)  # the fills rewrote every archived row
            by_id = {t.memory_id: t.dia_id for t in conv.turns}
            questions = conv.questions[:max_questions] if max_questions else conv.questions
            qvecs = np.asarray(embedder.embed([q.text for q in questions]), dtype=np.float32)
            for qi, (q, v) in enumerate(zip(questions, qvecs, strict=True)):
                for j in range(len(reps)):  # rotate the order so load hits every variant alike
                    rep = reps[(j + qi) % len(reps)]
                    request = SearchRequest(
                        user_id=conv.sample_id,
                        query=q.text,
                        embedding=v,
                        config=config,
                        now=conv.now,
                        embedder_kind=getattr(embedder, "kind", None),
                    )
                    started = time.perf_counter()
                    result = run_plan(conn, search_plan(request, archived_vectors=rep.arm))
                    latency[rep.key].append(time.perf_counter() - started)
                    ranked = [by_id[h.provenance.memory_id] for h in result.hits][:TOP]
                    recalls[rep.key].append(_recalls(ranked, q.evidence)["recall@10"])
        server.drop(db)
    return {
        "embedder": embedder.model,
        "dim": embedder.dim,
        "conversations": len(convs),
        "questions": len(recalls[reps[0].key]) if reps else 0,
        "recall_at_10": {k: float(np.mean(v)) for k, v in recalls.items()},
        "search_ms": {k: percentiles_ms(v) for k, v in latency.items()},
    }
