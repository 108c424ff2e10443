"""stub_conversions: each night, archive rows unused for stub_after_days (180) become stubs.

Thin: memory_lib.lifecycle.stubs verifies each backup (HEAD) and drops the summary vector of the rows whose
backup is there as recorded, one transaction per batch, with a 'stubbed' audit event per row; a
re-run changes nothing. A shard run converts its own users' rows. Each night records its own numbers
(metadata.record_nights): rows stubbed, kept back (backup not verified), and the tiers at the end of
the night, its archival and stubs included (hot / archived / of them stubs, totals and per user, every
user's: memory_lib.lifecycle.retention.tier_counts). It runs after archive_rows, so in a run over
several nights every night of the run is archived before its tiers are read: they are the same
figures archive_rows records for the night.

The blocking check `stubs_backed_up` HEADs the backup of every stub (of the run's shard): a stub's
original lives only there.
"""

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime

import dagster as dg

from memory_assets.metadata import markdown_table, record_nights, tier_metadata
from memory_assets.resources import DatabaseResource, ObjectStoreResource
from memory_lib.archival import nights
from memory_lib.lifecycle import retention, stubs

from .assets import STORE_KIND, archive_rows
from .checks import evaluation
from .partitions import SLOW_PATH, backfill_policy, run_nights, run_shard
from .partitions import nights as night_partitions


@dg.asset(
    partitions_def=night_partitions,
    backfill_policy=backfill_policy,
    group_name="slow_path",
    owners=["team:memory-archive"],
    tags={"domain": "archival", "tier": "slow_path"},
    kinds={"postgres", STORE_KIND},
    code_version="2",
    deps=[archive_rows],
)
def stub_conversions(
    context: dg.AssetExecutionContext, database: DatabaseResource, object_store: ObjectStoreResource
) -> dg.MaterializeResult:
    """Turn archived memories neither expanded nor used for stub_after_days (a
    cold-storage TTL, 180 days) into stubs: summary vector dropped (never returned by vector search),
    summary and full-text entry kept, original still in object storage (verified before). Expanding a
    stub re-embeds its summary; 3 expansions in 30 days re-promote it. Core memories are exempt."""
    started = time.monotonic()
    days = database.run_settings().retention.stub_after_days
    shard = run_shard(context)
    store = object_store.get_store()
    by_night: dict[date, dict[str, object]] = {}
    with database.connect() as conn:
        for night in run_nights(context):
            as_of = nights.night_as_of(night, SLOW_PATH.timezone)
            run = stubs.convert(conn, store, as_of, stub_after_days=days, shard=shard, actor=nights.ACTOR)
            meta: dict[str, object] = {
                "shard": str(shard),
                "stub_after_days": days,
                "due": run.due,
                "stubbed": run.stubbed,
                "kept_unverified": len(run.unverified),
                "duration_s": round(run.seconds, 2),
                **tier_metadata(retention.tier_counts(conn, as_of)),
            }
            if run.unverified:
                meta["unverified_backups"] = markdown_table(
                    ["storage ref", "problem"], list(run.unverified.items())[:20], width=240
                )
            by_night[night] = meta
    record_nights(context, by_night)
    ns = sorted(by_night)
    context.log.info(f"stubs: {len(ns)} night(s) {ns[0]}..{ns[-1]} in {time.monotonic() - started:.2f}s")
    return dg.MaterializeResult()


# asset_check's type wants one AssetCheckResult; Dagster also runs generator checks (one result a night).
@dg.asset_check(asset=stub_conversions, blocking=True, partitions_def=night_partitions)  # type: ignore[arg-type]
def stubs_backed_up(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, object_store: ObjectStoreResource
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """Every stub (of the run's shard) still has its backup: HEAD matches the recorded sha256, size and
    version id. Read-only; the result is the state now, reported on each night of the run."""
    shard = run_shard(context)
    with database.connect() as conn:
        report = stubs.verify_stub_backups(conn, object_store.get_store(), shard=shard)
    meta: dict[str, object] = {
        # Every stub of the run's users now, whichever night this result is on.
        "stubs_checked": f"every stub{'' if shard.is_all else f' of shard {shard}'} at "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, after this run (not as of this night)",
        "stubs": report.stubs,
        "backups_missing": len(report.missing),
        "backups_mismatched": len(report.mismatched),
        "nothing_to_check": report.stubs == 0,
    }
    bad = [[r, "missing"] for r in report.missing] + [[r, p] for r, p in report.mismatched.items()]
    if bad:
        meta["bad_backups"] = markdown_table(["storage ref", "problem"], bad[:20], width=240)
        description = f"{len(bad)} of {report.stubs} stubs without their verified backup"
    else:
        description = (
            f"{report.stubs} stubs, each with its backup" if report.stubs else "nothing to check: no stub"
        )
    for night in run_nights(context):
        yield evaluation(
            context, stub_conversions, night, passed=report.passed, metadata=meta, description=description
        )
    yield dg.Output(None)
