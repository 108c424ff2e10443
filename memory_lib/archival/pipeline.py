"""The one archival pipeline, used by the CLI, the Dagster Slow Path and the bench:

    claim → summarize → embed → back up → verify → fidelity → gate → commit → post-commit

where post-commit (post_commit.post_commit_stage) is the gate again, the tier audit, the stall
diagnosis and the retrievability probe. Each stage checks the archival pause first (paused: it does
nothing and records why), so every caller honours the pause. Dagster runs the stages as assets and
checks (its archive_rows asset calls post_commit_stage itself); `run_batch` runs them in order in
one process. The gate is decided by gate.error_gate alone. Invariants:
* no original is deleted unless the batch's backups round-tripped and its error rate passed the gate;
* a failed fidelity check, gate (before or after commit), tier audit or retrievability probe pauses
  archival;
* a batch whose commit left it above the error rate, or that archived nothing of what it claimed,
  or whose memories wait in a stalled LLM batch submission, or whose archive rows its own first
  sentences no longer find (below RetrievalConfig.retrievability_floor), is a failed run
  (BatchReport.ok is False, with `problem` saying why);
* a batch that archived nothing or less than half of what it claimed says why (BatchReport.stalled,
  BatchReport.why: memory_lib.archival.stalls), whether or not that failed the run;
* two runs of one batch take turns stage by stage (claims.working_on), so a night (or a night's
  shard) launched twice still archives each memory once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

from ..core.config import ArchivalCriteria, RetrievalConfig
from ..core.rows import Conn
from ..core.shards import ALL, Shard
from ..core.statuses import AttemptStatus, Step
from ..lifecycle.pause import PauseState, pause_status, paused_skip, set_pause
from ..llm.embedding import Embedder
from ..llm.summarize import Summarizer
from ..storage.objectstore import ObjectStore
from . import archive, stalls
from .archive import ArchivalServices, BatchStatus, StepResult
from .claims import ClaimResult, Holder, claim_batch, finish_batch, working_on
from .fidelity import FidelityReport, reset_unfaithful_backups, verify_backups
from .gate import GateResult, error_gate, gate_stage
from .integrity import CommittedBackups, IntegrityReport
from .post_commit import post_commit_stage
from .retrievability import NightRetrievability


@dataclass
class StageOutcome:
    """One stage of one batch: what it did, or why it did nothing."""

    batch_key: str
    step: str
    skipped: str | None = None
    claim: ClaimResult | None = None
    results: list[StepResult] = field(default_factory=list)
    night: date | None = None  # set when the batch is a Slow Path night


def _skip(conn: Conn, batch_key: str, step: str) -> StageOutcome | None:
    pause = paused_skip(conn, batch_key, step)
    return None if pause is None else StageOutcome(batch_key, step, skipped=pause.describe())


def claim_stage(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    as_of: datetime,
    *,
    limit: int | None = None,
    holder: Holder | None = None,
    shard: Shard = ALL,
) -> StageOutcome:
    if (skip := _skip(conn, batch_key, "claim")) is not None:
        return skip
    claim = claim_batch(conn, batch_key, criteria, as_of, limit=limit, holder=holder, shard=shard)
    return StageOutcome(batch_key, "claim", claim=claim)


def summarize_stage(
    conn: Conn,
    batch_key: str,
    summarizer: Summarizer,
    embedder: Embedder,
    criteria: ArchivalCriteria,
    *,
    workers: int = 4,
) -> StageOutcome:
    """Summarize the batch's claimed memories, then embed the summaries."""
    if (skip := _skip(conn, batch_key, "summarize")) is not None:
        return skip
    with working_on(conn, batch_key):
        results = [archive.summarize_batch(conn, batch_key, summarizer, criteria, workers=workers)]
        if _has_status(conn, batch_key, AttemptStatus.SUMMARIZED):
            results.append(archive.embed_batch(conn, batch_key, embedder, criteria))
        else:
            results.append(StepResult(Step.EMBED))
    return StageOutcome(batch_key, "summarize", results=results)


def backup_stage(
    conn: Conn,
    batch_key: str,
    store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    workers: int = 8,
) -> StageOutcome:
    if (skip := _skip(conn, batch_key, "backup")) is not None:
        return skip
    with working_on(conn, batch_key):
        result = archive.backup_batch(conn, batch_key, store, criteria, workers=workers)
    return StageOutcome(batch_key, "backup", results=[result])


def fidelity_stage(
    conn: Conn,
    batch_key: str,
    store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    actor: str,
    workers: int = 8,
) -> FidelityReport:
    """Read every backup of the batch back; on a failure, send those memories back to be backed up
    again and pause archival."""
    with working_on(conn, batch_key):
        report = verify_backups(
            conn, store, batch_key, workers=workers, deadline=archive.step_deadline(criteria)
        )
        if not report.passed:
            reset_unfaithful_backups(conn, report, criteria)
            set_pause(
                conn,
                reason=f"backup fidelity failed for {len(report.failures)} memories",
                actor=actor,
                batch_key=batch_key,
                details={"check": "backups_round_trip"},
            )
    return report


def commit_stage(
    conn: Conn,
    batch_key: str,
    store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    actor: str,
    workers: int = 8,
) -> StageOutcome:
    """Replace the batch's backed-up originals by archive rows if the gate passes, then mark the
    batch finished (its remaining open attempts go to the next batch).

    The gate is also a blocking Dagster check before this stage; deciding it again here keeps a run
    that selects this stage alone from deleting originals of a batch that failed it.
    """
    if (skip := _skip(conn, batch_key, "commit")) is not None:
        return skip
    gate = error_gate(conn, batch_key, criteria)
    if not gate.passed:
        return StageOutcome(batch_key, "commit", skipped=gate.describe())
    with working_on(conn, batch_key):
        result = archive.commit_batch(conn, batch_key, store, criteria, actor=actor, workers=workers)
        finish_batch(conn, batch_key)
    return StageOutcome(batch_key, "commit", results=[result])


