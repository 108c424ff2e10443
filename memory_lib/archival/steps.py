"""The plumbing every archival step shares: its result, its checkpoints, its failures, its threads,
its deadline, and the view of a batch's checkpoints (memory_lib.archival.archive runs the steps)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from ..core.config import ArchivalCriteria
from ..core.errors import DeadlineExceeded
from ..core.rows import Conn, Row, server_now
from ..core.statuses import AttemptStatus
from .claims import renew_lease

log = logging.getLogger("memory_lib.archival.archive")

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class StepResult:
    step: str
    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    released: int = 0
    bytes_written: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    waiting: int = 0  # memories left waiting in a provider batch still running (summarize only)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BatchStatus:
    batch_key: str
    by_status: dict[str, int]
    attempted: int
    failed: int
    failed_by_step: dict[str, int]

    @property
    def error_rate(self) -> float:
        return self.failed / self.attempted if self.attempted else 0.0

    @property
    def archived(self) -> int:
        return self.by_status.get(AttemptStatus.ARCHIVED, 0)


# --------------------------------------------------------------------------- step plumbing


def pending_attempts(conn: Conn, batch_key: str, status: str, extra_cols: str = "") -> list[Row]:
    return conn.execute(
        f"""SELECT a.memory_id, a.user_id, a.archive_reason, a.attempts, a.llm_submission {extra_cols}
            FROM archival_attempts a WHERE a.batch_key = %s AND a.status = %s ORDER BY a.memory_id""",
        (batch_key, status),
    ).fetchall()


def record_failure(
    conn: Conn,
    batch_key: str,
    memory_id: uuid.UUID,
    step: str,
    exc: BaseException,
    criteria: ArchivalCriteria,
    result: StepResult,
    *,
    user_id: str,
) -> None:
    message = f"{type(exc).__name__}: {exc}"[:1000]
    now = server_now(conn)  # a parameter: Citus refuses now() inside CASE on a distributed table
    row = conn.execute(
        """UPDATE archival_attempts
           SET attempts = attempts + 1, failed_step = %(step)s, error = %(error)s, updated_at = %(now)s,
               status = CASE WHEN attempts + 1 >= %(max)s THEN 'released' ELSE status END,
               released_at = CASE WHEN attempts + 1 >= %(max)s THEN %(now)s::timestamptz END
           WHERE batch_key = %(batch)s AND user_id = %(user)s AND memory_id = %(id)s RETURNING status""",
        {
            "step": step,
            "error": message,
            "now": now,
            "max": criteria.max_attempts,
            "batch": batch_key,
            "user": user_id,
            "id": memory_id,
        },
    ).fetchone()
    result.failed += 1
    if row and row["status"] == "released":
        result.released += 1
    if len(result.errors) < 20:
        result.errors.append(f"{memory_id}: {message}")
    log.warning("archival %s failed for memory %s: %s", step, memory_id, message)


CHECKPOINT_CHUNK = 500  # rows per checkpoint transaction


class Checkpoints:
    """Record each memory's outcome of one step: successes written in sets (one pipelined
    executemany per transaction of up to CHECKPOINT_CHUNK rows, not one commit per row), failures
    recorded per memory. A value the database refuses (DataError: a NUL, a bad vector) fails that
    memory only: its set is written again one row at a time, so its neighbours are still recorded.

    `params(memory_id, outcome)` gives the UPDATE's parameters but the last; the memory's user (from
    `users`, memory id -> user id) is appended, so `sql` ends with `AND user_id = %s` and each row
    routes to its user's shard. Raising in `params` fails that memory only.
    `saved(outcome)` runs once per memory whose checkpoint was written.
    """

    def __init__(
        self,
        conn: Conn,
        batch_key: str,
        step: str,
        sql: str,
        params: Callable[[uuid.UUID, Any], Sequence[Any]],
        criteria: ArchivalCriteria,
        result: StepResult,
        saved: Callable[[Any], None] | None = None,
        before_flush: Callable[[], None] | None = None,
        *,
        users: Mapping[uuid.UUID, str],
    ) -> None:
        self.conn, self.batch_key, self.step, self.sql = conn, batch_key, step, sql
        self.users = users
        self.params, self.criteria, self.result, self.saved = params, criteria, result, saved
        self.before_flush = before_flush
        self._pending: list[tuple[uuid.UUID, Any, Sequence[Any]]] = []
        self._held = False

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The checkpoints added inside are written in the same transaction (no flush between them)."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
        if len(self._pending) >= CHECKPOINT_CHUNK:
            self.flush()

    def add(self, memory_id: uuid.UUID, outcome: Any) -> None:
        self.result.processed += 1
        if not isinstance(outcome, BaseException):
            try:
                p = (*self.params(memory_id, outcome), self.users[memory_id])
                self._pending.append((memory_id, outcome, p))
            except Exception as exc:
                outcome = exc
            else:
                if len(self._pending) >= CHECKPOINT_CHUNK and not self._held:
                    self.flush()
                return
        record_failure(
            self.conn,
            self.batch_key,
            memory_id,
            self.step,
            outcome,
            self.criteria,
            self.result,
            user_id=self.users[memory_id],
        )

    def flush(self) -> None:
        if self.before_flush is not None:
            self.before_flush()
        rows, self._pending = self._pending, []
        if not rows:
            return
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany(self.sql, [p for _, _, p in rows])
        except psycopg.DataError:
            for memory_id, outcome, p in rows:
                try:
                    with self.conn.transaction():
                        self.conn.execute(self.sql, p)
                except psycopg.DataError as exc:
                    record_failure(
                        self.conn,
                        self.batch_key,
                        memory_id,
                        self.step,
                        exc,
                        self.criteria,
                        self.result,
                        user_id=self.users[memory_id],
                    )
                else:
                    self._ok(outcome)
            return
        for _, outcome, _ in rows:
            self._ok(outcome)

    def _ok(self, outcome: Any) -> None:
        self.result.succeeded += 1
        if self.saved is not None:
            self.saved(outcome)


def _safe_call(fn: Callable[[T], R], item: T) -> R | BaseException:
    try:
        return fn(item)
    except Exception as exc:  # recorded per memory by the caller
        return exc


def run_parallel(
    fn: Callable[[T], R], items: Iterable[T], workers: int, *, deadline: float | None = None
) -> Iterator[tuple[T, R | BaseException]]:
    """Run fn over items in threads; yield (item, result or exception) in input order.

    `deadline` (a time.monotonic() value): an item not done by then yields DeadlineExceeded and the
    caller moves on; a call still hanging in its thread is abandoned (its I/O timeouts end it).
    `items` may be a generator: each item is submitted as soon as it is made, so the first calls run
    while the generator makes the next items.
    """
    if isinstance(items, Sequence):
        if deadline is None and (workers <= 1 or len(items) <= 1):
            for item in items:
                yield item, _safe_call(fn, item)
            return
        workers = min(workers, len(items))
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        submitted = [(item, pool.submit(_safe_call, fn, item)) for item in items]
        for item, future in submitted:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                yield item, future.result(timeout=timeout)
            except FutureTimeout:
                yield (
                    item,
                    DeadlineExceeded(f"step deadline passed before this memory's {fn.__name__} finished"),
                )
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def step_deadline(criteria: ArchivalCriteria) -> float:
    return time.monotonic() + criteria.step_deadline_seconds


def start_step(conn: Conn, batch_key: str, criteria: ArchivalCriteria) -> float:
    renew_lease(conn, batch_key, criteria)
    return step_deadline(criteria)


# --------------------------------------------------------------------------- batch views


def batch_status(conn: Conn, batch_key: str) -> BatchStatus:
    rows = conn.execute(
        """SELECT status, failed_step, (error IS NOT NULL) AS has_error, count(*) AS n
           FROM archival_attempts WHERE batch_key = %s GROUP BY 1, 2, 3""",
        (batch_key,),
    ).fetchall()
    by_status: Counter[str] = Counter()
    failed_by_step: Counter[str] = Counter()
    for r in rows:
        by_status[r["status"]] += r["n"]
        if r["has_error"] and r["status"] != "archived":
            failed_by_step[r["failed_step"] or "unknown"] += r["n"]
    # Checkpoint rows of archived memories are pruned after the batch's audit (integrity.audit_batch).
    pruned = conn.execute(
        "SELECT archived_pruned FROM archival_batches WHERE batch_key = %s", (batch_key,)
    ).fetchone()
    if pruned and pruned["archived_pruned"]:
        by_status[AttemptStatus.ARCHIVED.value] += pruned["archived_pruned"]
    attempted = sum(by_status.values())
    return BatchStatus(
        batch_key, dict(by_status), attempted, sum(failed_by_step.values()), dict(failed_by_step)
    )
