"""Why a batch archived nothing, or far fewer than it claimed: the diagnosis a run reports.

A batch is *stalled* when it archived less than half of what it claimed, or when some of its memories
wait in an LLM batch submission that is itself stalled (memory_lib.llm.batches.Held.stalled: a create left
without a provider batch, or a provider batch past the providers' 24 h). `why` then names, in this
order: the submissions holding its memories (how many, status, since when, the provider's error),
the submissions of its memories the provider refused since the batch was claimed, the failures by
step with the most frequent error, and what is left unexplained.

A stall is a *failure* (the run is not ok) when a stalled submission holds memories of the batch:
they would otherwise wait there run after run while later runs archive what came after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.rows import Conn, Row
from ..llm import batches
from .archive import BatchStatus, batch_status


@dataclass(frozen=True)
class Stall:
    batch_key: str
    claimed: int
    archived: int
    held: list[batches.Held] = field(default_factory=list)
    stalled: bool = False
    why: str | None = None

    @property
    def failure(self) -> bool:
        return any(h.stalled for h in self.held)


def _top_error(conn: Conn, batch_key: str) -> Row | None:
    return conn.execute(
        """SELECT failed_step, error, count(*) AS n FROM archival_attempts
           WHERE batch_key = %s AND error IS NOT NULL AND status <> 'archived'
           GROUP BY 1, 2 ORDER BY 3 DESC, 1 LIMIT 1""",
        (batch_key,),
    ).fetchone()


def diagnose(conn: Conn, batch_key: str, status: BatchStatus | None = None) -> Stall:
    """The batch's stall, from the database (every run of the batch so far); `status`: the batch's
    archive.batch_status when the caller has just read it."""
    status = status if status is not None else batch_status(conn, batch_key)
    claimed, archived = status.attempted, status.archived
    held = batches.held_submissions(conn, batch_key)
    stalled = any(h.stalled for h in held) or (claimed > 0 and 2 * archived < claimed)
    if not stalled:
        return Stall(batch_key, claimed, archived, held)
    parts = [h.describe() for h in sorted(held, key=lambda h: not h.stalled)]
    batch = conn.execute("SELECT created_at FROM archival_batches WHERE batch_key = %s", (batch_key,))
    claimed_at = batch.fetchone()
    ids = [
        r["memory_id"]
        for r in conn.execute(
            "SELECT memory_id FROM archival_attempts WHERE batch_key = %s", (batch_key,)
        ).fetchall()
    ]
    if claimed_at is not None and ids:
        for r in batches.refused_submissions(conn, ids, claimed_at["created_at"]):
            parts.append(
                f"LLM batch {r['submission_key']} of {r['memories']} memories failed: {r['error']}; "
                "its memories went to synchronous summaries"
            )
    if status.failed:
        steps = ", ".join(f"{k}: {v}" for k, v in sorted(status.failed_by_step.items()))
        top = _top_error(conn, batch_key)
        parts.append(
            f"{status.failed} memories failed ({steps})"
            + (f", most often: {' '.join(top['error'].split())[:300]}" if top else "")
        )
    if not parts:
        parts.append(f"{claimed - archived} claimed memories are not archived yet (no failure recorded)")
    why = f"{batch_key}: archived {archived} of {claimed} claimed; " + "; ".join(parts)
    return Stall(batch_key, claimed, archived, held, True, why)
