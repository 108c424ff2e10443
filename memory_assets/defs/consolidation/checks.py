"""Checks of consolidation: provenance (every asset) and freshness (monthly_digests). Read-only.

Provenance: every digest, fact and key moment of the partition points only at memories that exist, hot
(memories.id) or archived (archived_memories.original_id), of the SAME user; a digest's lower digests
are the same user's. Freshness: every (user, month) of the partition with archived memories has a
level-2 digest built from the memories as they are now (not stale).

Blocking with ERROR severity: a failed check on monthly_digests stops yearly_digests, memory_facts and
key_moments in the same run, so a year is never built over a month that cites a missing or foreign memory.
"""

import warnings
from datetime import date
from typing import Any

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, SummarizerResource
from memory_lib.consolidation.monthly import check_provenance, missing_digests
from memory_lib.consolidation.sources import period_bounds

from .assets import builders, key_moments, memory_facts, monthly_digests, yearly_digests
from .partitions import TIMEZONE, months, partition_day, years

# partitions_def on an asset check is a preview in 1.13 (see slow_path/checks.py).
warnings.filterwarnings(
    "ignore", message=r"Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)


def _provenance(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, level: int
) -> dg.AssetCheckResult:
    start, end = period_bounds(level, partition_day(context))
    with database.connect() as conn:
        problems = check_provenance(conn, start=start, end=end)
    meta: dict[str, Any] = {"period": f"{start}..{end}", "problems": len(problems)}
    if problems:
        rows = [[p.table, p.row_id[:8], p.user_id, p.memory_id, p.problem] for p in problems[:20]]
        meta["examples"] = markdown_table(["table", "row", "user", "memory", "problem"], rows, width=200)
    return dg.AssetCheckResult(
        passed=not problems,
        metadata=meta,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{len(problems)} references to missing or another user's memories"
            if problems
            else "every reference is to an existing memory of the same user"
        ),
    )


@dg.asset_check(asset=monthly_digests, blocking=True, partitions_def=months)
def monthly_digests_provenance(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> dg.AssetCheckResult:
    """The month's digests, and the facts and key moments already built for it, cite only existing memories
    of their own user."""
    return _provenance(context, database, 2)


@dg.asset_check(asset=monthly_digests, blocking=True, partitions_def=months)
def monthly_digests_fresh(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, summarizer: SummarizerResource
) -> dg.AssetCheckResult:
    """Every user with archived memories in the month has a digest, built from those memories as they are now."""
    month: date = partition_day(context)
    builder, _ = builders(summarizer)
    with database.connect() as conn:
        missing = missing_digests(conn, builder=builder, months=[month], tz=TIMEZONE)
    meta: dict[str, Any] = {"month": str(month), "missing_or_stale": len(missing)}
    if missing:
        meta["users"] = markdown_table(
            ["user", "archived", "problem"],
            [[m["user_id"], m["archived"], m["problem"]] for m in missing[:20]],
        )
    return dg.AssetCheckResult(
        passed=not missing,
        metadata=meta,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(missing)} users' digests missing or stale"
        if missing
        else "every archived month has a digest",
    )


@dg.asset_check(asset=yearly_digests, blocking=True, partitions_def=years)
def yearly_digests_provenance(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> dg.AssetCheckResult:
    """The year's digests (and everything below them in the year) cite only existing memories of their own user."""
    return _provenance(context, database, 3)


@dg.asset_check(asset=memory_facts, blocking=True, partitions_def=months)
def memory_facts_provenance(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> dg.AssetCheckResult:
    """The month's facts cite only existing memories of their own user."""
    return _provenance(context, database, 2)


@dg.asset_check(asset=key_moments, blocking=True, partitions_def=months)
def key_moments_provenance(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> dg.AssetCheckResult:
    """The month's key moments point at existing memories of their own user."""
    return _provenance(context, database, 2)
