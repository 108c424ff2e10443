"""The vector arm's plan follows the user's size in the tier: exact over a small user's rows, the HNSW
graph for a large one (memory_lib.retrieval.sql.EXACT_MAX)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import HOT_SEARCH_SQL
from memory_lib.storage.store import insert_memories
from tests.conftest import TEST_DIM
from tests.support.explain import base_name, hot_search_plan

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _hnsw_loops(conn: Any, user: str) -> int:
    nodes = hot_search_plan(conn, HOT_SEARCH_SQL, user, analyze=True)
    return sum(
        n["Actual Loops"] for n in nodes if base_name(n.get("Index Name")) == "memories_embedding_hnsw"
    )


def test_a_small_user_is_searched_exactly_and_a_large_one_through_the_graph(conn):
    rng = np.random.default_rng(11)
    rows = []
    for i in range(8000):
        v = rng.normal(size=TEST_DIM).astype(np.float32)
        rows.append(
            {
                "user_id": "big" if i >= 30 else "small",
                "content": f"Parcel {i} delivered to the depot",
                "embedding": v / np.linalg.norm(v),
                "embedding_model": HashingEmbedder(TEST_DIM).model,
                "created_at": NOW - timedelta(hours=i),
            }
        )
    insert_memories(conn, rows, actor="test", now=NOW)
    conn.execute("VACUUM (ANALYZE) memories")
    assert _hnsw_loops(conn, "small") == 0
    assert _hnsw_loops(conn, "big") >= 1
