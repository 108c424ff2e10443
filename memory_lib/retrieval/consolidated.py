"""Search phase 3: digests (levels 2+) and facts of one user (sql/016), and their expansion to memories.

Plans only (see memory_lib.retrieval.search): the clients run them; memory_lib.retrieval.escalation decides when.

* Candidates: per table, the `pool` nearest by cosine and the `pool` best full-text matches (an OR of
  the query's English lexemes, as phases 1-2 do for natural questions), always `user_id = %(user_id)s`.
* Ranking: reciprocal rank fusion over the joint vector list and the joint full-text list of digests
  and facts, relevance = rrf / its maximum in [0, 1]. A closed fact (valid_to set) is still found but
  weighs CLOSED_FACT_WEIGHT, unless its interval overlaps a time the query names: the current value is
  preferred, the old one is shown with its interval.
* Provenance: every hit carries its source memory ids; `expand_sources_plan` returns those memories
  (hot content, or the archived summary and archive id for `expand`) of the same user only. A source id
  that is not one of this user's memories (forgotten, or a bad row) is reported as missing, never read.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any, Literal

import numpy as np

from ..core.errors import InvalidInputError, NotFoundError
from ..core.plans import Plan, Snapshot, Sql
from ..core.timescope import TimeWindow
from ..storage.space import LOCK_VECTOR_TABLES, checked_shape_plan

__all__ = [
    "CLOSED_FACT_WEIGHT",
    "ConsolidatedHit",
    "ExpandedMemory",
    "SourceExpansion",
    "active_digests_plan",
    "consolidated_plan",
    "expand_sources_plan",
    "source_memories_plan",
]

Kind = Literal["digest", "fact"]
KINDS: tuple[Kind, ...] = ("digest", "fact")
CLOSED_FACT_WEIGHT = 0.8
_RRF_K = 60

_TSQUERY = """(SELECT string_agg(quote_literal(l), ' | ')::tsquery
               FROM unnest(tsvector_to_array(to_tsvector('english', %(text_query)s))) AS l)"""
_FACT_TEXT = "(f.subject || ' ' || f.predicate || ' ' || f.object)"  # the GIN index's expression (016)

DIGEST_SQL = f"""
    WITH q AS MATERIALIZED (SELECT {_TSQUERY} AS tsq),
    vec AS (SELECT d.id FROM memory_digests d WHERE d.user_id = %(user_id)s
            ORDER BY d.embedding <=> %(embedding)s::vector LIMIT %(pool)s),
    txt AS (SELECT d.id, ts_rank_cd(to_tsvector('english', d.summary), q.tsq) AS text_rank
            FROM memory_digests d, q
            WHERE q.tsq IS NOT NULL AND d.user_id = %(user_id)s AND to_tsvector('english', d.summary) @@ q.tsq
            ORDER BY text_rank DESC, d.id LIMIT %(pool)s),
    c AS (SELECT id FROM vec UNION SELECT id FROM txt)
    SELECT 'digest' AS kind, d.id, d.user_id, d.summary AS text, d.level, d.period_start, d.period_end, d.body,
           d.source_memory_ids, NULL::timestamptz AS valid_from, NULL::timestamptz AS valid_to,
           d.summarizer_kind AS extractor, NULL::text AS fact_kind,
           1 - (d.embedding <=> %(embedding)s::vector) AS similarity, v.id IS NOT NULL AS in_vector, x.text_rank
    FROM c JOIN memory_digests d ON d.id = c.id LEFT JOIN vec v ON v.id = c.id LEFT JOIN txt x ON x.id = c.id
    WHERE d.user_id = %(user_id)s"""

FACT_SQL = f"""
    WITH q AS MATERIALIZED (SELECT {_TSQUERY} AS tsq),
    vec AS (SELECT f.id FROM memory_facts f WHERE f.user_id = %(user_id)s
            ORDER BY f.embedding <=> %(embedding)s::vector LIMIT %(pool)s),
    txt AS (SELECT f.id, ts_rank_cd(to_tsvector('english', {_FACT_TEXT}), q.tsq) AS text_rank
            FROM memory_facts f, q
            WHERE q.tsq IS NOT NULL AND f.user_id = %(user_id)s AND to_tsvector('english', {_FACT_TEXT}) @@ q.tsq
            ORDER BY text_rank DESC, f.id LIMIT %(pool)s),
    c AS (SELECT id FROM vec UNION SELECT id FROM txt)
    SELECT 'fact' AS kind, f.id, f.user_id, f.subject, f.predicate, f.object, NULL::smallint AS level,
           NULL::date AS period_start, NULL::date AS period_end, '{{}}'::jsonb AS body, f.source_memory_ids,
           f.valid_from, f.valid_to, f.extractor, f.kind AS fact_kind,
           1 - (f.embedding <=> %(embedding)s::vector) AS similarity, v.id IS NOT NULL AS in_vector, x.text_rank
    FROM c JOIN memory_facts f ON f.id = c.id LEFT JOIN vec v ON v.id = c.id LEFT JOIN txt x ON x.id = c.id
    WHERE f.user_id = %(user_id)s"""

# "Active": a digest not yet covered by a higher-level digest of the same user (named as a constant:
# a distributed database routes the statement to the user's shard).
ACTIVE_DIGESTS_SQL = """
    SELECT 'digest' AS kind, d.id, d.user_id, d.summary AS text, d.level, d.period_start, d.period_end, d.body,
           d.source_memory_ids, NULL::timestamptz AS valid_from, NULL::timestamptz AS valid_to,
           d.summarizer_kind AS extractor, NULL::text AS fact_kind, 0.0::float8 AS similarity,
           false AS in_vector, NULL::float8 AS text_rank
    FROM memory_digests d
    WHERE d.user_id = %(user_id)s AND NOT EXISTS (
        SELECT 1 FROM memory_digests h WHERE h.user_id = %(user_id)s AND h.level > d.level
          AND h.period_start <= d.period_start AND h.period_end >= d.period_end)
    ORDER BY d.level DESC, d.period_start DESC
    LIMIT %(limit)s"""

_SOURCES_SQL = {
    "digest": "SELECT source_memory_ids FROM memory_digests WHERE id = %(id)s AND user_id = %(user_id)s",
    "fact": "SELECT source_memory_ids FROM memory_facts WHERE id = %(id)s AND user_id = %(user_id)s",
}

# Both tiers, this user only. A restored memory may have a hot row and an archive row: hot wins.
MEMORIES_SQL = """
    SELECT 'hot' AS tier, m.id AS memory_id, NULL::uuid AS archive_id, m.content AS text, m.created_at
    FROM memories m WHERE m.user_id = %(user_id)s AND m.id = ANY(%(ids)s::uuid[])
    UNION ALL
    SELECT 'archived', a.original_id, a.id, a.summary, a.original_created_at
    FROM archived_memories a WHERE a.user_id = %(user_id)s AND a.original_id = ANY(%(ids)s::uuid[])"""


def _day(d: date) -> str:
    return d.isoformat()


@dataclass(frozen=True)
class ConsolidatedHit:
    """A phase-3 hit: a digest (level >= 2, a period) or a fact (subject predicate object, an interval)."""

    kind: Kind
    id: uuid.UUID
    user_id: str
    text: str  # the digest's summary, or "subject predicate object"
    source_memory_ids: tuple[uuid.UUID, ...]
    similarity: float
    text_rank: float | None
    relevance: float  # fused rank in [0, 1]
    score: float  # relevance x CLOSED_FACT_WEIGHT for a closed fact outside the query's time
    level: int | None = None
    period_start: date | None = None
    period_end: date | None = None  # exclusive
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    extractor: str | None = None  # the digest's summarizer kind, or the fact's extractor
    fact_kind: str | None = None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def current(self) -> bool:
        """A fact still valid (no valid_to); digests are always current."""
        return self.valid_to is None

    @property
    def label(self) -> str:
        return f"[{self.kind}]"

    @property
    def interval(self) -> str:
        """'2025-01 .. 2025-02' for a digest's period; 'since 2024-03-01' or '2024-01-05 .. 2025-03-01 (closed)'."""
        if self.kind == "digest":
            return f"{_day(self.period_start)} .. {_day(self.period_end)}" if self.period_start else ""  # type: ignore[arg-type]
        start = self.valid_from.date().isoformat() if self.valid_from else "?"
        if self.valid_to is None:
            return f"since {start}"
        return f"{start} .. {self.valid_to.date().isoformat()} (closed)"

    @property
    def labeled_text(self) -> str:
        """What a prompt shows: the label, the text, the period or validity, and how many memories back it."""
        level = f" L{self.level}" if self.level else ""
        return (
            f"{self.label}{level} {self.text} ({self.interval}; from {len(self.source_memory_ids)} memories)"
        )

    @property
    def created_at(self) -> datetime | None:
        if self.period_start is not None:
            return datetime.combine(self.period_start, time(), UTC)
        return self.valid_from


