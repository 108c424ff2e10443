"""Reading EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from memory_lib.core.config import RetrievalConfig
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import SEARCH_SETTINGS_SQL, search_session_sql, statement_params
from memory_lib.retrieval.types import SearchFilters
from testing.constants import TEST_DIM


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node below it, depth first; on Citus, also the nodes of each task's plan on its
    worker (a distributed statement's plan holds them under "Distributed Query")."""
    children = list(node.get("Plans", ()))
    for task in node.get("Distributed Query", {}).get("Job", {}).get("Tasks", ()):
        children += [p["Plan"] for plans in task.get("Remote Plan", ()) for p in plans]
    return [node, *(n for child in children for n in plan_nodes(child))]


def base_name(name: str | None) -> str | None:
    """A relation or index name without the partition suffix (`memories_p003` -> `memories`,
    `memories_embedding_hnsw_p003` -> `memories_embedding_hnsw`): the same plans on a schema
    partitioned by user (memory_lib.storage.partitioning) read the partition's own table and index;
    nor a Citus shard's (`memories_102008`): a worker reads its shard's table and index."""
    return None if name is None else re.sub(r"_p\d{3}$", "", re.sub(r"_\d{6,}$", "", name))


# The settings the plan readers search with: the defaults, with context at half a match's score.
PLAN_CONFIG = RetrievalConfig(context_weight=0.5)


def search_statement_tier(sql: str) -> str | None:
    """Which tiers a statement of retrieval.sql searches ("hot", "archived", "both"), None for any other
    statement. Read from its vector arms' CTEs, so it holds on partitioned tiers too, where each graph
    walk names the user's partition."""
    hot, archived = "m_exact AS" in sql, "a_exact AS" in sql
    return "both" if hot and archived else "hot" if hot else "archived" if archived else None


PLAN_QUERY = "parcel delivered"  # what the plan readers ask


def search_params(user: str) -> dict[str, Any]:
    """The parameters of a search statement of retrieval.sql: PLAN_QUERY asked by `user`, pools of 40."""
    embedding = HashingEmbedder(TEST_DIM).embed([PLAN_QUERY])[0]
    return statement_params(user, embedding, PLAN_QUERY, PLAN_CONFIG, SearchFilters()) | {"pool": 40}


def hot_search_plan(
    conn: Any, sql: str, user: str, *, analyze: bool = False, local: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The nodes of the plan of a hot search statement (retrieval.sql's, PLAN_QUERY asked by `user`),
    under the search's own session settings in their transaction, as search_plan runs it; `local`: more
    SET LOCAL statements after those (on Citus they reach the worker too)."""
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) "
    with conn.transaction():  # the search's settings are local to its transaction, as in search_plan
        conn.execute(search_session_sql(100))  # SET LOCALs that reach a Citus worker too
        conn.execute(SEARCH_SETTINGS_SQL, {"ef_search": "100", "user_id": user})
        for statement in local:
            conn.execute(statement)
        plan = conn.execute(explain + sql, search_params(user), prepare=False).fetchone()
    return plan_nodes(plan["QUERY PLAN"][0]["Plan"])
