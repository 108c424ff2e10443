"""The gates before originals are deleted, and the audit after: read-only, one result per night.

Both checks on archive_backups are blocking with ERROR severity: when one fails for a night,
archive_rows does not run in that run. They only read: the writes of a failed gate (unfaithful
backups sent back, the pause with who/why/when) are made by the asset archive_backups, which decides
the same gate just before (see assets.py). So a check re-run from the UI changes nothing, and says
what is true now. Archival stays paused until an operator clears it (job `clear_archival_pause`, or
`memory-archive pause clear`).

Each check is partitioned like its asset and emits one evaluation per night of its run, with the
night's partition key, also when a run covers a range of nights (dg.AssetCheckEvaluation with
`partition`; Dagster plans one check row per partition of a ranged run and fills each).
"""

import warnings
from collections.abc import Iterator, Mapping
from datetime import date
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,  # not exported; AssetCheckResult fills it the same way
)

from memory_assets.metadata import markdown_table, size_metadata
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource, ObjectStoreResource
from memory_lib.archival import fidelity, gate, integrity, nights
from memory_lib.core.rows import Conn, Row
from memory_lib.lifecycle import pause as pause_switch

from .assets import archive_backups, archive_rows
from .partitions import nights as night_partitions
from .partitions import run_nights, run_shard

NOTHING = "nothing to check"
# partitions_def on an asset check is a preview in 1.13 (checked to work on 1.13.27, ranged runs too):
# say so once, here; tests/dagster/test_dagster_truth.py catches a breaking change.
warnings.filterwarnings(
    "ignore", message=r"Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)


def evaluation(
    context: dg.AssetCheckExecutionContext,
    asset: dg.AssetsDefinition,
    night: date,
    *,
    passed: bool,
    metadata: Mapping[str, Any],  # Dagster metadata values
    description: str | None = None,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetCheckEvaluation:
    """The check's result for one night (of the run's shard), tied to the night's materialization by
    this run, else the night's latest (concurrent shard runs each materialize the night)."""
    name = context.check_specs[0].name
    recent = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[str(night)]), limit=20
    ).records
    latest = [r for r in recent if r.event_log_entry.run_id == context.run.run_id] or recent[:1]
    target = (
        AssetCheckEvaluationTargetMaterializationData(
            run_id=latest[0].event_log_entry.run_id,
            storage_id=latest[0].storage_id,
            timestamp=latest[0].timestamp,
        )
        if latest
        else None
    )
    metadata = {"shard": str(run_shard(context)), **metadata}
    return dg.AssetCheckEvaluation(
        asset_key=asset.key,
        check_name=name,
        passed=passed,
        metadata=metadata,
        description=description,
        severity=severity,
        blocking=True,
        partition=str(night),
        target_materialization_data=target,
    )


def _open_after_failed_round_trip(conn: Conn, batch_key: str) -> list[Row]:
    """Memories of the night sent back to be backed up again after a failed round trip, not yet re-done."""
    return conn.execute(
        """SELECT memory_id, error FROM archival_attempts
           WHERE batch_key = %s AND failed_step = 'fidelity' AND status IN ('claimed', 'summarized', 'embedded')
           ORDER BY memory_id""",
        (batch_key,),
    ).fetchall()


