"""archival: throughput of the archival step over a backlog, per step, against a naive baseline; restore
throughput; re-promotion latency.

Every variant starts from a clone of the same loaded database (1536-d, hot HNSW index in place, the
whole backlog eligible), with the offline ExtractiveSummarizer and HashingEmbedder, so only the
method and the object store differ:

* naive baseline: one memory at a time: read, summarize, embed, put + verify, then one transaction
  (insert archive row, audit event, delete original);
* memory_lib.archival.pipeline.run_batch in batches of 500 (its default workers);
* the same pipeline as a user drains a backlog on one machine: 2 concurrent
  `memory-archive archive --until-drained --shard i/2` processes (one per core here).

Each run also records the machine's CPU time per memory (every process: this one, Postgres, the object
store), and from it the CPU ceiling: the rate at which every core would be busy.

The batched and sharded runs drain the whole backlog; the baselines (naive, and run_batch without packs) archive its
first 2,500 memories (`--baseline N`): they work one memory at a time, so their rate is per memory.

Restores are measured after VACUUM (ANALYZE) of both tiers (timed and reported), as autovacuum leaves
the tables within a minute of the batched run's deletes.

Object stores: SeaweedFS S3 on loopback (started here, or --s3-endpoint) and a local directory.

The JSON's `figures` always has the same summary keys, for the largest size of the run (per size under
`by_size`): size, rate_per_s, naive_rate_per_s, ratio_vs_naive, restore_rate_per_s, peak_rss_mib
(this process's RSS sampled during the batched run), machine and load (os.getloadavg at the start and
end of each run, and the CPU count). `--size 100k` runs the same at 100k.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg.types.json import Jsonb

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.models import BackupObject, sha256_hex
from memory_lib.lifecycle.eligibility import select_eligible
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer, SummaryInput, extract_key_entities
from memory_lib.storage import packs
from memory_lib.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore, s3_client
from memory_lib.storage.store import MEMORY_COLUMNS
from testing.rows import one

from . import adapters
from .archival_report import DIM, METHODS, SHARDS, result_tables, summary_table
from .common import (
    HotRow,
    LowRankSpace,
    Options,
    Report,
    bench_connect,
    bench_server,
    build_index,
    cli_env,
    copy_hot,
    demo_texts,
    drop_index,
    machine_info,
    old_timestamps,
    percentiles_ms,
    ratio,
    scratch_dir,
    set_embedding_model,
    stopwatch,
)
from .machine import ensure_bucket, loadavg, machine_busy_s, memory_archive_command, rss_sampler

NAME = "archival"
NO_PACKS = 1_000_000  # archival.pack_min_members no batch reaches
DEFAULT_SIZES = (10_000,)
# The baselines (naive loop, no packs) archive the first BASELINE_CAP memories of the backlog (`--baseline`
# to change it): they work one memory (or one object) at a time, so their rate is per memory, measured on
# the same full-size database; the whole 10k backlog took them 165 s and 205 s, 100k would take ~30 and
# ~35 minutes. The batched run always drains the whole backlog.
BASELINE_CAP = 2_500
SMOKE_SIZES = (120,)
AS_OF = datetime(2026, 1, 1, tzinfo=UTC)
ACTOR = "bench"


# --------------------------------------------------------------------------- fixtures


def load_backlog(
    conn: psycopg.Connection[Any],
    n: int,
    *,
    dim: int = DIM,
    hnsw: bool = True,
    seed: int = 0,
    index_inserts: bool = False,
) -> str:
    """n eligible hot memories (generated text, synthetic vectors labelled as the HashingEmbedder's model,
    created > 1 year before AS_OF). Returns the embedding model name.

    The HNSW index is dropped and built after the load (fast), unless `index_inserts`: then every row goes
    through its insert path, as `add` does, and the index is what a user's table has."""
    model = HashingEmbedder(dim).model
    set_embedding_model(conn, model)
    hnsw_def = None if index_inserts else drop_index(conn, "memories_embedding_hnsw")
    texts = demo_texts(min(n, 20_000), seed=7 + seed)
    created = old_timestamps(n, AS_OF, seed=seed)
    space = LowRankSpace(dim, seed=1)
    offset = 0
    for chunk in space.chunks(n, seed=21 + seed):
        rows = []
        for j, vec in enumerate(chunk):
            t = texts[(offset + j) % len(texts)]
            rows.append(
                HotRow(
                    uuid.uuid4(),
                    t.user_id,
                    t.content,
                    vec,
                    created[offset + j],
                    importance_score=t.importance_score,
                    category=t.category,
                    domain=t.domain,
                    metadata={"source": "bench", "turn": offset + j},
                )
            )
        offset += copy_hot(conn, rows, model=model)
    conn.execute("VACUUM ANALYZE memories")
    if hnsw and hnsw_def is not None:
        build_index(conn, hnsw_def, "memories")
    return model


