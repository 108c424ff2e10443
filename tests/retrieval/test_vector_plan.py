"""The vector arm's plan follows the user's size in the tier: exact over a small user's rows, the HNSW
graph for a large one (memory_lib.retrieval.sql.EXACT_MAX)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from memory_lib.retrieval.sql import HOT_SEARCH_SQL
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.explain import base_name, hot_search_plan
from testing.factories import parcel_rows

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _hnsw_loops(conn: Any, user: str) -> int:
    nodes = hot_search_plan(conn, HOT_SEARCH_SQL, user, analyze=True)
    return sum(
        n["Actual Loops"] for n in nodes if base_name(n.get("Index Name")) == "memories_embedding_hnsw"
    )


def test_a_small_user_is_searched_exactly_and_a_large_one_through_the_graph(conn):
    rows = parcel_rows(8000, seed=11, dim=TEST_DIM, now=NOW, user_of=lambda i: "big" if i >= 30 else "small")
    insert_memories(conn, rows, actor="test", now=NOW)
    conn.execute("VACUUM (ANALYZE) memories")
    assert _hnsw_loops(conn, "small") == 0
    assert _hnsw_loops(conn, "big") >= 1
