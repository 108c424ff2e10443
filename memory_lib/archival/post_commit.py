"""The post-commit stage: what every caller runs on a batch right after its commit, in this order
(pipeline.run_batch for the CLI and the bench, the Dagster archive_rows asset per night):

1. the gate after commit (gate.gate_stage, after_commit=True): pauses archival when it fails;
2. the tier audit (integrity.audit_batch, kept on the batch): pauses archival when it fails;
3. the stall diagnosis (stalls.diagnose): reported, never a pause (the next run resolves a submission);
4. the retrievability probe (retrievability.probe_night, kept on the batch): a batch below
   RetrievalConfig.retrievability_floor pauses archival (`pause_unfindable`).

Invariants: every step runs whatever the steps before it found (each records what it saw, so an
operator sees every problem of the batch at once); a pause keeps its first cause (lifecycle.pause).
A caller running several batches in one run may defer the retrievability pause to the end of the
run (`pause_retrievability=False`, then `pause_unfindable` with every batch's result), so the run's
later batches still commit what passed their own gates; its later runs archive nothing until an
operator clears the pause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.config import ArchivalCriteria, RetrievalConfig
from ..core.rows import Conn
from ..lifecycle.pause import set_pause
from . import retrievability, stalls
from .gate import GateResult, gate_stage
from .integrity import TierAudit, audit_batch
from .retrievability import NightRetrievability

if TYPE_CHECKING:
    from ..llm.embedding import Embedder
    from ..storage.objectstore import ObjectStore

# The `details.check` of a pause set by the retrievability probe: the Dagster check that reports it.
RETRIEVABILITY_CHECK = "archive_retrievable"


@dataclass(frozen=True)
class PostCommit:
    """One committed batch's post-commit results (each also kept in the database for the checks)."""

    gate: GateResult  # after commit
    audit: TierAudit
    stall: stalls.Stall
    retrievability: NightRetrievability

    @property
    def passed(self) -> bool:
        """The gate, the audit and the probe passed (a stall is reported on its own: stall.failure)."""
        return self.gate.passed and self.audit.passed and self.retrievability.passed


def post_commit_stage(
    conn: Conn,
    batch_key: str,
    store: ObjectStore,
    embedder: Embedder,
    criteria: ArchivalCriteria,
    retrieval: RetrievalConfig,
    *,
    actor: str,
    pause_retrievability: bool = True,
) -> PostCommit:
    """Run the four post-commit steps on `batch_key` (see the module docstring), each with its pause."""
    gate = gate_stage(conn, batch_key, criteria, actor=actor, after_commit=True)
    audit = audit_batch(conn, store, batch_key)  # kept on the batch for the tiers_consistent check
    if not audit.passed:
        set_pause(
            conn,
            reason=f"{batch_key}: tier integrity failed: "
            + ", ".join(f"{k}={v}" for k, v in audit.problems().items()),
            actor=actor,
            batch_key=batch_key,
            details={"check": "tiers_consistent"},
        )
    stall = stalls.diagnose(conn, batch_key)
    probe = retrievability.probe_night(conn, embedder, store, batch_key, config=retrieval)
    retrievability.record(conn, probe)  # for the read-only archive_retrievable check
    if pause_retrievability:
        pause_unfindable(conn, [probe], actor=actor, batch_key=batch_key)
    return PostCommit(gate, audit, stall, probe)


def pause_unfindable(
    conn: Conn, results: Sequence[NightRetrievability], *, actor: str, batch_key: str
) -> None:
    """Pause archival when any of `results` is below its floor (nothing when all passed); the reason
    names the first such batch and how many more there were. `batch_key`: the batch the pause is
    recorded against (the run's last)."""
    unfindable = [r.describe() for r in results if not r.passed]
    if not unfindable:
        return
    more = f" (+{len(unfindable) - 1} more nights)" if len(unfindable) > 1 else ""
    set_pause(
        conn,
        reason=unfindable[0] + more,
        actor=actor,
        batch_key=batch_key,
        details={"check": RETRIEVABILITY_CHECK},
    )