# asset_check's type wants one AssetCheckResult; Dagster also runs generator checks (one result a night).
@dg.asset_check(asset=archive_backups, blocking=True, partitions_def=night_partitions)  # type: ignore[arg-type]
def backups_round_trip(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, object_store: ObjectStoreResource
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """Every backup object of the night read back: sha256 and size as recorded, and every field
    equal to its source (the live row, embedding bit for bit; or the archive row once archived); and
    no memory of the night still waiting for its backup to be rewritten after a failed round trip."""
    store = object_store.get_store()
    with database.connect() as conn:
        for night in run_nights(context):
            key = nights.batch_key_for(night, run_shard(context))
            report = fidelity.verify_backups(conn, store, key)
            sent_back = _open_after_failed_round_trip(conn, key)
            failures = [(str(m), p) for m, p in report.failures.items()]
            failures += [
                (str(r["memory_id"]), f"sent back after a failed round trip: {r['error']}") for r in sent_back
            ]
            meta: dict[str, object] = {
                "checked": report.checked,
                "faithful": report.faithful,
                "stale": report.stale,
                "erased": report.erased,  # forgotten while the night read them: not failures
                "failed": len(failures),
                **size_metadata("bytes_read", report.bytes_read, note="backups read back this night"),
                "duration_s": round(report.seconds, 2),
                "nothing_to_check": report.checked == 0 and not failures,
            }
            if failures:
                meta["failures"] = markdown_table(["memory", "problem"], failures[:20], width=240)
                description = f"{key}: {len(failures)} backups do not round-trip: no original deleted"
            elif report.checked == 0:
                description = f"{NOTHING}: {key} has no backup yet (nothing claimed, or paused)"
            else:
                description = f"{report.checked} backups round-trip"
            yield evaluation(
                context, archive_backups, night, passed=not failures, metadata=meta, description=description
            )
    yield dg.Output(None)


# asset_check's type wants one AssetCheckResult; Dagster also runs generator checks (one result a night).
@dg.asset_check(asset=archive_backups, blocking=True, partitions_def=night_partitions)  # type: ignore[arg-type]
def error_rate_gate(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, archival: ArchivalCriteriaResource
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """failed ÷ attempted of the night ≤ max_error_rate (5% by default). Fails: archive_rows does not
    run (archive_backups has paused archival). Paused: a warning saying why, by whom and when."""
    criteria = archival.get_criteria()
    with database.connect() as conn:
        pause = pause_switch.pause_status(conn)
        for night in run_nights(context):
            g = gate.error_gate(conn, nights.batch_key_for(night, run_shard(context)), criteria)
            s = g.status
            meta: dict[str, object] = {
                "attempted": s.attempted,
                "failed": s.failed,
                "error_rate": round(s.error_rate, 4),
                "max_error_rate": criteria.max_error_rate,
                **{f"failed_step_{k}": v for k, v in sorted(s.failed_by_step.items())},
                "paused": pause.paused,
                "nothing_to_check": s.attempted == 0,
            }
            if pause.paused:
                meta |= {
                    "paused_because": pause.reason or "",
                    "paused_by": pause.actor or "",
                    "paused_at": pause.changed_at.isoformat(),
                }
            if not g.passed:
                yield evaluation(
                    context,
                    archive_backups,
                    night,
                    passed=False,
                    metadata=meta,
                    description=f"{g.describe()}: originals kept",
                )
            elif pause.paused:
                yield evaluation(
                    context,
                    archive_backups,
                    night,
                    passed=False,
                    metadata=meta,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=f"{pause.describe()}; clear it with the clear_archival_pause job",
                )
            else:
                text = f"{NOTHING}: no attempt this night" if s.attempted == 0 else g.describe()
                yield evaluation(
                    context, archive_backups, night, passed=True, metadata=meta, description=text
                )
    yield dg.Output(None)


# asset_check's type wants one AssetCheckResult; Dagster also runs generator checks (one result a night).
@dg.asset_check(asset=archive_rows, blocking=True, partitions_def=night_partitions)  # type: ignore[arg-type]
def tiers_consistent(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """Every memory exactly once in hot or archive: no archived original left in memories, none in two
    open attempts, none of the night's archived memories lost, every archive row with its audit event,
    and every committed row's backup still in object storage (HEAD, sampled above 1,000 rows).

    archive_rows audits each night right after its commit, keeps the audit on the batch and pauses
    archival when it fails; this check reports that audit (with its time), as archive_retrievable
    reports the probe: it repeats neither the queries nor the HEADs."""
    with database.connect() as conn:
        for night in run_nights(context):
            key = nights.batch_key_for(night, run_shard(context))
            audit = integrity.recorded_audit(conn, key)
            if audit is None:
                yield evaluation(
                    context,
                    archive_rows,
                    night,
                    passed=True,
                    metadata={"nothing_to_check": True},
                    description=f"{NOTHING}: {key} has no commit audited yet",
                )
                continue
            problems = audit.problems()
            meta: dict[str, object] = {
                **audit.integrity.problems(),
                "archived_by_this_night": audit.integrity.archived,
                "backups_checked": audit.committed.checked,
                "backups_missing": len(audit.committed.missing),
                "backups_mismatched": len(audit.committed.mismatched),
                "backups_recovered_from_versions": len(audit.committed.recovered),
                "audited_at": audit.audited_at.isoformat(),
                "nothing_to_check": audit.integrity.archived == 0 and not problems,
            }
            bad = audit.committed.missing + audit.committed.mismatched
            if bad:
                meta["bad_backups"] = markdown_table(["storage ref"], [[r] for r in bad[:20]])
            if problems:
                description = f"{key}: " + ", ".join(f"{k}={v}" for k, v in problems.items())
            elif audit.integrity.archived == 0:
                description = f"{NOTHING}: {key} archived nothing"
            else:
                description = f"{audit.integrity.archived} archive rows consistent"
                if audit.committed.recovered:
                    description += (
                        f"; {len(audit.committed.recovered)} backups deleted or overwritten after "
                        "their verification were put back from their recorded versions"
                    )
            yield evaluation(
                context, archive_rows, night, passed=not problems, metadata=meta, description=description
            )
    yield dg.Output(None)
