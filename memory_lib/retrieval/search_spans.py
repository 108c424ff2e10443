"""A search's span (memory_lib.observability.trace): its opening attributes, the rerank child span and
its outcome. Modes, limits, ids, tiers and scores only: never the user, the query or a memory's text."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core.config import RetrievalConfig
from ..core.validation import SearchParams
from ..observability.trace import SpanHandle, span
from .rerank import Reranker
from .types import SearchResult, finish_debug


def reranker_name(reranker: Reranker | None) -> str | None:
    """The name a reranker reports (its `name`, else its class name); None without one."""
    return None if reranker is None else getattr(reranker, "name", type(reranker).__name__)


def search_attrs(params: SearchParams, config: RetrievalConfig, reranker: Reranker | None) -> dict[str, Any]:
    """The search span's opening attributes: modes and limits, never the user or the query."""
    return {
        "memory_archive.limit": config.limit if params.limit is None else params.limit,
        "memory_archive.phase2.mode": params.phase2,
        "memory_archive.phase3.mode": params.phase3,
        "memory_archive.reranker": reranker_name(reranker),
    }


def rerank(reranker: Reranker | None, query: str, result: SearchResult) -> SearchResult:
    """The reranker's order of the hits (a child span `rerank`); no reranker: unchanged."""
    if reranker is None:
        return result
    name = reranker_name(reranker)
    with span(
        "rerank", {"memory_archive.reranker": name, "memory_archive.rerank.candidates": len(result.hits)}
    ) as s:
        hits = reranker.rerank(query, result.hits)
        if s.recording:
            s.set({"memory_archive.hit_ids": [str(h.id) for h in hits]})
    return replace(result, hits=hits)


def finish_search(result: SearchResult, s: SpanHandle, reranker: Reranker | None) -> SearchResult:
    """The debug record completed (memory_lib.retrieval.types.finish_debug); the search span's outcome: ids,
    tiers and final scores only (memory_lib.observability.trace: never a text)."""
    result = finish_debug(result, reranker_name(reranker))
    if s.recording:
        esc = result.escalation
        s.set(
            {
                "memory_archive.hits": len(result.hits),
                "memory_archive.hit_ids": [str(h.id) for h in result.hits],
                "memory_archive.hit_tiers": [str(h.source) for h in result.hits],
                "memory_archive.hit_scores": [h.scores.final for h in result.hits],
                "memory_archive.candidates.hot": result.hot_candidates,
                "memory_archive.candidates.archived": result.archived_candidates,
                "memory_archive.phase2.reason": result.phase2_reason,
                "memory_archive.tiers_searched": list(esc.tiers_searched) if esc else None,
                "memory_archive.phase3.action": esc.action if esc else None,
                "memory_archive.phase3.evaluator": esc.evaluator if esc else None,
                "memory_archive.consolidated_ids": [str(h.id) for h in result.consolidated],
            }
        )
    return result
