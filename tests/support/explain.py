"""Reading EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations

from typing import Any


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node below it, depth first."""
    return [node, *(n for child in node.get("Plans", ()) for n in plan_nodes(child))]
