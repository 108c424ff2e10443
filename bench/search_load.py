"""The search bench's run under load: concurrent searches while an archival run moves memories."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memory_lib import LocalObjectStore, MemoryClient, Settings
from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.llm.summarize import ExtractiveSummarizer

from .common import (
    Report,
    Table,
    bench_connect,
    percentiles_ms,
    ratio,
    scratch_dir,
)
from .search_corpus import ARCHIVED_PER_HOT, DB, DIM, NOW, Corpus, CorpusEmbedder

LOAD_THREADS = 8
LOAD_ARCHIVE = 2_000  # hot memories the archival run archives under load (at most a fifth of them)
LOAD_TIMEOUT_S = 1_200.0

# Every hot memory is eligible (the corpus' are minutes to days old at NOW), lowest importance first.
LOAD_CRITERIA = ArchivalCriteria(
    min_age_days=0, force_archive_age_days=0, max_importance_score=1.0, exempt_categories=()
)


Sample = tuple[float, float, bool]  # (start, seconds, phase 2 ran), time.monotonic()


def _archive_during_load(
    url: str, root: str, lift_matrix: np.ndarray, model: str, kind: str, target: int, started: Any, out: Any
) -> None:
    """The archival run of the load test, in a process of its own (as a Slow Path worker runs): batches of
    run_batch until `target` memories are archived; puts {archived, batches, start, end} (or {error})."""
    try:
        services = ArchivalServices(
            ExtractiveSummarizer(),
            CorpusEmbedder(model, kind, lift_matrix),
            LocalObjectStore(Path(root), "bench"),
        )
        archived = batches = 0
        conn: DB = bench_connect(url, prepare=True)
        with conn:
            started.set()
            start = time.monotonic()
            while archived < target:
                rep = run_batch(
                    conn,
                    services,
                    LOAD_CRITERIA,
                    batch_key=f"load-{batches}",
                    as_of=NOW,
                    actor="bench",
                    limit=min(LOAD_CRITERIA.batch_size, target - archived),
                )
                if rep.claim is None or rep.claim.claimed == 0:
                    break
                if not rep.gate_passed:
                    raise RuntimeError(f"archival batch {batches} failed its error gate: {rep.status}")
                archived += rep.status.archived
                batches += 1
            end = time.monotonic()
        out.put({"archived": archived, "batches": batches, "start": start, "end": end})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        out.put({"error": repr(exc)})
    finally:
        started.set()


def under_load(url: str, report: Report, n: int, corpus: Corpus, workdir: Path | None) -> None:
    queries = corpus.lift(corpus.qvecs)
    texts = [t.content for t in corpus.queries]
    users = [t.user_id for t in corpus.queries]
    nq = len(texts)
    embedder = corpus.embedder(texts, queries)
    conns: list[DB] = [bench_connect(url, prepare=True) for _ in range(LOAD_THREADS)]
    clients = [MemoryClient(c, embedder=embedder, settings=Settings(), actor="bench") for c in conns]
    target = min(LOAD_ARCHIVE, n // 5)

    def search(client: MemoryClient, i: int) -> Sample:
        start = time.monotonic()
        result = client.search(users[i % nq], texts[i % nq], now=NOW)
        return start, time.monotonic() - start, result.phase2_reason is not None

    def threads(keep_going: Callable[[int], bool]) -> list[Sample]:
        """LOAD_THREADS threads, each on its own client and connection, started together; thread k
        begins at query k·nq/LOAD_THREADS and runs while keep_going(searches it has done)."""
        barrier = threading.Barrier(LOAD_THREADS)
        out: list[list[Sample]] = [[] for _ in range(LOAD_THREADS)]
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                barrier.wait()
                j = 0
                while keep_going(j):
                    out[k].append(search(clients[k], k * nq // LOAD_THREADS + j))
                    j += 1
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                errors.append(exc)
                barrier.abort()

        pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(LOAD_THREADS)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        return [s for samples in out for s in samples]

    try:
        for client in clients:  # every connection past its first statements and psycopg's prepare threshold
            for i in range(min(6, nq)):
                search(client, i)
        idle = [search(clients[0], i) for i in range(nq)]
        busy = threads(lambda j: j < nq)
        ctx = multiprocessing.get_context("spawn")
        started, out = ctx.Event(), ctx.Queue()
        with scratch_dir(workdir, "ma-bench-objects-") as root:
            worker = ctx.Process(
                target=_archive_during_load,
                args=(url, str(root), corpus.lift_matrix, corpus.model, corpus.kind, target, started, out),
            )
            worker.start()
            try:
                started.wait(LOAD_TIMEOUT_S)
                done = threading.Event()
                outcome: dict[str, Any] = {}

                def wait_for_archival() -> None:
                    deadline = time.monotonic() + LOAD_TIMEOUT_S
                    while not outcome and time.monotonic() < deadline:
                        # Read is_alive before the get: a worker that put its result and exited during a
                        # short get still has its result in the pipe, and gets a long get to deliver it.
                        alive = worker.is_alive()
                        with contextlib.suppress(queue.Empty):
                            outcome.update(out.get(timeout=0.5 if alive else 2.0))
                        if not outcome and not alive:
                            break  # died without a word
                    done.set()

                waiter = threading.Thread(target=wait_for_archival, daemon=True)
                waiter.start()
                loaded = threads(lambda j: not done.is_set())
                waiter.join()
            finally:
                worker.join(LOAD_TIMEOUT_S)
                if worker.is_alive():
                    worker.terminate()
    finally:
        for c in conns:
            c.close()
    if "error" in outcome or "end" not in outcome:
        raise RuntimeError(f"the archival run under load failed: {outcome.get('error', 'no result')}")
    window = outcome["end"] - outcome["start"]
    during = [s for s in loaded if outcome["start"] <= s[0] <= outcome["end"]]
    rate = ratio(outcome["archived"], window)
    modes = {
        "idle: 1 thread alone (baseline)": (idle, math.nan),
        f"{LOAD_THREADS} threads, no archival": (busy, math.nan),
        f"{LOAD_THREADS} threads + archival run": (during, rate),
    }
    p_idle = percentiles_ms([s[1] for s in idle])
    p_busy = percentiles_ms([s[1] for s in busy])
    rows: list[list[Any]] = []
    figures: dict[str, Any] = {
        "threads": LOAD_THREADS,
        "archival": outcome | {"seconds": window, "rate": rate},
    }
    for (name, (samples, r)), key in zip(modes.items(), ("idle", "threads", "under_load"), strict=True):
        p = percentiles_ms([s[1] for s in samples])
        share = float(np.mean([s[2] for s in samples])) if samples else math.nan
        rows.append(
            [
                name,
                len(samples),
                p["p50"],
                p["p95"],
                p["p99"],
                ratio(p["p95"], p_idle["p95"]),
                ratio(p["p95"], p_busy["p95"]),
                share,
                r,
            ]
        )
        figures[key] = p | {
            "searches": len(samples),
            "phase2_share": share,
            "ratio_p95_vs_idle": ratio(p["p95"], p_idle["p95"]),
            "ratio_p95_vs_same_threads_idle": ratio(p["p95"], p_busy["p95"]),
        }
    under = figures["under_load"]["ratio_p95_vs_same_threads_idle"]
    under_one = figures["under_load"]["ratio_p95_vs_idle"]
    nproc = report.machine.get("nproc", os.cpu_count())
    report.tables.append(
        Table(
            f"Default search under load: {LOAD_THREADS} threads while archival runs, {n:,} hot + "
            f"{ARCHIVED_PER_HOT * n:,} archived memories at the start, {DIM}-d (ms)",
            [
                "mode",
                "searches",
                "p50",
                "p95",
                "p99",
                "ratio p95 vs 1 thread idle",
                f"ratio p95 vs {LOAD_THREADS} threads idle",
                "phase 2 ran (share)",
                "archival rate (memories/s)",
            ],
            rows,
            f"Baseline: the default search (MemoryClient.search, no overrides, as in the previous table) from one "
            f"thread alone, each held-out query once ({nq}). Then {LOAD_THREADS} threads, each with its own client "
            f"and connection, run the same searches together: once each without archival, and in a loop while an "
            f"archival run (memory_lib.archival.pipeline.run_batch, ExtractiveSummarizer, LocalObjectStore, summaries "
            f"embedded by HashingEmbedder lifted to {DIM}-d, ArchivalCriteria forcing age; a process of its own, as "
            f"a Slow Path worker) archives {outcome['archived']:,} hot memories in {outcome['batches']} batches in "
            f"{window:.1f} s; only searches started during the archival run count. Latency = wall time of each "
            f"client.search call (time.monotonic around it). This machine has {nproc} cores: {LOAD_THREADS} search "
            f"threads (one Python process, one GIL), their {LOAD_THREADS} Postgres backends and the archival "
            f"process oversubscribe the CPU, so a search's wall time includes waiting for a core; the "
            f"'{LOAD_THREADS} threads, no archival' row separates that queueing from the archival's own cost. "
            f"Goal: p95 during archival <= 2x idle, the same {LOAD_THREADS} threads searching without archival; "
            f"this run: {under:.2f}x ({'meets' if under <= 2 else 'misses'} it); against one thread alone "
            f"{under_one:.1f}x, which on {nproc} cores is mostly the threads queueing for a core.",
        )
    )
    report.figures.setdefault("under_load", {})[str(n)] = figures
