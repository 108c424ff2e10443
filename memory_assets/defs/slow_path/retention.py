"""retention_scores: each night's retention scores of the hot memories, before the night's claim.

Thin: memory_lib.lifecycle.retention keeps the scores incrementally in SQL (a night computes only the
memories written, used or re-categorized since the last one, one statement per batch of users) and the
streaks at the floor that policy `retention` archives on (memory_lib.lifecycle.eligibility). Each night records
its own numbers (metadata.record_nights): the score distribution (quantiles, 0.1-wide buckets, per
category), so the UI plots it night by night.

No tier counts here: this step runs before the night's claim (in a run over several nights, before any
of them is archived), so the tiers it could read are not the night's. The tiers at the end of each
night are on archive_rows and stub_conversions, which run after the night's archival.
"""

import time
from datetime import date, timedelta

import dagster as dg

from memory_assets.metadata import markdown_table, record_nights
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource
from memory_lib.archival import nights
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


def _population(night: date, run: list[date]) -> str:
    """Which memories the night's distribution covers: the hot ones when the run scored them."""
    text = "the memories hot when this run scored them, created by the end of the night"
    if night != run[0]:
        text += (
            f"; this run scores {run[0]}..{run[-1]} before archiving any of them, so memories that "
            f"its nights {run[0]}..{night - timedelta(days=1)} archive are among them"
        )
    return text


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
    config = database.run_settings().retention
    shard = run_shard(context)  # a shard run scores its own users; the distribution is every user's
    by_night: dict[date, dict[str, object]] = {}
    in_run = run_nights(context)
    with database.connect() as conn:
        for night in in_run:
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
                "scores_of": _population(night, in_run),
            }
    record_nights(context, by_night)
    ns = sorted(by_night)
    context.log.info(f"scored: {len(ns)} night(s) {ns[0]}..{ns[-1]} in {time.monotonic() - started:.2f}s")
    return dg.MaterializeResult()
