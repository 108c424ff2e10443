"""Digest and fact rows inserted directly (sql/016), for phase 3 and context tests before the builders exist.

Each row's embedding is its text embedded by the test's embedder, as a builder would store it. Rows are
written as given: a test may insert a bad row (a source id of another user) on purpose.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb


def _vector(embedder: Any, text: str) -> np.ndarray:
    return np.asarray(embedder.embed([text])[0], dtype=np.float32)


def insert_digest(
    conn: psycopg.Connection[Any],
    embedder: Any,
    *,
    user_id: str,
    level: int,
    period_start: date,
    period_end: date,
    summary: str,
    source_memory_ids: Sequence[uuid.UUID],
    body: dict[str, Any] | None = None,
) -> uuid.UUID:
    row = conn.execute(
        """INSERT INTO memory_digests (user_id, level, period_start, period_end, summary, body, embedding,
               embedding_model, source_memory_ids, source_fingerprint, summarizer_kind, summary_model)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'test-fixture', 'test-fixture', 'none') RETURNING id""",
        (
            user_id,
            level,
            period_start,
            period_end,
            summary,
            Jsonb(body or {}),
            _vector(embedder, summary),
            embedder.model,
            list(source_memory_ids),
        ),
    ).fetchone()
    assert row is not None
    return row["id"]


def insert_fact(
    conn: psycopg.Connection[Any],
    embedder: Any,
    *,
    user_id: str,
    subject: str,
    predicate: str,
    obj: str,
    valid_from: datetime,
    source_memory_ids: Sequence[uuid.UUID],
    valid_to: datetime | None = None,
    kind: str = "person",
) -> uuid.UUID:
    text = f"{subject} {predicate} {obj}"
    row = conn.execute(
        """INSERT INTO memory_facts (user_id, kind, subject, predicate, object, valid_from, valid_to,
               source_memory_ids, extractor, embedding, embedding_model)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'test-fixture', %s, %s) RETURNING id""",
        (
            user_id,
            kind,
            subject,
            predicate,
            obj,
            valid_from,
            valid_to,
            list(source_memory_ids),
            _vector(embedder, text),
            embedder.model,
        ),
    ).fetchone()
    assert row is not None
    return row["id"]
