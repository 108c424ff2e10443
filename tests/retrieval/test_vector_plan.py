"""The vector arm's plan follows the user's size in the tier: exact over a small user's rows, the HNSW
graph for a large one (memory_lib.retrieval.sql.EXACT_MAX, ARCHIVED_EXACT_MAX)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory_lib.retrieval.sql import (
    ARCHIVED_EXACT_MAX,
    ARCHIVED_SEARCH_SQL,
    EXACT_MAX,
    HOT_SEARCH_SQL,
    SEARCH_SETTINGS_SQL,
    search_session_sql,
)
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.explain import base_name, hot_search_plan, search_params
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


def _archive_rows(conn: Any, user: str, n: int, seed: int) -> None:
    """n archive rows of `user` with random sign bits (plan tests: no summarizer, no backup read)."""
    rng = np.random.default_rng(seed)
    bits = ["".join("1" if b else "0" for b in row) for row in rng.random((n, TEST_DIM)) < 0.5]
    with conn.transaction():
        (obj,) = (
            conn.execute(
                "INSERT INTO backup_objects (user_id, ref) VALUES (%s, %s) RETURNING id",
                (user, f"test://{user}"),
            )
            .fetchone()
            .values()
        )
        with conn.cursor().copy(
            "COPY archived_memories (original_id, user_id, summary, summary_embedding_model, original_category,"
            " original_embedding_model, original_updated_at, importance_score, archived_at, original_created_at,"
            " archive_reason, backup_digest, backup_size_bytes, summary_model, summarizer_kind, summary_bits,"
            " backup_object) FROM STDIN"
        ) as copy:
            for i, b in enumerate(bits):
                at = NOW - timedelta(hours=i)
                copy.write_row(
                    (
                        uuid.uuid4(),
                        user,
                        f"Parcel {i} delivered to the depot",
                        "m",
                        "episodic",
                        "m",
                        at,
                        0.1,
                        NOW,
                        at,
                        "force_age",
                        bytes(32),
                        100,
                        "s",
                        "extractive",
                        b,
                        obj,
                    )
                )


def test_a_small_users_archive_is_searched_exactly_up_to_archived_exact_max(conn):
    """Archive rows cost far less to compare than hot vectors (sign bits), so a user's archive is read
    exactly up to ARCHIVED_EXACT_MAX rows, past the hot tier's EXACT_MAX; the exact branch returns the
    true nearest rows by Hamming distance, and a larger archive is walked through the graph."""
    assert EXACT_MAX < 2500 <= ARCHIVED_EXACT_MAX < 4500
    _archive_rows(conn, "small", 2500, seed=5)
    _archive_rows(conn, "big", 4500, seed=6)
    conn.execute("VACUUM (ANALYZE) archived_memories")

    def loops(user: str) -> int:  # hot_search_plan explains any search statement under the search's settings
        nodes = hot_search_plan(conn, ARCHIVED_SEARCH_SQL, user, analyze=True)
        return sum(
            n["Actual Loops"] for n in nodes if base_name(n.get("Index Name")) == "archived_summary_bits_hnsw"
        )

    assert loops("small") == 0
    assert loops("big") >= 1
    params = search_params("small")
    with conn.transaction():
        conn.execute(search_session_sql(100))
        conn.execute(SEARCH_SETTINGS_SQL, {"ef_search": "100", "user_id": "small"})
        found = {
            r["archive_id"] for r in conn.execute(ARCHIVED_SEARCH_SQL, params).fetchall() if r["in_vector"]
        }
    nearest = conn.execute(
        "SELECT id FROM archived_memories WHERE user_id = 'small'"
        " ORDER BY (summary_bits <~> binary_quantize(%s::vector)) + 0, id LIMIT 40",  # no index: every row
        (params["embedding"],),
    ).fetchall()
    assert found == {r["id"] for r in nearest}


# Parallel plans made free, as a large table makes them look: SET LOCAL after the search's settings.
_FREE_PARALLELISM = tuple(
    f"SET LOCAL {name} = 0"
    for name in (
        "parallel_setup_cost",
        "parallel_tuple_cost",
        "min_parallel_table_scan_size",
        "min_parallel_index_scan_size",
    )
)


def test_a_search_starts_no_parallel_workers(conn):
    """Every read of a search is bounded, so parallel workers only add their start-up: at 100k hot +
    400k archived the planner gave a large user's exact archive branch a Gather Merge whose 2 workers
    started even when the branch did not run (4-6 ms a statement). The search's settings turn them off.
    Here parallel plans are made free, as a large table makes them look, and the settings still win."""
    _archive_rows(conn, "big", 4500, seed=6)
    conn.execute("VACUUM (ANALYZE) archived_memories")

    def gathers(statement: str, *local: str) -> int:
        nodes = hot_search_plan(conn, statement, "big", local=_FREE_PARALLELISM + local)
        return sum(1 for n in nodes if n["Node Type"].startswith("Gather"))

    # the control: with workers allowed again, the planner does choose them here
    assert gathers(ARCHIVED_SEARCH_SQL, "SET LOCAL max_parallel_workers_per_gather = 2") >= 1
    assert gathers(ARCHIVED_SEARCH_SQL) == 0
    assert gathers(HOT_SEARCH_SQL) == 0
