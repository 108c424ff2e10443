"""The search filters: `type in (...)` (categories), tags (GIN) and a ts_seen window, served by
their indexes (EXPLAIN on the hot search statement), and what they return."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory_lib.client import MemoryClient
from memory_lib.core.config import Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import HOT_SEARCH_SQL, statement_params
from memory_lib.retrieval.types import SearchFilters
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.explain import PLAN_CONFIG

NOW = datetime(2026, 6, 1, tzinfo=UTC)
CATEGORIES = ("episodic", "semantic", "procedural", "core")


def _seed(conn, n: int = 4000) -> None:
    """n memories of u1 over a year: every 200th procedural, every 250th tagged 'vellmar'; few seen lately."""
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(n, TEST_DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    model = HashingEmbedder(TEST_DIM).model
    rows = []
    for i in range(n):
        created = NOW - timedelta(days=365) + timedelta(minutes=131 * i)
        rows.append(
            {
                "user_id": "u1" if i % 10 else "u2",
                "content": f"Harbour log entry {i} about cargo and tides",
                "embedding": vectors[i],
                "embedding_model": model,
                "category": "procedural" if i % 200 == 0 else CATEGORIES[i % 2],
                "metadata": {"tags": ["vellmar"] if i % 250 == 0 else ["log"]},
                "created_at": created,
                "last_accessed_at": created + timedelta(days=1) if i % 7 == 0 else None,
            }
        )
    insert_memories(conn, rows, actor="test", now=NOW)
    conn.execute("ANALYZE memories")


def _plan(conn, filters: SearchFilters) -> str:
    q = HashingEmbedder(TEST_DIM).embed(["cargo tides harbour"])[0]
    params = statement_params("u1", q, "cargo tides harbour", PLAN_CONFIG, filters) | {"pool": 40}
    rows = conn.execute("EXPLAIN (FORMAT JSON) " + HOT_SEARCH_SQL, params, prepare=False).fetchall()
    return json.dumps(rows[0]["QUERY PLAN"])


def test_type_and_seen_window_use_the_user_type_ts_seen_index(conn):
    _seed(conn)
    plan = _plan(conn, SearchFilters(categories=["procedural"], seen_since=NOW - timedelta(days=120)))
    assert "memories_user_type_seen" in plan
    tags_plan = _plan(conn, SearchFilters(required_tags=["vellmar"]))
    assert "memories_tags" in tags_plan


def test_filters_return_only_matching_memories(conn):
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    t0 = NOW - timedelta(days=60)
    old = client.add("u1", "Ferry timetable changes in winter", category="procedural", tags=["ferry"], now=t0)
    fresh = client.add(
        "u1", "Ferry tickets are sold at the quay", category="procedural", tags=["ferry"], now=t0
    )
    other = client.add(
        "u1", "Ferry crossing was rough last week", category="episodic", tags=["ferry"], now=t0
    )
    untagged = client.add("u1", "Ferry cafe serves cortado", category="procedural", now=t0)
    client.record_access(
        "u1", [fresh.memory_id, other.memory_id, untagged.memory_id], now=NOW - timedelta(days=2)
    )
    window = SearchFilters(
        categories=["procedural"], required_tags=["ferry"], seen_since=NOW - timedelta(days=7)
    )
    hits = client.search("u1", "ferry", filters=window, phase2="never", now=NOW)
    assert [h.provenance.memory_id for h in hits] == [fresh.memory_id]
    before = SearchFilters(categories=["procedural", "episodic"], seen_until=NOW - timedelta(days=7))
    assert [
        h.provenance.memory_id for h in client.search("u1", "ferry", filters=before, phase2="never", now=NOW)
    ] == [old.memory_id]


def test_a_seen_window_the_wrong_way_round_is_refused():
    with pytest.raises(InvalidInputError) as info:
        SearchFilters(seen_since=NOW, seen_until=NOW - timedelta(days=1))
    assert info.value.field == "filters.seen_until"
    with pytest.raises(InvalidInputError) as info:
        SearchFilters(seen_since="2026-01-01")  # type: ignore[arg-type]  # the wrong type is the input under test
    assert info.value.field == "filters.seen_since"


def test_full_text_finds_one_users_matches_in_the_user_tsv_index(conn):
    """The full-text leg's matches read the (user_id, tsvector) GIN index, not a tsvector-only index
    intersected with a btree of the user's rows; archive rows are indexed by (user_id, fingerprint)."""
    _seed(conn)
    plan = _plan(conn, SearchFilters())
    assert "memories_user_tsv" in plan
    assert "memories_content_tsv" not in plan
    indexes = {
        r["indexname"]: r["indexdef"]
        for r in conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN ('memories_user_tsv', 'archived_user_lexemes')"
        ).fetchall()
    }
    assert "gin (user_id, content_tsv)" in indexes["memories_user_tsv"]
    assert (
        "gin (user_id, ((to_tsvector('english'::regconfig, summary) || COALESCE(lexemes"
        in indexes["archived_user_lexemes"]
    )