def _row_text(row: dict[str, Any]) -> str:
    if row["kind"] == "fact":
        return f"{row['subject']} {row['predicate']} {row['object']}"
    return row["text"]


def _overlaps(row: dict[str, Any], window: TimeWindow | None) -> bool:
    if window is None or row["valid_from"] is None:
        return False
    end = row["valid_to"]
    return row["valid_from"] < window.until and (end is None or end > window.since)


def rank_consolidated(
    rows: Sequence[dict[str, Any]], window: TimeWindow | None = None
) -> list[ConsolidatedHit]:
    """Fuse digests and facts by RRF (vector list by cosine, full-text list by rank), best first."""
    vec = sorted(
        (i for i, r in enumerate(rows) if r["in_vector"]),
        key=lambda i: (-rows[i]["similarity"], str(rows[i]["id"])),
    )
    txt = sorted(
        (i for i, r in enumerate(rows) if r["text_rank"] is not None),
        key=lambda i: (-rows[i]["text_rank"], str(rows[i]["id"])),
    )
    vpos = {i: p for p, i in enumerate(vec, 1)}
    tpos = {i: p for p, i in enumerate(txt, 1)}
    hits = []
    for i, r in enumerate(rows):
        rrf = (1 / (_RRF_K + vpos[i]) if i in vpos else 0.0) + (1 / (_RRF_K + tpos[i]) if i in tpos else 0.0)
        relevance = rrf / (2 / (_RRF_K + 1))
        closed = r["kind"] == "fact" and r["valid_to"] is not None and not _overlaps(r, window)
        hits.append(_hit(r, relevance, relevance * (CLOSED_FACT_WEIGHT if closed else 1.0)))
    return sorted(hits, key=lambda h: (-h.score, h.kind, str(h.id)))


