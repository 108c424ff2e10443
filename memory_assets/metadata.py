"""Small helpers that turn memory_lib results into Dagster metadata the UI renders well."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from memory_lib.lifecycle.retention import TierCounts
from memory_lib.storage.objectstore import ObjectStore


def _cell(value: Any, width: int = 160) -> str:
    text = " ".join(str("" if value is None else value).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, width: int = 160
) -> dg.MetadataValue:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v, width) for v in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines))


def counts(prefix: str, values: Mapping[str, int]) -> dict[str, int]:
    """{'claimed_force_age': 12, ...}: plain ints plot over time in the UI, a dict does not."""
    return {f"{prefix}_{k}": int(v) for k, v in sorted(values.items())}


def by_month(rows: Sequence[tuple[str, Sequence[int]]], limit: int = 40) -> list[tuple[str, Sequence[int]]]:
    """Per-night rows, folded into months when there are more than `limit` nights (a backfill)."""
    if len(rows) <= limit:
        return list(rows)
    months: dict[str, list[int]] = {}
    for night, values in rows:
        acc = months.setdefault(night[:7], [0] * len(values))
        for i, v in enumerate(values):
            acc[i] += v
    return list(months.items())


def tier_metadata(t: TierCounts, *, top: int = 10) -> dict[str, Any]:
    """Tiers at the end of the night t is of (retention.tier_counts: the night's own archival and stubs
    included, whenever they ran), plotted nightly: hot memories, archived memories (every archive row,
    stubs included: hot + archived is every memory) and, of the archived, the stubs; a small per-user
    distribution (median and max per user of each), users holding stubs, and the `top` users by
    memories as a table."""
    users = {u: (v.hot, v.archived + v.stub, v.stub) for u, v in t.by_user.items()}
    meta: dict[str, Any] = {
        "hot_memories": t.hot,
        "archived_memories": t.archived + t.stub,
        "stub_memories": t.stub,
        "users": len(users),
        "users_with_stubs": sum(1 for _, _, stub in users.values() if stub),
    }
    for i, tier in enumerate(("hot", "archived", "stub")):
        values = sorted(v[i] for v in users.values())
        meta[f"{tier}_per_user_p50"] = float(statistics.median(values)) if values else 0.0
        meta[f"max_{tier}_per_user"] = values[-1] if values else 0
    biggest = sorted(users.items(), key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))[:top]
    meta["tiers_by_user"] = markdown_table(
        ["user", "hot", "archived (stubs included)", "of which stubs"], [[u, *v] for u, v in biggest]
    )
    return meta


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB': a size as people read it (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def size_metadata(key: str, n: int, *, note: str = "") -> dict[str, Any]:
    """A size in two entries: `key` (its unit in its name: hot_table_bytes), an int the UI plots, and the
    same key with "bytes" as "size" (hot_table_size), the size as text with its unit, '12.3 MiB
    (12,897,484 bytes)', then `note` when given (what the size is of, and when)."""
    if "bytes" not in key:
        raise ValueError(f"key={key!r}: a size's key names its unit, bytes")
    text = f"{human_bytes(n)} ({n:,} bytes)" + (f"; {note}" if note else "")
    return {key: int(n), key.replace("bytes", "size"): text}


def store_location(store: ObjectStore) -> str:
    """file://<root>/<prefix> or s3://<bucket>/<prefix>: where this deployment's backups live."""
    return store.ref_for(store.prefix) if store.prefix else type(store).__name__


def record_nights(context: dg.AssetExecutionContext, by_night: Mapping[Any, Mapping[str, Any]]) -> None:
    """One materialization per night with that night's own numbers.

    A run over a range of nights (BackfillPolicy.multi_run) records a MaterializeResult's metadata on
    every partition of the range, so totals would show on each night; metadata added per partition
    key goes only to that night's event. Callers return a MaterializeResult without metadata.
    """
    for night, metadata in by_night.items():
        context.add_asset_metadata(dict(metadata), partition_key=str(night))
