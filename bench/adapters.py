"""The one place where the benchmarks call the library's retrieval, promotion and Slow Path APIs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import psycopg

from memory_lib.archival.nights import run_night
from memory_lib.core.config import PromotionConfig, RetrievalConfig
from memory_lib.core.plans import drive, run_plan
from memory_lib.lifecycle.promotion import expand_flow
from memory_lib.retrieval.search import search_plan
from memory_lib.retrieval.types import SearchRequest


@dataclass(frozen=True)
class Hit:
    source: Literal["hot", "archived"]
    memory_id: uuid.UUID  # the original memory's id (an archive row's original_id)
    similarity: float


def search_engine() -> str:
    return "memory_lib.retrieval.search (two-phase hybrid)"


def search(
    conn: psycopg.Connection[Any],
    *,
    user_id: str,
    query: str,
    embedding: np.ndarray,
    now: datetime,
    hot_limit: int,
    archived_limit: int,
    phase2: Literal["auto", "always", "never"],
    config: RetrievalConfig | None = None,
) -> list[Hit]:
    """Two-phase search for one user, best first. phase2='never' is hot-only."""
    request = SearchRequest(
        user_id=user_id,
        query=query,
        embedding=np.asarray(embedding, dtype=np.float32),
        config=config or RetrievalConfig(),
        now=now,
        phase2=phase2,
        hot_limit=hot_limit,
        archived_limit=archived_limit,
    )
    result = run_plan(conn, search_plan(request))
    return [Hit(h.source, h.provenance.memory_id, h.scores.similarity) for h in result.hits]


def expand_or_promote(
    conn: psycopg.Connection[Any],
    object_store: Any,
    *,
    user_id: str,
    archive_id: uuid.UUID,
    original_id: uuid.UUID,
    now: datetime,
    actor: str = "bench",
) -> bool:
    """One expansion of an archived memory (the 3rd in 30 days re-promotes it); True when it is hot after."""
    expansion = drive(
        conn,
        expand_flow(user_id, archive_id, config=PromotionConfig(), actor=actor, now=now),
        object_store=object_store,
    )
    return bool(expansion.promoted)


def promotion_engine() -> str:
    return "memory_lib.lifecycle.promotion.expand_flow (3rd expansion in 30 days promotes)"


def archival_engine() -> str:
    return "memory_lib.archival.nights.run_night"


def archival_night(conn: psycopg.Connection[Any], services: Any, criteria: Any, night: Any) -> int:
    """One nightly archival run (a batch of up to criteria.batch_size); returns the memories archived."""
    report = run_night(conn, services, criteria, night, "UTC", actor="bench")
    if report.paused is not None and report.paused.paused:
        raise RuntimeError(f"night {night} paused archival: {report.paused.reason}")
    return int(report.archived)
