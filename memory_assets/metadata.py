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
    """Tier totals as of a night (ints, plotted nightly) and a small per-user distribution: median and
    max per user of each tier, users holding stubs, and the `top` users by memories as a table."""
    users = list(t.by_user.values())
    meta: dict[str, Any] = {
        "hot_memories": t.hot,
        "archived_memories": t.archived,
        "stub_memories": t.stub,
        "users": len(users),
        "users_with_stubs": sum(1 for u in users if u.stub),
    }
    for tier in ("hot", "archived", "stub"):
        values = sorted(getattr(u, tier) for u in users)
        meta[f"{tier}_per_user_p50"] = float(statistics.median(values)) if values else 0.0
        meta[f"max_{tier}_per_user"] = values[-1] if values else 0
    biggest = sorted(t.by_user.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:top]
    meta["tiers_by_user"] = markdown_table(["user", "hot", "archived", "stub"], [[u, *v] for u, v in biggest])
    return meta


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
