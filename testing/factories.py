"""Test memories with the awkward values real data has: float32 edge bits, unicode, nested metadata."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import BatchReport, run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.core.rows import Conn
from memory_lib.llm.embedding import Embedder, HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer, Summarizer, Summary, SummaryInput
from memory_lib.storage.objectstore import ObjectStore
from testing.constants import TEST_DIM

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CONTENTS = [
    "Maya Patel moved Project Atlas standup to Thursday at 09:30; ticket ORD-{i} is blocked.",
    "Kenji Sato booked a flight to Kyoto on 14 March 2026, confirmation code QX{i}, seat 12A.",
    "The user prefers a cortado before 10 am and dislikes oat milk (note #{i}) ☕.",
    "Deploy of Project Heron v2.{i} needs 3 health checks; rollback owner is Amara Okafor.",
    "Jonas Weber said the budget for the Lisbon offsite is EUR {i}00, approved on 2 May 2025.",
]


def edge_embedding(rng: np.random.Generator, dim: int) -> np.ndarray:
    """A float32 vector that includes -0.0, a subnormal and extreme exponents."""
    v = rng.standard_normal(dim).astype(np.float32)
    if dim >= 4:
        v[0] = np.float32(-0.0)
        v[1] = np.float32(1e-45)  # smallest subnormal
        v[2] = np.float32(3.4028235e38) / np.float32(1e30)
        v[3] = np.nextafter(np.float32(1.0), np.float32(2.0))
    return v


def make_memories(
    n: int,
    *,
    dim: int,
    users: tuple[str, ...] = ("alice", "bob"),
    now: datetime = NOW,
    age_days: float = 200,
    importance: float = 0.1,
    embedding_model: str | None = None,
    seed: int = 0,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """n eligible-by-default memories (old, unimportant, unused), round-robin over users."""
    rng = np.random.default_rng(seed)
    model = embedding_model or HashingEmbedder(dim=dim).model
    out = []
    for i in range(n):
        created = now - timedelta(days=age_days, seconds=int(rng.integers(0, 86_400)), microseconds=i)
        out.append(
            {
                "id": uuid.UUID(int=int(rng.integers(0, 2**62)) << 64 | i, version=4),
                "user_id": users[i % len(users)],
                "content": CONTENTS[i % len(CONTENTS)].format(i=1000 + i),
                "embedding": edge_embedding(rng, dim),
                "embedding_model": model,
                "entity_links": [uuid.UUID(int=i + 1, version=4)] if i % 3 else [],
                "metadata": {"source": "chat", "turn": i, "nested": {"ratio": 0.1 * i, "tags": ["a", "ü"]}},
                "domain": "work" if i % 2 else "travel",
                "category": "episodic",
                "importance_score": importance,
                "access_count": i % 2,
                "last_accessed_at": created + timedelta(days=1) if i % 2 else None,
                "created_at": created,
            }
            | overrides
        )
    return out


def parcel_rows(n: int, *, seed: int, dim: int, now: datetime, user_of: Any) -> list[dict[str, Any]]:
    """n memories "Parcel i delivered to the depot" of user `user_of(i)`, one hour apart back from `now`,
    each with a random unit vector from `seed` (labelled as the hashing embedder's): rows for
    insert_memories whose vectors no text query predicts, for plan tests."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        v = rng.normal(size=dim).astype(np.float32)
        rows.append(
            {
                "user_id": user_of(i),
                "content": f"Parcel {i} delivered to the depot",
                "embedding": v / np.linalg.norm(v),
                "embedding_model": HashingEmbedder(dim).model,
                "created_at": now - timedelta(hours=i),
            }
        )
    return rows


def archival_services(
    store: ObjectStore,
    dim: int = TEST_DIM,
    *,
    embedder: Embedder | None = None,
    summarizer: Summarizer | None = None,
) -> ArchivalServices:
    """The archival pipeline's services as the tests run it: offline summaries (extractive unless given),
    hashing embeddings of `dim` (unless an embedder is given), backups in `store`."""
    return ArchivalServices(
        summarizer if summarizer is not None else ExtractiveSummarizer(),
        embedder if embedder is not None else HashingEmbedder(dim=dim),
        store,
    )


def archive_batch(
    conn: Conn,
    store: ObjectStore,
    *,
    as_of: datetime,
    batch_key: str | None = None,
    criteria: ArchivalCriteria | None = None,
    embedder: Embedder | None = None,
    summarizer: Summarizer | None = None,
    actor: str = "test",
) -> BatchReport:
    """One archival batch (run_batch) of what is eligible at `as_of`, with archival_services; the batch key
    is a fresh one unless given. Asserts nothing: a test checks the report it expects."""
    return run_batch(
        conn,
        archival_services(store, embedder=embedder, summarizer=summarizer),
        criteria if criteria is not None else ArchivalCriteria(),
        batch_key=batch_key or f"b-{uuid.uuid4().hex[:8]}",
        as_of=as_of,
        actor=actor,
    )


def archive_cleanly(conn: Conn, store: ObjectStore, **kwargs: Any) -> BatchReport:
    """archive_batch, asserting that the batch passed its gate with no failed memory."""
    report = archive_batch(conn, store, **kwargs)
    assert report.gate_passed and report.status.failed == 0, report.problem
    return report


def make_client(
    conn: Conn,
    store: ObjectStore | None = None,
    *,
    embedder: Embedder | None = None,
    settings: Settings | None = None,
    retrieval: RetrievalConfig | None = None,
    actor: str = "test",
    **kwargs: Any,
) -> MemoryClient:
    """A MemoryClient on `conn` with hashing embeddings of TEST_DIM (unless an embedder is given) and the
    default settings, or the given ones, or the defaults with this `retrieval` config."""
    if retrieval is not None:
        assert settings is None, "make_client takes settings or retrieval, not both"
        settings = Settings(retrieval=retrieval)
    return MemoryClient(
        conn,
        embedder=embedder if embedder is not None else HashingEmbedder(TEST_DIM),
        object_store=store,
        settings=settings,
        actor=actor,
        **kwargs,
    )


def snapshot(conn, ids) -> dict[uuid.UUID, dict[str, Any]]:
    """Every column of the given hot memories, embeddings as raw float32 bytes."""
    from memory_lib.archival.integrity import exact_rows

    return exact_rows(conn, list(ids))


def ranked_hot_hits(texts: list[str], now: datetime) -> list[Any]:
    """SearchHits of hot memories with these texts, best first (similarity 0.9, 0.8, ...), as search ranks
    them with the default RetrievalConfig: input for a reranker without a database."""
    from memory_lib.core.config import RetrievalConfig
    from memory_lib.retrieval.ranking import rank_candidates

    rows = [
        {
            "memory_id": uuid.uuid4(),
            "archive_id": None,
            "user_id": "u1",
            "text": t,
            "created_at": now,
            "updated_at": now,
            "category": "episodic",
            "domain": None,
            "tags": None,
            "storage_ref": None,
            "archived_at": None,
            "similarity": 0.9 - 0.1 * i,
            "in_vector": True,
            "text_rank": None,
        }
        for i, t in enumerate(texts)
    ]
    return list(
        rank_candidates(rows, sources=["hot"] * len(rows), config=RetrievalConfig(), tags=[], now=now)
    )


class FirstSentenceSummarizer:
    """A terse summary like an LLM often writes: the first sentence only, names and numbers dropped, so
    archive rows get lexical fingerprints."""

    kind = "test-first-sentence"
    model = "first-sentence"

    def summarize(self, item: SummaryInput) -> Summary:
        first = re.split(r"(?<=[.!?])\s", item.content.strip(), maxsplit=1)[0]
        words = [w for w in first.split() if not (w[:1].isupper() or any(c.isdigit() for c in w))]
        return Summary(" ".join(words) or "a note", self.model, self.kind, 0, 0, 0.0)