def _hit(r: dict[str, Any], relevance: float, score: float) -> ConsolidatedHit:
    return ConsolidatedHit(
        kind=r["kind"],
        id=r["id"],
        user_id=r["user_id"],
        text=_row_text(r),
        source_memory_ids=tuple(r["source_memory_ids"]),
        similarity=float(r["similarity"]),
        text_rank=float(r["text_rank"]) if r["text_rank"] is not None else None,
        relevance=relevance,
        score=score,
        level=r["level"],
        period_start=r["period_start"],
        period_end=r["period_end"],
        valid_from=r["valid_from"],
        valid_to=r["valid_to"],
        extractor=r["extractor"],
        fact_kind=r["fact_kind"],
        body=r["body"] or {},
    )


def consolidated_plan(
    user_id: str,
    query: str,
    embedding: np.ndarray,
    *,
    kinds: Sequence[Kind] = KINDS,
    limit: int = 10,
    window: TimeWindow | None = None,
    pool: int = 20,
    embedding_model: str | None = None,
) -> Plan[list[ConsolidatedHit]]:
    """Phase 3 for one user: the best `limit` digests and/or facts. Read-only, one snapshot. With
    `embedding_model`, the query vector's space is checked against the active one first (as phases 1-2
    do: a re-embedding flip between the phases must fail loudly, not compare vectors of two spaces)."""
    for kind in kinds:
        if kind not in KINDS:
            raise InvalidInputError("kinds", kind, f"must be among {KINDS}")
    params = {"user_id": user_id, "embedding": embedding, "text_query": query, "pool": max(pool, limit)}
    yield Snapshot()
    if embedding_model is not None:
        yield from checked_shape_plan(int(np.asarray(embedding).size), embedding_model)
    else:
        yield LOCK_VECTOR_TABLES
    rows: list[dict[str, Any]] = []
    if "digest" in kinds:
        rows += yield Sql(DIGEST_SQL, params)
    if "fact" in kinds:
        rows += yield Sql(FACT_SQL, params)
    return rank_consolidated(rows, window)[:limit]