def _has_status(conn: Conn, batch_key: str, status: str) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM archival_attempts WHERE batch_key = %s AND status = %s) AS e",
        (batch_key, status),
    ).fetchone()
    assert row is not None  # a SELECT without FROM returns exactly one row
    return bool(row["e"])


@dataclass
class BatchReport:
    batch_key: str
    outcomes: list[StageOutcome]
    status: BatchStatus
    fidelity: FidelityReport | None = None
    gate: GateResult | None = None  # the last gate decided: after commit when commit ran
    integrity: IntegrityReport | None = None
    committed: CommittedBackups | None = None
    paused: PauseState | None = None  # the pause that stopped or was set by this batch
    stall: stalls.Stall | None = None  # why the batch archived nothing or little, when it did
    retrievability: NightRetrievability | None = None  # the probe after commit, when commit ran

    @property
    def claim(self) -> ClaimResult | None:
        return next((o.claim for o in self.outcomes if o.claim), None)

    @property
    def steps(self) -> list[StepResult]:
        return [r for o in self.outcomes for r in o.results]

    @property
    def archived(self) -> int:
        return sum(r.succeeded for o in self.outcomes if o.step == "commit" for r in o.results)

    @property
    def gate_passed(self) -> bool:
        return self.gate is not None and self.gate.passed and (self.fidelity is None or self.fidelity.passed)

    @property
    def problem(self) -> str | None:
        """Why this batch is a failed run, or None when it did its job (or had nothing to do); with
        why it archived little (`why`) when it stalled."""
        failure, why = self._failure(), self.why
        if failure is None:
            return why if self.stall is not None and self.stall.failure else None
        return f"{failure}; {why}" if why and why not in failure else failure

    def _failure(self) -> str | None:
        skipped = next((o.skipped for o in self.outcomes if o.skipped), None)
        if skipped:
            return skipped
        if self.fidelity is not None and not self.fidelity.passed:
            return f"{self.batch_key}: backup fidelity failed for {len(self.fidelity.failures)} memories"
        if self.gate is not None and not self.gate.passed:
            return self.gate.describe()
        if self.integrity is not None and not self.integrity.passed:
            return f"{self.batch_key}: tier integrity failed: {self.integrity.problems()}"
        if self.committed is not None and not self.committed.passed:
            return (
                f"{self.batch_key}: {len(self.committed.missing)} committed backups missing, "
                f"{len(self.committed.mismatched)} differ"
            )
        if self.retrievability is not None and not self.retrievability.passed:
            return self.retrievability.describe() + ": archived memories are not findable, archival paused"
        return None

    @property
    def stalled(self) -> bool:
        return self.stall is not None and self.stall.stalled

    @property
    def why(self) -> str | None:
        """Why the batch archived nothing or less than half of what it claimed (None when it did not)."""
        return self.stall.why if self.stall is not None else None

    @property
    def ok(self) -> bool:
        return self.problem is None


def run_batch(
    conn: Conn,
    services: ArchivalServices,
    criteria: ArchivalCriteria,
    *,
    batch_key: str,
    as_of: datetime,
    actor: str,
    limit: int | None = None,
    workers: int = 4,
    io_workers: int = 16,
    holder: Holder | None = None,
    shard: Shard = ALL,
    retrieval: RetrievalConfig | None = None,
) -> BatchReport:
    """Run one batch (of `shard`'s users) through every stage in this process (see the module docstring),
    the post-commit stage (post_commit.post_commit_stage) included, its retrievability probe searching
    with `retrieval` (default RetrievalConfig()).

    `workers` bounds concurrent summaries (LLM calls); `io_workers` concurrent object requests (puts,
    read-backs, commit's HEADs): each waits on the network, not on the CPU.
    """
    store = services.object_store
    outcomes = [claim_stage(conn, batch_key, criteria, as_of, limit=limit, holder=holder, shard=shard)]
    report = BatchReport(batch_key, outcomes, archive.batch_status(conn, batch_key))
    if outcomes[0].skipped:
        report.paused = pause_status(conn)
        return report
    outcomes.append(
        summarize_stage(conn, batch_key, services.summarizer, services.embedder, criteria, workers=workers)
    )
    outcomes.append(backup_stage(conn, batch_key, store, criteria, workers=io_workers))
    report.fidelity = fidelity_stage(conn, batch_key, store, criteria, actor=actor, workers=io_workers)
    if report.fidelity.passed:
        report.gate = gate_stage(conn, batch_key, criteria, actor=actor)
    if report.fidelity.passed and report.gate is not None and report.gate.passed:
        outcomes.append(commit_stage(conn, batch_key, store, criteria, actor=actor, workers=io_workers))
        after = post_commit_stage(
            conn,
            batch_key,
            store,
            services.embedder,
            criteria,
            retrieval or RetrievalConfig(),
            actor=actor,
        )
        report.gate, report.stall, report.retrievability = after.gate, after.stall, after.retrievability
        report.integrity, report.committed = after.audit.integrity, after.audit.committed
    report.status = archive.batch_status(conn, batch_key)
    if report.stall is None:  # no commit: diagnosed here (the post-commit stage did it otherwise)
        report.stall = stalls.diagnose(conn, batch_key, report.status)
    if report.problem is not None:
        report.paused = pause_status(conn)
    return report
