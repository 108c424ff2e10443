"""retention_scores: each night's retention scores of the hot memories, before the night's claim.

Thin: memory_lib.lifecycle.retention keeps the scores incrementally in SQL (a night computes only the
memories written, used or re-categorized since the last one, one statement per batch of users) and the
streaks at the floor that policy `retention` archives on (memory_lib.lifecycle.eligibility). Each night records
its own numbers (metadata.record_nights): the score distribution (quantiles, 0.1-wide buckets, per
category) and the tiers per user as of the end of that night, so the UI plots them night by night.
"""

import time
from datetime import date

import dagster as dg

from memory_assets.metadata import markdown_table, record_nights, tier_metadata
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource
from memory_lib.archival import nights
from memory_lib.core.config import Settings
from memory_lib.lifecycle import retention

from .partitions import SLOW_PATH, backfill_policy, run_nights, run_shard
from .partitions import nights as night_partitions


def _distribution_metadata(d: retention.Distribution) -> dict[str, object]:
    meta: dict[str, object] = {
        "scored": d.scored,
        "at_floor": d.at_floor,
        "ready_for_retention_archival": d.ready,
    }
    if d.mean is not None:
        meta["retention_mean"] = round(d.mean, 4)
    meta |= {f"retention_p{round(q * 100):02d}": round(v, 4) for q, v in d.quantiles.items()}
    meta |= {f"retention_{i * 10:02d}_{(i + 1) * 10:02d}": n for i, n in enumerate(d.buckets)}
    meta["by_category"] = markdown_table(
        ["category", "memories", "at floor", "min", "median"],
        [
            [c, v["n"], v["at_floor"], round(v["min"], 3), round(v["median"], 3)]
            for c, v in d.by_category.items()
        ],
    )
    return meta


@dg.asset(
    partitions_def=night_partitions,
    backfill_policy=backfill_policy,
    group_name="slow_path",
    owners=["team:memory-archive"],
    tags={"domain": "archival", "tier": "slow_path"},
    kinds={"postgres"},
    code_version="1",
)
def retention_scores(
    context: dg.AssetExecutionContext, database: DatabaseResource, archival: ArchivalCriteriaResource
) -> dg.MaterializeResult:
    """Retention scores of every hot memory as of the end of each night (exponential decay by category
    since the last access, slower with each retrieval, never below the category's floor: core 0.60)
    and its nights at the floor (an access restarts the count). A night computes only the memories
    written, used or re-categorized since the last night (`computed`); the others' scores follow from
    what is kept, so the night's cost does not grow with the table. With MEMORY_ARCHIVE_POLICY=retention the
    claim archives a non-core memory after cold_migration_days (7) nights at the floor."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    config = Settings.from_env().retention
    shard = run_shard(context)  # a shard run scores its own users; the distribution is every user's
    by_night: dict[date, dict[str, object]] = {}
    with database.connect() as conn:
        for night in run_nights(context):
            as_of = nights.night_as_of(night, SLOW_PATH.timezone)
            run = retention.score(conn, as_of, config, timezone=SLOW_PATH.timezone, shard=shard)
            dist = retention.distribution(conn, as_of, cold_migration_days=criteria.cold_migration_days)
            by_night[night] = {
                "policy": criteria.policy,
                "shard": str(shard),
                "users_computed": run.users,
                "computed": run.scored,
                "settings_changed": run.settings_changed,
                "statements": run.statements,
                "duration_s": round(run.seconds, 2),
                **_distribution_metadata(dist),
                **tier_metadata(retention.tier_counts(conn, as_of)),
            }
    record_nights(context, by_night)
    ns = sorted(by_night)
    context.log.info(f"scored: {len(ns)} night(s) {ns[0]}..{ns[-1]} in {time.monotonic() - started:.2f}s")
    return dg.MaterializeResult()