def active_digests_plan(user_id: str, limit: int = 20) -> Plan[list[ConsolidatedHit]]:
    """The user's digests not covered by a higher level (the active digests), highest level first."""
    rows = yield Sql(ACTIVE_DIGESTS_SQL, {"user_id": user_id, "limit": limit})
    return [_hit(r, 0.0, 0.0) for r in rows]


@dataclass(frozen=True)
class ExpandedMemory:
    memory_id: uuid.UUID
    tier: Literal["hot", "archived"]
    archive_id: uuid.UUID | None  # for MemoryClient.expand (the verified original)
    text: str  # hot content, or the archived summary
    created_at: datetime


@dataclass(frozen=True)
class SourceExpansion:
    """A digest's (or fact's) memories, in the order the digest lists them; missing: ids not found for this user."""

    kind: Kind
    id: uuid.UUID
    user_id: str
    memories: list[ExpandedMemory]
    missing: tuple[uuid.UUID, ...]


def expand_sources_plan(user_id: str, kind: Kind, consolidated_id: uuid.UUID) -> Plan[SourceExpansion]:
    """The memories a digest or fact of `user_id` was built from; NotFoundError when it is not theirs."""
    if kind not in KINDS:
        raise InvalidInputError("kind", kind, f"must be among {KINDS}")
    yield Snapshot()
    row = yield Sql(_SOURCES_SQL[kind], {"id": consolidated_id, "user_id": user_id}, "one")
    if row is None:
        raise NotFoundError(f"no {kind} {consolidated_id} for user {user_id!r}")
    memories, missing = yield from source_memories_plan(user_id, row["source_memory_ids"])
    return SourceExpansion(kind, consolidated_id, user_id, memories, missing)


def source_memories_plan(
    user_id: str, ids: Sequence[uuid.UUID]
) -> Plan[tuple[list[ExpandedMemory], tuple[uuid.UUID, ...]]]:
    """`ids` as memories of `user_id` (hot, or archived), in the given order without repeats, and the ids
    that are not this user's memories (missing). A restored memory with both rows reads as hot."""
    ids = list(dict.fromkeys(ids))
    found: dict[uuid.UUID, ExpandedMemory] = {}
    for r in (yield Sql(MEMORIES_SQL, {"user_id": user_id, "ids": ids})):
        if r["memory_id"] not in found or r["tier"] == "hot":
            found[r["memory_id"]] = ExpandedMemory(
                r["memory_id"], r["tier"], r["archive_id"], r["text"], r["created_at"]
            )
    return [found[i] for i in ids if i in found], tuple(i for i in ids if i not in found)