@dataclass(frozen=True)
class StoreTarget:
    """An object store of the run: `make(prefix)` for this process, `settings(prefix)` the environment a
    `memory-archive` process needs to use the same store at that prefix (credentials included)."""

    make: Callable[[str], ObjectStore]
    settings: Callable[[str], dict[str, str]]


@contextmanager
def object_stores(opts: Options, root: Path) -> Iterator[dict[str, StoreTarget]]:
    """name -> an empty store per prefix: SeaweedFS S3 (or --s3-endpoint) and/or a local directory."""
    wanted = opts.stores or (("s3", "local") if opts.smoke else ("s3",))
    unknown = set(wanted) - {"s3", "local"}
    if unknown:
        raise ValueError(f"--stores {','.join(sorted(unknown))}: expected s3 and/or local")
    targets: dict[str, StoreTarget] = {}

    def s3_settings(endpoint: str, bucket: str, creds: dict[str, str]) -> Callable[[str], dict[str, str]]:
        return lambda prefix: (
            creds
            | {
                "MEMORY_ARCHIVE_OBJECT_STORE": "s3",
                "MEMORY_ARCHIVE_BUCKET": bucket,
                "MEMORY_ARCHIVE_PREFIX": prefix,
                "MEMORY_ARCHIVE_S3_ENDPOINT_URL": endpoint,
                "AWS_REGION": "us-east-1",
            }
        )

    with ExitStack() as stack:
        if "s3" in wanted and opts.s3_endpoint:
            client = s3_client(opts.s3_endpoint, "us-east-1")
            bucket = opts.s3_bucket or "memory-archive-bench"
            ensure_bucket(client, bucket)
            targets[f"S3 at {opts.s3_endpoint}"] = StoreTarget(
                lambda prefix: S3ObjectStore(client, bucket, prefix),
                s3_settings(opts.s3_endpoint, bucket, {}),  # credentials: this process's AWS environment
            )
        elif "s3" in wanted:
            from testing.seaweedfs import run_seaweedfs

            endpoint = stack.enter_context(run_seaweedfs(root / "seaweedfs"))
            sw_bucket = endpoint.create_bucket("bench")
            sw_client = s3_client(
                endpoint.endpoint_url, endpoint.region, endpoint.access_key, endpoint.secret_key
            )
            creds = {"AWS_ACCESS_KEY_ID": endpoint.access_key, "AWS_SECRET_ACCESS_KEY": endpoint.secret_key}
            targets["SeaweedFS S3"] = StoreTarget(
                lambda prefix: S3ObjectStore(sw_client, sw_bucket, prefix),
                s3_settings(endpoint.endpoint_url, sw_bucket, creds),
            )
        if "local" in wanted:
            targets["local dir"] = StoreTarget(
                lambda prefix: LocalObjectStore(root / "objects", prefix),
                lambda prefix: {
                    "MEMORY_ARCHIVE_OBJECT_STORE": "local",
                    "MEMORY_ARCHIVE_LOCAL_ROOT": str(root / "objects"),
                    "MEMORY_ARCHIVE_PREFIX": prefix,
                },
            )
        yield targets


# --------------------------------------------------------------------------- the two methods


def services_for(store: ObjectStore, dim: int = DIM) -> ArchivalServices:
    return ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(dim), store)


