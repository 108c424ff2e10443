"""The gates before originals are deleted, and the audit after.

Both checks on archive_backups are blocking with ERROR severity: when one fails, archive_rows does not
run in that run and archival pauses, so later nights do nothing until an operator clears the pause
(job `clear_archival_pause`, or `memory-archive pause clear`).
"""

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource, ObjectStoreResource
from memory_lib import fidelity, gate, integrity, nights
from memory_lib import pause as pause_switch

from .assets import archive_backups, archive_rows
from .partitions import run_nights

_ACTOR = "slow-path-check"


@dg.asset_check(asset=archive_backups, blocking=True)
def backups_round_trip(
    context: dg.AssetCheckExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    archival: ArchivalCriteriaResource,
) -> dg.AssetCheckResult:
    """Every backup object of the run's nights read back: sha256 and size as recorded, and every field
    equal to its source (the live row, embedding bit for bit; or the archive row once archived)."""
    store = object_store.get_store()
    criteria = archival.get_criteria()
    with database.connect() as conn:
        reports = [
            fidelity.verify_backups(conn, store, nights.batch_key_for(n)) for n in run_nights(context)
        ]
        failures = [(r.batch_key, mid, problem) for r in reports for mid, problem in r.failures.items()]
        if failures:
            sent_back = sum(fidelity.reset_unfaithful_backups(conn, r, criteria) for r in reports)
            pause_switch.set_pause(
                conn, reason=f"backup round trip failed for {len(failures)} memories (first: {failures[0][0]})",
                actor=_ACTOR, batch_key=failures[0][0], details={"check": "backups_round_trip"},
            )  # fmt: skip
    meta: dict[str, object] = {
        "checked": sum(r.checked for r in reports),
        "faithful": sum(r.faithful for r in reports),
        "stale": sum(r.stale for r in reports),
        "failed": len(failures),
        "bytes_read": sum(r.bytes_read for r in reports),
        "duration_s": round(sum(r.seconds for r in reports), 2),
    }
    if failures:
        meta["sent_back_to_backup"] = sent_back
        meta["failures"] = markdown_table(
            ["night", "memory", "problem"], [[k, str(m), p] for k, m, p in failures[:20]], width=240
        )
    return dg.AssetCheckResult(
        passed=not failures,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=meta,
        description=None
        if not failures
        else "backups do not round-trip: no original deleted, archival paused",
    )


@dg.asset_check(asset=archive_backups, blocking=True)
def error_rate_gate(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, archival: ArchivalCriteriaResource
) -> dg.AssetCheckResult:
    """failed ÷ attempted of each night ≤ max_error_rate (5% by default). Fails: archive_rows does not
    run and archival pauses. Paused (nothing to archive): a warning saying why."""
    criteria = archival.get_criteria()
    with database.connect() as conn:
        gates = [
            gate.error_gate(conn, nights.batch_key_for(n), criteria) for n in run_nights(context)
        ]
        failing = [g for g in gates if not g.passed]
        if failing:
            pause = pause_switch.set_pause(
                conn, reason=failing[0].describe() + (f" (+{len(failing) - 1} more nights)" if len(failing) > 1 else ""),
                actor=_ACTOR, batch_key=failing[0].status.batch_key, details={"check": "error_rate_gate"},
            )  # fmt: skip
        else:
            pause = pause_switch.pause_status(conn)
    attempted = sum(g.status.attempted for g in gates)
    failed = sum(g.status.failed for g in gates)
    by_step: dict[str, int] = {}
    for g in gates:
        for step, n in g.status.failed_by_step.items():
            by_step[step] = by_step.get(step, 0) + n
    worst = max(gates, key=lambda g: g.status.error_rate)
    shown = failing or [g for g in gates if g.status.attempted][-10:]
    meta: dict[str, object] = {
        "attempted": attempted,
        "failed": failed,
        "max_error_rate": criteria.max_error_rate,
        "worst_night": worst.status.batch_key,
        "worst_error_rate": round(worst.status.error_rate, 4),
        "nights_failing": len(failing),
        **{f"failed_step_{k}": v for k, v in sorted(by_step.items())},
        "nights": markdown_table(
            ["night", "attempted", "failed", "error rate", "by step"],
            [
                [
                    g.status.batch_key,
                    g.status.attempted,
                    g.status.failed,
                    f"{100 * g.status.error_rate:.1f}%",
                    g.status.failed_by_step,
                ]
                for g in shown[:20]
            ],
        ),  # fmt: skip
        "paused": pause.paused,
    }
    if failing:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=meta,
            description=f"{failing[0].describe()}: originals kept, archival paused",
        )  # fmt: skip
    if pause.paused:
        meta["paused_because"] = pause.describe()
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=meta,
            description=f"{pause.describe()}; clear it with the clear_archival_pause job",
        )  # fmt: skip
    return dg.AssetCheckResult(passed=True, metadata=meta)


@dg.asset_check(asset=archive_rows, blocking=True)
def tiers_consistent(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource, object_store: ObjectStoreResource
) -> dg.AssetCheckResult:
    """Every memory exactly once in hot or archive: no archived original left in memories, none in two
    open attempts, none of the run's archived memories lost, every archive row with its audit event,
    and every committed row's backup still in object storage (HEAD, sampled above 1,000 rows).
    A failure pauses archival: later nights must not build on an inconsistent store."""
    keys = [nights.batch_key_for(n) for n in run_nights(context)]
    store = object_store.get_store()
    with database.connect() as conn:
        report = integrity.integrity_report(conn, keys)
        committed = integrity.verify_committed(conn, store, keys)
        problems = {k: v for k, v in report.problems().items() if v}
        if committed.missing:
            problems["backups_missing"] = len(committed.missing)
        if committed.mismatched:
            problems["backups_mismatched"] = len(committed.mismatched)
        if problems:
            pause_switch.set_pause(
                conn, reason="tier integrity check failed: " + ", ".join(f"{k}={v}" for k, v in problems.items()),
                actor=_ACTOR, batch_key=keys[-1], details={"check": "tiers_consistent"},
            )  # fmt: skip
    meta: dict[str, object] = {
        **report.problems(),
        "archived_by_these_nights": report.archived,
        "backups_checked": committed.checked,
        "backups_missing": len(committed.missing),
        "backups_mismatched": len(committed.mismatched),
    }
    if committed.missing or committed.mismatched:
        meta["bad_backups"] = markdown_table(["storage ref"], [[r] for r in (committed.missing + committed.mismatched)[:20]])
    return dg.AssetCheckResult(passed=not problems, severity=dg.AssetCheckSeverity.ERROR, metadata=meta)
