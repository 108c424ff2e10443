"""The vector arm's plan follows the user's size in the tier: exact over a small user's rows, the HNSW
graph for a large one (memory_lib.retrieval.sql.EXACT_MAX)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import EXACT_MAX, HOT_SEARCH_SQL, MATCH_CAP, SEARCH_SETTINGS_SQL
from memory_lib.retrieval.types import SearchFilters
from memory_lib.storage.store import insert_memories
from tests.conftest import TEST_DIM
from tests.support.explain import base_name, plan_nodes

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _hnsw_loops(conn: Any, user: str) -> int:
    params = {
        "user_id": user,
        "embedding": HashingEmbedder(TEST_DIM).embed(["parcel delivered"])[0],
        "text_query": "parcel delivered",
        "websearch": False,
        "bm25": True,
        "match_cap": MATCH_CAP,
        "exact_max": EXACT_MAX,
        "context_weight": 0.5,
        "context_window": timedelta(minutes=30),
        "pool": 40,
        **SearchFilters().params(),
    }
    with conn.transaction():  # the search's settings are local to its transaction, as in search_plan
        conn.execute(SEARCH_SETTINGS_SQL, {"ef_search": "100"})
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + HOT_SEARCH_SQL, params, prepare=False
        ).fetchone()
    nodes = plan_nodes(plan["QUERY PLAN"][0]["Plan"])
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
