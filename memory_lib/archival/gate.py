"""The error-rate gate: the one rule that decides whether a batch may delete originals, and whether
a batch that ran its commit did what it claimed to do.

Invariants:
* Before commit: failed / attempted ≤ max_error_rate, or no original of the batch is deleted.
* After commit: the same rule over every step including verify and commit, and a batch that
  claimed memories must have archived at least one, leaving aside the memories that wait in an LLM
  batch submission (the provider answers within its own window, often the next night: waiting is not
  failing; a submission that stalls is reported by memory_lib.archival.stalls). A batch failing either is a
  failed run (the CLI exits non-zero, the Dagster asset fails) and archival pauses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..core.config import ArchivalCriteria
from ..core.rows import Conn
from ..lifecycle.pause import set_pause
from .archive import BatchStatus, batch_status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateResult:
    status: BatchStatus
    max_error_rate: float
    after_commit: bool = False
    waiting: int = 0  # claimed memories waiting in an LLM batch submission, without an error

    @property
    def archived_nothing(self) -> bool:
        return self.after_commit and self.status.attempted - self.waiting > 0 and self.status.archived == 0

    @property
    def passed(self) -> bool:
        return self.status.error_rate <= self.max_error_rate and not self.archived_nothing

    def describe(self) -> str:
        s = self.status
        verdict = "within" if s.error_rate <= self.max_error_rate else "above"
        text = (
            f"{s.batch_key}: {s.failed}/{s.attempted} failed ({100 * s.error_rate:.1f}%), "
            f"{verdict} max_error_rate {100 * self.max_error_rate:.1f}%"
        )
        if s.failed_by_step:
            text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(s.failed_by_step.items())) + ")"
        if self.archived_nothing:
            text += f"; archived 0 of {s.attempted} claimed"
        if self.waiting:
            text += f"; {self.waiting} wait in an LLM batch submission"
        return text


def error_gate(
    conn: Conn, batch_key: str, criteria: ArchivalCriteria, *, after_commit: bool = False
) -> GateResult:
    """The gate for `batch_key` now (no attempts: passes). `after_commit` adds "archived something"."""
    row = conn.execute(
        """SELECT count(*) AS n FROM archival_attempts
           WHERE batch_key = %s AND status = 'claimed' AND llm_submission IS NOT NULL AND error IS NULL""",
        (batch_key,),
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns exactly one row
    waiting = row["n"]
    return GateResult(batch_status(conn, batch_key), criteria.max_error_rate, after_commit, waiting)


def gate_stage(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    *,
    actor: str,
    after_commit: bool = False,
) -> GateResult:
    """Decide the gate (error_gate) and pause archival when it fails."""
    gate = error_gate(conn, batch_key, criteria, after_commit=after_commit)
    if not gate.passed:
        log.error("%s: originals of the failed memories kept, archival paused", gate.describe())
        set_pause(
            conn,
            reason=gate.describe(),
            actor=actor,
            batch_key=batch_key,
            details={"check": "error_rate_gate", "after_commit": after_commit},
        )
    return gate
