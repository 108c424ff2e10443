"""The search bench's speed rows: the default search against the bare vector query of the same run, for
the corpus' users, for a conversation-size user, and as throughput with 16 concurrent async searches."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib import AsyncMemoryClient, MemoryClient, Settings
from memory_lib.core.config import RetrievalConfig
from memory_lib.retrieval.sql import ARCHIVED_EXACT_MAX, EXACT_MAX

from .common import (
    HotRow,
    Report,
    Table,
    bench_connect,
    copy_archived,
    copy_hot,
    explain_plan,
    percentiles_ms,
    ratio,
)
from .search_corpus import ARCHIVED_PER_HOT, DB, DIM, NOW, Corpus

# A conversation's worth of memories for one user (LoCoMo's conversations hold 300-700 turns, a long
# chat a few thousand): its hot tier within EXACT_MAX, its archive (4x that) within ARCHIVED_EXACT_MAX.
CONVERSATION_USER = "conversation"
CONVERSATION_HOT = 500
CONCURRENCY = 16
GOAL_RATIO = {
    10_000: 2.5,
    100_000: 3.0,
}  # default search p95 / bare HNSW vector query p95, n hot + 4n archived
GOAL_P95_MS = {10_000: 10.0, 100_000: 20.0}  # default search p95 at n hot + 4n archived, absolute
CONVERSATION_GOAL_RATIO = 2.5


def _load_conversation(conn: DB, corpus: Corpus) -> tuple[int, int]:
    """One more user: CONVERSATION_HOT of the corpus' texts hot (a minute apart, as chat turns), 4x as
    many archived; the same texts and vectors, so the held-out queries find neighbours."""
    n_hot = min(CONVERSATION_HOT, len(corpus.texts) // (ARCHIVED_PER_HOT + 1))
    texts = corpus.texts[: n_hot * (ARCHIVED_PER_HOT + 1)]
    vecs = corpus.lift(corpus.vecs[: len(texts)])
    rows = [
        HotRow(uuid.uuid4(), CONVERSATION_USER, t.content, v, NOW - timedelta(minutes=j), category=t.category)
        for j, (t, v) in enumerate(zip(texts, vecs, strict=True))
    ]
    copy_hot(conn, rows[:n_hot], model=corpus.model)
    copy_archived(conn, rows[n_hot:], model=corpus.model, archived_at=NOW - timedelta(days=1))
    conn.execute("ANALYZE memories")
    conn.execute("ANALYZE archived_memories")
    return n_hot, len(rows) - n_hot


def conversation_user(conn: DB, url: str, report: Report, n: int, corpus: Corpus) -> None:
    """The default search of a conversation-size user vs that user's bare vector query, interleaved."""
    from .search import ITERATIVE, VECTOR_LEG_SQL, _run_interleaved

    n_hot, n_archived = _load_conversation(conn, corpus)
    queries = corpus.lift(corpus.qvecs)
    texts = [t.content for t in corpus.queries]
    config = RetrievalConfig()
    leg_conn, search_conn = bench_connect(url, prepare=True), bench_connect(url, prepare=True)
    leg_conn.execute(f"SET hnsw.ef_search = {config.hnsw_ef_search}")
    leg_conn.execute(ITERATIVE)
    client = MemoryClient(
        search_conn, embedder=corpus.embedder(texts, queries), settings=Settings(), actor="bench"
    )
    phase2: list[bool] = []

    def leg(i: int) -> list[tuple[Any, float]]:
        return [
            ("hot", 0.0) for _ in leg_conn.execute(VECTOR_LEG_SQL, (CONVERSATION_USER, queries[i])).fetchall()
        ]

    def default(i: int) -> list[tuple[Any, float]]:
        result = client.search(CONVERSATION_USER, texts[i], now=NOW)
        phase2.append(result.phase2_reason is not None)
        return [(h.source, h.scores.similarity) for h in result.hits]

    try:
        plan = explain_plan(leg_conn, VECTOR_LEG_SQL, (CONVERSATION_USER, queries[0]))
        times, _ = _run_interleaved({"vector": leg, "default": default}, len(queries))
    finally:
        leg_conn.close()
        search_conn.close()
    p_leg, p_def = percentiles_ms(times["vector"]), percentiles_ms(times["default"])
    report.figures.setdefault("conversation", {})[str(n)] = {
        "hot": n_hot,
        "archived": n_archived,
        "vector_leg": p_leg,
        "vector_leg_plan": plan,
        "default": p_def,
        "phase2_share": float(np.mean(phase2[-len(queries) :])) if phase2 else float("nan"),
        "ratio_p50": ratio(p_def["p50"], p_leg["p50"]),
        "ratio_p95": ratio(p_def["p95"], p_leg["p95"]),
        "load_average_1m": os.getloadavg()[0],
    }


async def _throughput(
    url: str,
    prepare: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Callable[[int], Awaitable[Any]]]],
    per_task: int,
) -> tuple[float, int]:
    """CONCURRENCY tasks, each on its own connection, run `per_task` calls at once; (searches/s, searches)."""
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
        for _ in range(CONCURRENCY)
    ]
    try:
        calls = []
        for c in conns:
            await register_vector_async(c)
            calls.append(await prepare(c))
        for k, call in enumerate(calls):  # past psycopg's prepare threshold on every connection
            for j in range(6):
                await call(k + j)

        async def task(k: int, call: Callable[[int], Awaitable[Any]]) -> None:
            for j in range(per_task):
                await call(k * per_task + j)

        start = time.perf_counter()
        await asyncio.gather(*(task(k, call) for k, call in enumerate(calls)))
        seconds = time.perf_counter() - start
    finally:
        for c in conns:
            await c.close()
    return CONCURRENCY * per_task / seconds, CONCURRENCY * per_task


