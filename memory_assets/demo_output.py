"""How the demo (memory_assets.demo) prints: section titles, counts and sizes, the search hits of a probe,
and the Dagster run config that leaves the console to the demo's own summary."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memory_lib.retrieval.types import SearchHit, SearchResult

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the demo prints its own summary


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def probe_query(content: str) -> str:
    """A memory's names and numbers (capitalized words, words with digits): what a user remembers of it,
    not its wording. Empty when it has no such word."""
    words = re.findall(r"[#\w][\w'-]*", content)
    return " ".join(w for w in words if w[0].isupper() or any(c.isdigit() for c in w))


def show_hits(result: SearchResult, memory_id: Any, shown: int = 3) -> SearchHit | None:
    """Prints the top `shown` hits and the rank of `memory_id` (marked *); returns its hit, if any."""
    rank = next((i for i, h in enumerate(result) if h.provenance.memory_id == memory_id), None)
    for i, h in enumerate(result):
        if i < shown or i == rank:
            mark = "*" if i == rank else " "
            print(f"  {mark} {i + 1:>2}. {h.scores.final:5.3f} {h.source:<8} {h.labeled_text[:100]}")
    where = "not in the top 10" if rank is None else f"rank {rank + 1} of {len(result)}"
    print(f"the memory: {where}")
    return None if rank is None else result.hits[rank]