def run_batched(
    conn: psycopg.Connection[Any],
    store: ObjectStore,
    *,
    key: str,
    dim: int = DIM,
    packs: bool = True,
    limit: int | None = None,
) -> dict[str, Any]:
    """run_batch in batches of 500 until nothing is eligible (or `limit` memories are archived or failed).
    Seconds per step. `packs` False: one object per memory, as when every user has fewer than
    pack_min_members memories in a batch (the backlog here has 4 users, so ~125 per user and batch)."""
    criteria = ArchivalCriteria() if packs else ArchivalCriteria(pack_min_members=NO_PACKS)
    full = criteria.batch_size
    services = services_for(store, dim)
    steps: dict[str, float] = defaultdict(float)
    archived = failed = batches = 0
    bytes_written = 0
    with stopwatch() as total:
        while limit is None or archived + failed < limit:
            if limit is not None:  # the last batch claims only what is left of the limit
                criteria = criteria.model_copy(update={"batch_size": min(full, limit - archived - failed)})
            rep = run_batch(conn, services, criteria, batch_key=f"{key}-{batches}", as_of=AS_OF, actor=ACTOR)
            assert rep.claim is not None
            if rep.claim.claimed == 0:  # the last, empty claim: its time counts, its empty steps do not
                break
            batches += 1
            for s in rep.steps:
                steps[s.step] += s.seconds
                bytes_written += s.bytes_written
            archived += rep.status.archived
            failed += rep.status.failed
    steps["claim + gate"] = total[0] - sum(steps.values())  # the rest: claim, fidelity, gates, integrity
    return {
        "seconds": total[0],
        "archived": archived,
        "failed": failed,
        "batches": batches,
        "steps": dict(steps),
        "bytes_written": bytes_written,
    }


