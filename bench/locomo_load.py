"""Loading a conversation through the user's path (add per turn, cached vectors), archiving its old turns
and consolidating it, as the locomo bench does."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal

import numpy as np

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.consolidation.digests import ExtractiveDigestBuilder, build_level
from memory_lib.consolidation.facts import RuleFactExtractor
from memory_lib.consolidation.monthly import consolidate_month
from memory_lib.consolidation.sources import user_months
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import InvalidInputError
from memory_lib.core.models import NewMemory
from memory_lib.llm.summarize import (
    ExtractiveSummarizer,
    Summarizer,
)
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.storage.store import insert_memories

from .common import (
    stopwatch,
)
from .locomo_data import CUTOFF_DAYS, DB, Conversation


class CachedVectors:
    """The run's embedder, with the vectors of known texts (turns, questions) computed ahead in one batch:
    loading and searching stay fast, and search latency leaves out embedding the query. Any other text (a
    summary, a refined query, a chunk) goes to the run's embedder, one batch per call; `misses` counts
    them."""

    def __init__(self, embedder: Any, texts: Sequence[str]):
        unique = list(dict.fromkeys(texts))
        vectors = np.asarray(embedder.embed(unique), dtype=np.float32).reshape(len(unique), embedder.dim)
        self._embedder, self._ahead = embedder, dict(zip(unique, vectors, strict=True))
        self.model: str = embedder.model
        self.dim: int = embedder.dim
        self.kind: Literal["semantic", "lexical"] = getattr(embedder, "kind", "semantic")
        self.max_tokens: int | None = getattr(embedder, "max_tokens", None)
        self.misses = 0

    def vector(self, text: str) -> np.ndarray:
        return self._ahead[text]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._ahead))
        self.misses += len(todo)
        fresh = (
            dict(zip(todo, np.asarray(self._embedder.embed(todo), dtype=np.float32), strict=True))
            if todo
            else {}
        )
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._ahead[t] if t in self._ahead else fresh[t] for t in texts])


def load_turns(conn: DB, conv: Conversation, embedder: Any) -> np.ndarray:
    """Fixture loader (footprint's LoCoMo check; not this benchmark, which writes through the client):
    every turn as a hot memory of its own with id turn.memory_id, bypassing the write path. Returns the
    turns' vectors (float32, in turn order)."""
    vectors = np.asarray(embedder.embed([t.content for t in conv.turns]), dtype=np.float32)
    insert_memories(
        conn,
        [
            NewMemory(
                id=t.memory_id,
                user_id=conv.sample_id,
                content=t.content,
                embedding=v,
                embedding_model=embedder.model,
                created_at=t.created_at,
                metadata={"dia_id": t.dia_id},
            )
            for t, v in zip(conv.turns, vectors, strict=True)
        ],
        actor="bench",
        now=conv.now,
    )
    settle(conn)
    return vectors


@dataclass
class Loaded:
    """What the client's write path made of a conversation's turns."""

    holds: dict[uuid.UUID, list[str]]  # memory id (every chunk's) -> the dia_ids of the turns it holds
    outcomes: Counter[str]  # created / duplicate / merged / superseded / refused
    rows: int  # rows in `memories` after loading
    seconds: float

    def dia_ids(self, memory_ids: Sequence[uuid.UUID]) -> list[str]:
        return [d for m in memory_ids for d in self.holds.get(m, ())]


def add_turns(client: MemoryClient, conn: DB, conv: Conversation) -> Loaded:
    """Every turn through `MemoryClient.add`, as an agent that remembers each turn would."""
    holds: dict[uuid.UUID, list[str]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    with stopwatch() as t:
        for turn in conv.turns:
            try:
                res = client.add(
                    conv.sample_id, turn.content, metadata={"dia_id": turn.dia_id}, now=turn.created_at
                )
            except InvalidInputError:  # e.g. a text that looks like a credential: not stored
                outcomes["refused"] += 1
                continue
            outcomes[res.outcome] += 1
            if res.outcome == "superseded" and res.previous_id is not None:
                holds[res.memory_id] += holds.pop(res.previous_id, [])  # the survivor holds both turns
            for mid in res.chunk_ids or (res.memory_id,):
                holds[mid].append(turn.dia_id)
    return Loaded(dict(holds), outcomes, hot_rows(conn), t[0])


def hot_rows(conn: DB) -> int:
    row = conn.execute("SELECT count(*) AS n FROM memories").fetchone()
    assert row is not None
    return int(row["n"])


def settle(conn: DB) -> None:
    """The tables as autovacuum leaves them within a minute of a large change (it analyzes a table once
    10% of its rows changed, vacuums at 20%). Searched at once after loading a conversation or archiving
    80% of it, a search is planned from stale statistics over dead rows: 7x slower (tiered p50 145 ms vs
    21 ms on conversation 0; ANALYZE alone gives 40 ms)."""
    conn.execute("VACUUM (ANALYZE) memories, archived_memories")


def archive_old(
    conn: DB,
    conv: Conversation,
    embedder: Any,
    store: LocalObjectStore,
    summarizer: Summarizer | None = None,
    cutoff_days: int = CUTOFF_DAYS,
) -> int:
    """Archive every memory older than `cutoff_days` (the dataset's cut-off; LoCoMo's by default) before
    `now`, whatever its importance, by run_batch (default summarizer: ExtractiveSummarizer)."""
    criteria = ArchivalCriteria(
        min_age_days=cutoff_days,
        force_archive_age_days=cutoff_days,
        max_importance_score=1.0,
        exempt_categories=(),
    )
    services = ArchivalServices(summarizer or ExtractiveSummarizer(), embedder, store)
    archived, i = 0, 0
    while True:
        rep = run_batch(conn, services, criteria, batch_key=f"locomo-{i}", as_of=conv.now, actor="bench")
        if rep.claim is None:
            raise RuntimeError(f"{conv.sample_id}: archival claimed nothing, paused: {rep.paused}")
        if rep.claim.claimed == 0:
            settle(conn)
            return archived
        if not rep.gate_passed:
            raise RuntimeError(f"{conv.sample_id}: archival batch failed its error gate: {rep.status}")
        archived += rep.status.archived
        i += 1


DIGEST_BUILDER = ExtractiveDigestBuilder()


FACT_EXTRACTOR = RuleFactExtractor()


def consolidate(conn: DB, user_id: str, embedder: Any) -> dict[str, int]:
    """What a deployment's consolidation assets build for one user: `consolidate_month` (level-2 digest,
    facts, key moments) for every month with memories, then each year's level-3 digest; row counts."""
    months = [m for _, m in user_months(conn, user_id=user_id)]
    for month in months:
        consolidate_month(
            conn, month, builder=DIGEST_BUILDER, extractor=FACT_EXTRACTOR, embedder=embedder, users=[user_id]
        )
    for year in sorted({m.year for m in months}):
        build_level(conn, 3, user_id, date(year, 1, 1), builder=DIGEST_BUILDER, embedder=embedder)
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memory_digests WHERE user_id = %(u)s AND level = 2) AS digests_l2,
                  (SELECT count(*) FROM memory_digests WHERE user_id = %(u)s AND level = 3) AS digests_l3,
                  (SELECT count(*) FROM memory_facts WHERE user_id = %(u)s) AS facts,
                  (SELECT count(*) FROM key_moments WHERE user_id = %(u)s) AS key_moments""",
        {"u": user_id},
    ).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}
