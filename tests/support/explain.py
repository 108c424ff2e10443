"""Reading EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations

import re
from typing import Any


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node below it, depth first."""
    return [node, *(n for child in node.get("Plans", ()) for n in plan_nodes(child))]


def base_name(name: str | None) -> str | None:
    """A relation or index name without the partition suffix (`memories_p003` -> `memories`,
    `memories_embedding_hnsw_p003` -> `memories_embedding_hnsw`): the same plans on a schema
    partitioned by user (memory_lib.storage.partitioning) read the partition's own table and index."""
    return None if name is None else re.sub(r"_p\d{3}$", "", name)