def run_sharded(
    db_url: str, store_settings: dict[str, str], state_dir: Path, *, shards: int
) -> dict[str, Any]:
    """`shards` concurrent `memory-archive archive --until-drained --shard i/N` processes over the whole
    backlog: the CLI a user runs, the offline summarizer and the hashing embedder at DIM, every other
    setting its default. Their time includes each process's start."""

    env = cli_env(db_url, store_settings, state_dir, dim=DIM)
    cmd = [memory_archive_command(), "archive", "--until-drained"]
    with stopwatch() as total:
        procs = [
            subprocess.Popen(
                [*cmd, "--shard", f"{i}/{shards}"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(shards)
        ]
        outs = [p.communicate(timeout=3600) for p in procs]
    with bench_connect(db_url) as conn:  # what the backups hold: the archive rows record each size
        row = conn.execute(
            "SELECT coalesce(sum(backup_size_bytes), 0) AS b FROM archived_memories"
        ).fetchone()
        assert row is not None
    archived = failed = batches = 0
    for p, (out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cast(list[str], p.args)[1:])}` exited {p.returncode}:\n{err[-2000:]}"
            )
        for line in out.strip().splitlines():
            batch = json.loads(line)
            archived += batch["archived"]
            failed += batch["failed"]
            batches += 1
    return {
        "seconds": total[0],
        "archived": archived,
        "failed": failed,
        "batches": batches,
        "shards": shards,
        "steps": {},
        "bytes_written": int(row["b"]),
    }


_NAIVE_INSERT = f"""
    INSERT INTO archived_memories (
        original_id, user_id, summary, summary_embedding, summary_embedding_model, key_entities,
        original_domain, original_category, original_embedding_model, original_updated_at,
        original_superseded_by, importance_score, access_count, last_accessed_at, archived_at,
        original_created_at, archive_reason, backup_object, storage_verified, backup_digest,
        backup_size_bytes, backup_version_id, summary_model, summarizer_kind, summary_input_tokens,
        summary_output_tokens, summary_cost_usd)
    VALUES (%(id)s, %(user_id)s, %(summary)s, %(vec)s::vector::halfvec, %(emb_model)s, %(entities)s,
            %(domain)s, %(category)s, %(embedding_model)s, %(updated_at)s, %(superseded_by)s,
            %(importance_score)s, %(access_count)s, %(last_accessed_at)s, %(archived_at)s, %(created_at)s,
            %(reason)s, {packs.object_of_sql("%(user_id)s", "%(ref)s")}, true, decode(%(sha)s, 'hex'), %(size)s, %(version)s, %(summary_model)s, %(kind)s,
            %(in_tok)s, %(out_tok)s, %(cost)s)"""


def run_naive(
    conn: psycopg.Connection[Any], store: ObjectStore, *, dim: int = DIM, limit: int = 10_000_000
) -> dict[str, Any]:
    """The baseline: one memory per step sequence and per transaction, nothing batched or parallel; the
    first `limit` eligible memories (the order run_batch claims them in)."""
    criteria = ArchivalCriteria()
    summarizer, embedder = ExtractiveSummarizer(), HashingEmbedder(dim)
    steps: dict[str, float] = defaultdict(float)
    archived = 0
    bytes_written = 0
    with stopwatch() as total:
        with stopwatch() as t:
            todo = select_eligible(conn, criteria, AS_OF, limit=limit)
        steps["select"] += t[0]
        for item in todo:
            t0 = time.perf_counter()
            row = conn.execute(
                f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = %s", (item["id"],)
            ).fetchone()
            assert row is not None
            t1 = time.perf_counter()
            summary = summarizer.summarize(
                SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
            )
            entities = extract_key_entities(row["content"])
            t2 = time.perf_counter()
            vec = embedder.embed([summary.text])[0]
            t3 = time.perf_counter()
            archived_at = datetime.now(UTC)
            data = BackupObject.from_row(
                row, archived_at=archived_at, archive_reason=item["reason"]
            ).to_json_bytes()
            obj = store.put(
                store.key_for(row["id"]), data, sha256_hex(data)
            )  # put verifies before returning (S3: the echoed SHA256)
            t4 = time.perf_counter()
            with conn.transaction():
                conn.execute(packs.RECORD_OBJECTS_SQL, {"users": [row["user_id"]], "refs": [obj.ref]})
                conn.execute(
                    _NAIVE_INSERT,
                    {
                        "id": row["id"],
                        "user_id": row["user_id"],
                        "summary": summary.text,
                        "vec": vec,
                        "emb_model": embedder.model,
                        "entities": entities,
                        "domain": row["domain"],
                        "category": row["category"],
                        "embedding_model": row["embedding_model"],
                        "updated_at": row["updated_at"],
                        "superseded_by": row["superseded_by"],
                        "importance_score": row["importance_score"],
                        "access_count": row["access_count"],
                        "last_accessed_at": row["last_accessed_at"],
                        "archived_at": archived_at,
                        "created_at": row["created_at"],
                        "reason": item["reason"],
                        "ref": obj.ref,
                        "sha": obj.sha256,
                        "size": obj.size,
                        "version": obj.version_id,
                        "summary_model": summary.model,
                        "kind": summary.kind,
                        "in_tok": summary.input_tokens,
                        "out_tok": summary.output_tokens,
                        "cost": summary.cost_usd,
                    },
                )
                conn.execute(
                    """INSERT INTO memory_events (memory_id, user_id, event_type, actor, details)
                       VALUES (%s, %s, 'archived', %s, %s)""",
                    (
                        row["id"],
                        row["user_id"],
                        ACTOR,
                        Jsonb({"reason": item["reason"], "storage_ref": obj.ref}),
                    ),
                )
                conn.execute("DELETE FROM memories WHERE id = %s", (row["id"],))
            t5 = time.perf_counter()
            steps["read"] += t1 - t0
            steps["summarize"] += t2 - t1
            steps["embed"] += t3 - t2
            steps["backup"] += t4 - t3
            steps["commit"] += t5 - t4
            archived += 1
            bytes_written += obj.size
    return {
        "seconds": total[0],
        "archived": archived,
        "failed": 0,
        "batches": len(todo),
        "steps": dict(steps),
        "bytes_written": bytes_written,
    }


def checkpoint_bytes(conn: psycopg.Connection[Any]) -> int:
    """archival_attempts on disk (heap + TOAST + indexes), after VACUUM: the rows that stay per archived memory."""
    conn.execute("VACUUM archival_attempts")
    return one(conn.execute("SELECT pg_total_relation_size('archival_attempts') AS b"))["b"]


def tier_counts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM memories) AS hot, (SELECT count(*) FROM archived_memories) AS archived"
    ).fetchone()
    assert row is not None
    return row["hot"], row["archived"]


# --------------------------------------------------------------------------- restore and re-promotion


def settle_tables(conn: psycopg.Connection[Any]) -> float:
    """VACUUM (ANALYZE) both tiers, as autovacuum leaves them within a minute of a large change (the run
    just deleted every archived memory's hot row and its HNSW entry): restores are measured on the
    tables a restore would meet, not on the dead rows of the run. Returns its seconds."""
    with stopwatch() as t:
        conn.execute("VACUUM (ANALYZE) memories, archived_memories")
    return t[0]


def measure_bulk_restore(conn: psycopg.Connection[Any], store: ObjectStore, count: int) -> dict[str, Any]:
    """restore_archives over `count` archived memories (groups of 50 in multi-row statements, backups read ahead)."""
    from memory_lib.lifecycle.restore import restore_archives

    ids = [
        r["original_id"]
        for r in conn.execute(
            "SELECT original_id FROM archived_memories ORDER BY original_id DESC LIMIT %s", (count,)
        ).fetchall()
    ]
    with stopwatch() as total:
        rep = restore_archives(conn, store, actor=ACTOR, original_ids=ids, pause_archival=False)
    if rep.restored != len(ids) or rep.failed:
        raise AssertionError(
            f"bulk restore of {len(ids)}: {rep.restored} restored, {rep.failed} failed {rep.errors}"
        )
    return {"restored": rep.restored, "seconds": total[0], "per_s": ratio(rep.restored, total[0])}


def measure_restore(conn: psycopg.Connection[Any], store: ObjectStore, count: int) -> dict[str, Any]:
    """restore_archive one memory per call: its latency."""
    from memory_lib.lifecycle.restore import restore_archive

    rows = conn.execute(
        "SELECT user_id, original_id FROM archived_memories ORDER BY original_id LIMIT %s", (count,)
    ).fetchall()
    times = []
    with stopwatch() as total:
        for r in rows:
            with stopwatch() as t:
                res = restore_archive(
                    conn, store, user_id=r["user_id"], original_id=r["original_id"], actor=ACTOR
                )
            if not res.restored:
                raise AssertionError(f"restore of {r['original_id']} restored nothing")
            times.append(t[0])
    return {
        "restored": len(rows),
        "seconds": total[0],
        "per_s": ratio(len(rows), total[0]),
        "latency_ms": percentiles_ms(times),
    }


def measure_promotion(conn: psycopg.Connection[Any], store: ObjectStore, count: int) -> dict[str, Any]:
    """Expand archived memories until each is re-promoted; time the expansions and the promoting one."""
    rows = conn.execute(
        "SELECT id, user_id, original_id FROM archived_memories ORDER BY original_id DESC LIMIT %s", (count,)
    ).fetchall()
    expand_times: list[float] = []
    promote_times: list[float] = []
    for r in rows:
        for _ in range(10):  # the rule promotes on the 3rd expansion in 30 days; never loop forever
            with stopwatch() as t:
                promoted = adapters.expand_or_promote(
                    conn,
                    store,
                    user_id=r["user_id"],
                    archive_id=r["id"],
                    original_id=r["original_id"],
                    now=datetime.now(UTC),
                )
            (promote_times if promoted else expand_times).append(t[0])
            if promoted:
                break
        else:
            raise AssertionError(f"archive {r['id']} was not re-promoted after 10 expansions")
    hot = one(
        conn.execute(
            "SELECT count(*) AS n FROM memories WHERE id = ANY(%s)", ([r["original_id"] for r in rows],)
        )
    )["n"]
    if hot != len(rows):
        raise AssertionError(f"{len(rows)} re-promotions but {hot} memories hot again")
    return {
        "promoted": len(rows),
        "expansions": len(expand_times),
        "promote_ms": percentiles_ms(promote_times),
        "expand_ms": percentiles_ms(expand_times),
        "engine": adapters.promotion_engine(),
    }


# --------------------------------------------------------------------------- run


def run(opts: Options) -> Report:
    sizes = opts.sizes_or(DEFAULT_SIZES, SMOKE_SIZES)
    restore_n = 20 if opts.smoke else 2000
    promote_n = 3 if opts.smoke else 20
    batch_size = ArchivalCriteria().batch_size
    cap = BASELINE_CAP if opts.baseline is None else opts.baseline
    if cap < 1:
        raise ValueError(f"--baseline {opts.baseline}: must be a positive number of memories")
    report = Report(
        NAME,
        {
            "sizes": sizes,
            "dim": DIM,
            "batch_size": batch_size,
            "baseline": cap,
            "restores": restore_n,
            "re_promotions": promote_n,
        },
    )
    with (
        bench_server(opts.workdir) as server,
        scratch_dir(opts.workdir, "ma-bench-objects-") as root,
        object_stores(opts, root) as stores,
    ):
        for n in sizes:
            tmpl = f"backlog_{n}"
            url = server.create(tmpl, DIM)
            with bench_connect(url) as conn:
                report.machine = report.machine or machine_info(conn)
                with stopwatch() as load_t:
                    load_backlog(conn, n)
            results: dict[str, dict[str, Any]] = {}
            for store_name, target in stores.items():
                for method in METHODS:
                    db = f"{method}_{'local' if store_name == 'local dir' else 's3'}_{n}"
                    run_url = server.clone(tmpl, db)
                    prefix = f"{db}-{uuid.uuid4().hex[:6]}"
                    store = target.make(prefix)
                    # The baselines archive the backlog's first `cap` memories; the batched runs all of it.
                    want = n if method in ("batched", "sharded") else min(n, cap)
                    with bench_connect(run_url, prepare=True) as conn:
                        load_start = loadavg()
                        busy_start = machine_busy_s()
                        with rss_sampler() as rss:
                            if method == "naive":
                                res = run_naive(conn, store, limit=want)
                            elif method == "sharded":
                                res = run_sharded(
                                    run_url, target.settings(prefix), root / f"state-{db}", shards=SHARDS
                                )
                            else:
                                res = run_batched(
                                    conn,
                                    store,
                                    key=db,
                                    packs=method == "batched",
                                    limit=None if want == n else want,
                                )
                        busy = machine_busy_s() - busy_start
                        res |= {
                            # CPU the run cost the machine per memory; cores / that = the rate at which
                            # this machine's CPUs would all be busy: what overlapping work could reach.
                            "machine_cpu_ms_per_memory": busy * 1000 / max(res["archived"], 1),
                            "cpu_ceiling_per_s": (os.cpu_count() or 1)
                            * max(res["archived"], 1)
                            / max(busy, 1e-9),
                            "peak_rss_mib": rss["peak_mib"],
                            "rss_growth_mib": rss["growth_mib"],
                            "load_start": load_start,
                            "load_end": loadavg(),
                            "backlog": n,
                            "sampled": want < n,
                        }
                        hot, archived = tier_counts(conn)
                        if archived != res["archived"] or hot != n - archived or res["archived"] != want:
                            raise AssertionError(
                                f"{db}: expected {want} archived and {n - want} hot, got {archived} / {hot}"
                            )
                        if method != "naive":
                            res["checkpoint_bytes_per_archived"] = checkpoint_bytes(conn) / max(archived, 1)
                        if method == "batched" and store_name != "local dir":
                            res["vacuum_s"] = settle_tables(conn)
                            res["bulk_restore"] = measure_bulk_restore(conn, store, min(restore_n, n // 2))
                            res["restore"] = measure_restore(conn, store, min(restore_n // 5, n // 4))
                            res["promotion"] = measure_promotion(conn, store, min(promote_n, n // 4))
                    results[f"{store_name}|{method}"] = res
                    server.drop(db)
            server.drop(tmpl)
            result_tables(report, n, results, load_t[0])
        summary_table(report)
    return report
