"""`reembedding`: fill the second vector columns of an open re-embedding migration (memory_lib.lifecycle.reembedding).

Static partitions, table kind x hash bucket of the row id ("hot-0" .. "facts-3"): a partition is a fixed
slice of rows whatever the data, so the UI's backfill of all partitions covers everything, parallel runs
never claim the same rows (FOR UPDATE SKIP LOCKED makes overlap harmless anyway), and a failed slice is
re-run alone. The secondary space (the target while running, the old space once flipped) comes from the
database's migration record, so the same asset serves the flip back's backfill. Kept thin: every rule
lives in memory_lib.lifecycle.reembedding.
"""

import time
import warnings

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource
from memory_lib.lifecycle import reembedding as lib

warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy`", category=dg.BetaWarning)

BUCKETS = 4
partitions = dg.StaticPartitionsDefinition([f"{kind}-{b}" for kind in lib.KINDS for b in range(BUCKETS)])


def _slice(key: str) -> tuple[lib.Kind, int]:
    kind, bucket = key.rsplit("-", 1)
    return kind, int(bucket)  # type: ignore[return-value]


class ReembeddingConfig(dg.Config):
    batch_size: int = 256  # rows embedded and written per transaction


@dg.asset(
    partitions_def=partitions,
    group_name="reembedding",
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
)
def reembedding(
    context: dg.AssetExecutionContext, config: ReembeddingConfig, database: DatabaseResource
) -> dg.MaterializeResult:
    """Embed the partition's pending rows with the secondary space's embedder, a batch per transaction,
    until none is left; metadata: rows done, remaining, rows/s. Without an open migration: nothing."""
    kind, bucket = _slice(context.partition_key)
    started = time.monotonic()
    done = 0
    with database.connect() as conn:
        migration = lib.active_migration(conn)
        if migration is None:
            return dg.MaterializeResult(metadata={"migration": "none open", "rows_done": 0, "remaining": 0})
        embedder = lib.embedder_for(*migration.secondary, database.run_settings().embedding)
        while n := lib.backfill_batch(
            conn, embedder, kind, config.batch_size, bucket=bucket, buckets=BUCKETS
        ):
            done += n
            context.log.debug(f"{kind} bucket {bucket}: {done} rows")
        remaining = lib.pending(conn, kind, bucket=bucket, buckets=BUCKETS)
    seconds = time.monotonic() - started
    return dg.MaterializeResult(
        metadata={
            "migration": migration.id,
            "state": migration.state,
            "columns": migration.suffix,
            "model": f"{migration.secondary[0]} ({migration.secondary[1]}-d)",
            "rows_done": done,
            "remaining": remaining,
            "seconds": round(seconds, 2),
            "rows_per_s": round(done / seconds, 1) if seconds > 0 else 0.0,
        }
    )


@dg.asset_check(asset=reembedding, blocking=True)
def reembedding_coverage(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> dg.AssetCheckResult:
    """Every row of every vector table has its second vector: the flip can run. Until then it fails with
    WARN when the run's own slice is complete (other partitions are still to run: a backfill in progress
    is not an error), with ERROR when the run's slice (or, run alone, anything) is left uncovered. The
    flip job refuses on its own too, whatever this check said."""
    ctx = context.op_execution_context
    own = _slice(ctx.partition_key) if ctx.has_partition_key else None
    with database.connect() as conn:
        migration = lib.active_migration(conn)
        left = lib.coverage(conn)
        own_left = lib.pending(conn, own[0], bucket=own[1], buckets=BUCKETS) if own else None
    missing = sum(left.values())
    severity = dg.AssetCheckSeverity.WARN if own_left == 0 else dg.AssetCheckSeverity.ERROR
    return dg.AssetCheckResult(
        passed=migration is not None and missing == 0,
        severity=severity,
        metadata={
            "uncovered": missing,
            "by_table": markdown_table(["table", "uncovered"], sorted(left.items())),
        },
        description=(
            "no re-embedding is open"
            if migration is None
            else f"{missing} rows without a {migration.suffix} vector"
            if missing
            else f"every row has its {migration.suffix} vector ({migration.secondary[0]})"
        ),
    )