def concurrent(url: str, report: Report, n: int, corpus: Corpus) -> None:
    """Searches/s of CONCURRENCY concurrent AsyncMemoryClient.search calls (defaults) and of as many
    concurrent bare HNSW vector queries, same queries, one asyncio process."""
    from .search import HNSW_ONLY, ITERATIVE, VECTOR_LEG_SQL

    queries = corpus.lift(corpus.qvecs)
    texts = [t.content for t in corpus.queries]
    users = [t.user_id for t in corpus.queries]
    nq = len(texts)
    embedder = corpus.embedder(texts, queries)
    config = RetrievalConfig()

    async def search_call(c: psycopg.AsyncConnection[Any]) -> Callable[[int], Awaitable[Any]]:
        client = AsyncMemoryClient(c, embedder=embedder, settings=Settings(), actor="bench")

        async def call(i: int) -> Any:
            return await client.search(users[i % nq], texts[i % nq], now=NOW)

        return call

    async def vector_call(c: psycopg.AsyncConnection[Any]) -> Callable[[int], Awaitable[Any]]:
        await c.execute(f"SET hnsw.ef_search = {config.hnsw_ef_search}")
        await c.execute(ITERATIVE)
        await c.execute(HNSW_ONLY)

        async def call(i: int) -> Any:
            cur = await c.execute(VECTOR_LEG_SQL, (users[i % nq], queries[i % nq]), prepare=True)
            return await cur.fetchall()

        return call

    per_task = max(3, nq // 4)
    vector_rate, vector_n = asyncio.run(_throughput(url, vector_call, per_task))
    search_rate, search_n = asyncio.run(_throughput(url, search_call, per_task))
    report.figures.setdefault("concurrent", {})[str(n)] = {
        "concurrency": CONCURRENCY,
        "vector_leg_hnsw_per_s": vector_rate,
        "default_search_per_s": search_rate,
        "searches": search_n,
        "vector_queries": vector_n,
        "ratio": ratio(vector_rate, search_rate),
        "load_average_1m": os.getloadavg()[0],
    }


def speed_table(report: Report, n: int) -> None:
    """The speed goals in one table: every row a ratio to the bare vector query of the same run."""
    two = report.figures.get("two_phase", {}).get(str(n))
    conv = report.figures.get("conversation", {}).get(str(n))
    conc = report.figures.get("concurrent", {}).get(str(n))
    if two is None:
        return
    hnsw, default = two["vector_leg_hnsw_forced"], two["default"]
    goals = []  # the ratio goal, then the absolute one, where this size has them
    if n in GOAL_RATIO:
        goals.append(f"<= {GOAL_RATIO[n]}x")
    if n in GOAL_P95_MS:
        goals.append(f"<= {GOAL_P95_MS[n]:.0f} ms")
    rows: list[list[Any]] = [
        [
            f"default search, {n:,} hot + {ARCHIVED_PER_HOT * n:,} archived (4 users)",
            default["p50"],
            default["p95"],
            "bare HNSW vector query (HNSW plan forced)",
            hnsw["p50"],
            hnsw["p95"],
            ratio(default["p50"], hnsw["p50"]),
            ratio(default["p95"], hnsw["p95"]),
            " and ".join(goals) or "-",
        ]
    ]
    if conv is not None:
        rows.append(
            [
                f"default search, conversation-size user ({conv['hot']:,} hot + {conv['archived']:,} archived)",
                conv["default"]["p50"],
                conv["default"]["p95"],
                f"its bare vector query ({conv['vector_leg_plan']})",
                conv["vector_leg"]["p50"],
                conv["vector_leg"]["p95"],
                conv["ratio_p50"],
                conv["ratio_p95"],
                f"<= {CONVERSATION_GOAL_RATIO}x",
            ]
        )
    if conc is not None:
        rows.append(
            [
                f"{conc['concurrency']} concurrent AsyncMemoryClient.search (searches/s)",
                conc["default_search_per_s"],
                float("nan"),
                f"{conc['concurrency']} concurrent bare HNSW vector queries (queries/s)",
                conc["vector_leg_hnsw_per_s"],
                float("nan"),
                conc["ratio"],
                float("nan"),
                "reported",
            ]
        )
    report.tables.append(
        Table(
            f"Search speed vs the bare vector query of the same run, {DIM}-d (ms; throughput rows: per second)",
            [
                "search",
                "p50",
                "p95",
                "baseline",
                "baseline p50",
                "baseline p95",
                "ratio p50",
                "ratio p95",
                "goal",
            ],
            rows,
            "Default search: MemoryClient.search(user_id, query, now=...) with no overrides (phase 2 and 3 auto), "
            "on a preparing connection, interleaved with the baseline query on its own; the first row's "
            f"baseline is the previous table's reference row (`hnsw.ef_search` {RetrievalConfig().hnsw_ef_search}, "
            "iterative scan, every plan but the HNSW index scan disabled). The conversation-size user is one "
            f"more user loaded after those rows (its hot tier within EXACT_MAX = {EXACT_MAX} and its archive within "
            f"ARCHIVED_EXACT_MAX = {ARCHIVED_EXACT_MAX}: both vector arms exact); its baseline is the bare query as "
            "the planner runs it. "
            f"Throughput: {CONCURRENCY} asyncio tasks in one process, each on its own connection, the held-out "
            f"queries in turn; the ratio column there is bare queries/s over searches/s. 1-minute load average "
            f"after the conversation rows {conv['load_average_1m'] if conv else float('nan'):.1f}, after the "
            f"throughput rows {conc['load_average_1m'] if conc else float('nan'):.1f} (other sessions share the machine).",
        )
    )
