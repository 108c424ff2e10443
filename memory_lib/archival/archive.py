"""The archival steps: summarize, embed, back up, commit — each checkpointed per memory.

A batch goes through checkpointed steps, each recorded per memory in `archival_attempts`
(claims.py claims the batch; pipeline.py runs the steps in order with the gate):

    claim -> summarize -> embed summary -> back up original (put + verify) -> commit

`commit` is one transaction per chunk that, for each memory, re-checks that the backup still
matches the live row, inserts the archive row, deletes the original and writes the audit event. A
backup that no bucket version keeps (a local store, a bucket without versioning) is verified in the
object store inside that transaction, before the original is deleted: one gone since the backup step
leaves its memory hot, to be backed up again, never an archive row without its backup.
A failure at any step leaves the memory hot with the error recorded; running the step again
retries it. Killing the process anywhere loses at most in-flight work: every step is idempotent.
Every step renews its batch's lease when it starts and stops starting work at its deadline
(criteria.step_deadline_seconds): what is left fails with DeadlineExceeded, and the gate decides.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from pgvector import Vector
from psycopg.types.json import Jsonb

from ..core.config import ArchivalCriteria, Settings
from ..core.errors import (
    DeadlineExceeded,
    EmbeddingMismatchError,
    IntegrityError,
    NotFoundError,
    SummarizationError,
    embedding_mismatch_reason,
)
from ..core.locks import backups_in_flight, lock_users
from ..core.models import BackupObject, sha256_hex
from ..core.rows import Conn, Row
from ..core.statuses import AttemptStatus, EventType, Step
from ..lifecycle.forget import forgetting
from ..llm import batches
from ..llm.embedding import Embedder, embedder_from_settings
from ..llm.ledger import LedgerEntry, record_usage
from ..llm.summarize import (
    PaidSummarizationError,
    Summarizer,
    Summary,
    SummaryInput,
    check_summary_text,
    extract_key_entities,
    summarizer_from_settings,
)
from ..storage import events, packs
from ..storage.object_versions import kept_version
from ..storage.objectstore import ObjectStore, object_store_from_settings
from ..storage.store import MEMORY_COLUMNS, ROW_XMIN, fetch_memories, store_shape
from . import integrity
from .claims import renew_lease

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ArchivalServices:
    summarizer: Summarizer
    embedder: Embedder
    object_store: ObjectStore

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchivalServices:
        return cls(
            summarizer_from_settings(settings.llm),
            embedder_from_settings(settings.embedding),
            object_store_from_settings(settings),
        )


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


def _pending(conn: Conn, batch_key: str, status: str, extra_cols: str = "") -> list[Row]:
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
) -> None:
    message = f"{type(exc).__name__}: {exc}"[:1000]
    row = conn.execute(
        """UPDATE archival_attempts
           SET attempts = attempts + 1, failed_step = %s, error = %s, updated_at = now(),
               status = CASE WHEN attempts + 1 >= %s THEN 'released' ELSE status END,
               released_at = CASE WHEN attempts + 1 >= %s THEN now() END
           WHERE batch_key = %s AND memory_id = %s RETURNING status""",
        (step, message, criteria.max_attempts, criteria.max_attempts, batch_key, memory_id),
    ).fetchone()
    result.failed += 1
    if row and row["status"] == "released":
        result.released += 1
    if len(result.errors) < 20:
        result.errors.append(f"{memory_id}: {message}")
    log.warning("archival %s failed for memory %s: %s", step, memory_id, message)


CHECKPOINT_CHUNK = 500  # rows per checkpoint transaction


class _Checkpoints:
    """Record each memory's outcome of one step: successes written in sets (one pipelined
    executemany per transaction of up to CHECKPOINT_CHUNK rows, not one commit per row), failures
    recorded per memory. A value the database refuses (DataError: a NUL, a bad vector) fails that
    memory only: its set is written again one row at a time, so its neighbours are still recorded.

    `params(memory_id, outcome)` gives the UPDATE's parameters; raising there fails that memory only.
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
    ) -> None:
        self.conn, self.batch_key, self.step, self.sql = conn, batch_key, step, sql
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
                self._pending.append((memory_id, outcome, self.params(memory_id, outcome)))
            except Exception as exc:
                outcome = exc
            else:
                if len(self._pending) >= CHECKPOINT_CHUNK and not self._held:
                    self.flush()
                return
        record_failure(self.conn, self.batch_key, memory_id, self.step, outcome, self.criteria, self.result)

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
                        self.conn, self.batch_key, memory_id, self.step, exc, self.criteria, self.result
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


def _start_step(conn: Conn, batch_key: str, criteria: ArchivalCriteria) -> float:
    renew_lease(conn, batch_key, criteria)
    return step_deadline(criteria)


# --------------------------------------------------------------------------- steps


def summarize_batch(
    conn: Conn,
    batch_key: str,
    summarizer: Summarizer,
    criteria: ArchivalCriteria,
    *,
    workers: int = 4,
) -> StepResult:
    """Summarize every claimed memory of the batch that has no summary yet: synchronously, or through
    the provider's batch API when more than the summarizer's `batch_threshold` are to do or some
    already wait in a provider batch (memory_lib.llm.batches; see _summarize_via_batches).

    Every paid answer goes to the LLM ledger (memory_lib.llm.ledger) before the checkpoints it belongs
    to are written. Entities are the model's own when it gave them (one call, summary and entities),
    else extract_key_entities' (the offline summarizer).
    """
    result = StepResult(Step.SUMMARIZE)
    started = time.monotonic()
    deadline = _start_step(conn, batch_key, criteria)
    claimed = _pending(conn, batch_key, AttemptStatus.CLAIMED)
    originals = _summary_inputs(conn, claimed)
    ledger = _LedgerBuffer(conn, batch_key)
    checkpoints = summary_checkpoints(conn, batch_key, criteria, result, ledger)
    todo = [a for a in claimed if a["llm_submission"] is None]
    waiting = [a for a in claimed if a["llm_submission"] is not None]
    threshold = getattr(summarizer, "batch_threshold", 0)
    if batches.supports_batches(summarizer) and (waiting or (threshold and len(todo) > threshold)):
        submit = todo if threshold and len(todo) > threshold else []
        todo = [] if submit else todo
        todo += _summarize_via_batches(
            conn,
            batch_key,
            summarizer,
            criteria,
            submit,
            waiting,
            originals,
            ledger,
            checkpoints,
            result,
            deadline,
        )

    def run(attempt: Row):
        row = originals.get(attempt["memory_id"])
        if row is None:
            raise NotFoundError(f"memory {attempt['memory_id']} no longer exists")
        item = SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
        try:
            summary = summarizer.summarize(item)
        except PaidSummarizationError as exc:
            ledger.add(attempt, exc.spent, "failed")
            raise
        return accept_summary(summary, row, attempt, ledger)

    for attempt, outcome in run_parallel(run, todo, workers, deadline=deadline):
        checkpoints.add(attempt["memory_id"], outcome)
    checkpoints.flush()
    result.seconds = time.monotonic() - started
    return result


def _summary_inputs(conn: Conn, claimed: Sequence[Row]) -> dict[uuid.UUID, Row]:
    """The hot rows a summary is made from, by id: only the columns it reads (the embeddings, most of
    a row's bytes, are not needed until the backup step)."""
    rows = conn.execute(
        """SELECT id, user_id, content, created_at, domain, category FROM memories
           WHERE user_id = ANY(%s) AND id = ANY(%s)""",
        (sorted({r["user_id"] for r in claimed}), [r["memory_id"] for r in claimed]),
    ).fetchall()
    return {r["id"]: r for r in rows}


def _summarize_via_batches(
    conn: Conn,
    batch_key: str,
    summarizer: Any,
    criteria: ArchivalCriteria,
    submit: list[Row],
    waiting: list[Row],
    originals: dict[uuid.UUID, Row],
    ledger: _LedgerBuffer,
    checkpoints: _Checkpoints,
    result: StepResult,
    step_deadline_at: float,
) -> list[Row]:
    """Submit `submit` as one provider batch, poll it and the submissions `waiting` memories are in,
    apply what ended (memory_lib.llm.batches). Returns the attempts to summarize synchronously instead
    (their batch expired or was canceled, the provider refused it, or showed none for it past
    batches.LOOKUP_WINDOW: memory_lib.llm.batches says which failures are which); memories of a batch
    still running when the wait ends stay claimed with their submission, counted in result.waiting."""
    api = batches.BatchClient(summarizer)
    by_key: dict[str, dict[uuid.UUID, Row]] = {}
    for a in waiting:
        by_key.setdefault(a["llm_submission"], {})[a["memory_id"]] = a
    fallback: list[Row] = []

    def requests_for(attempts: list[Row]) -> list[tuple[uuid.UUID, Row]]:
        out = []
        for a in attempts:
            row = originals.get(a["memory_id"])
            try:
                if row is None:
                    raise NotFoundError(f"memory {a['memory_id']} no longer exists")
                item = SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
                if not item.content.strip():
                    raise SummarizationError("memory content is empty: nothing to summarize")
                out.append((a["memory_id"], summarizer.request_params(item)))
            except Exception as exc:
                checkpoints.add(a["memory_id"], exc)
        return out

    sent_now: set[str] = set()

    def release(key: str, why: str) -> None:
        """The provider has no batch for `key`: its memories are summarized one by one instead."""
        batches.mark(conn, key, "failed", why)
        batches.release_memories(conn, key, list(by_key[key]))
        fallback.extend(by_key.pop(key).values())

    def send(key: str, attempts: list[Row]) -> None:
        sent_now.add(key)
        try:
            batches.record_submitted(conn, key, api.create(key, requests_for(attempts)))
        except SummarizationError as exc:
            why = batches.describe_submit_failure(exc)
            if not batches.not_created(exc):
                # The batch may exist (a timeout, a 5xx). Left 'submitting' with why: the next run
                # adopts it or, when the provider has none, submits (released past LOOKUP_WINDOW).
                batches.mark(conn, key, "submitting", why)
                log.warning("submission %s: %s; left for the next run", key, why)
                return
            log.warning("submission %s: %s; its memories are summarized synchronously", key, why)
            release(key, why)

    if submit:
        ids = [a["memory_id"] for a in submit]
        key = batches.submission_key(batch_key, ids)
        batches.record_intent(conn, batch_key, key, summarizer.kind, summarizer.model, ids)
        by_key[key] = {a["memory_id"]: a for a in submit}
        send(key, submit)

    subs = {s["submission_key"]: s for s in batches.open_submissions(conn, set(by_key))}
    for key, sub in list(subs.items()):
        unresolved = sub["status"] == "submitting" and sub["provider_batch_id"] is None
        if not (unresolved and key in by_key and key not in sent_now):
            continue
        lookup_failed = None
        try:
            if batches.adopt_or_forget(conn, api, sub) is not None:
                continue
        except SummarizationError as exc:  # cannot tell whether the provider has it
            lookup_failed = f"looking its batch up at the provider failed: {' '.join(str(exc).split())}"
        if batches.past_lookup_window(sub):  # bounded: released, whether or not the provider answered
            hours = batches.LOOKUP_WINDOW.total_seconds() / 3600
            release(
                key,
                f"{'the provider shows no batch for it' if lookup_failed is None else lookup_failed} "
                f"{hours:g} h after it was submitted (last error: {sub['error'] or 'none recorded'})"[:500],
            )
        elif lookup_failed is not None:  # left for the next run
            batches.mark(conn, key, "submitting", lookup_failed[:500])
            log.warning("submission %s: %s", key, lookup_failed)
        else:
            send(key, list(by_key[key].values()))  # the provider has no batch for it: never submitted
    subs = {s["submission_key"]: s for s in batches.open_submissions(conn, set(by_key))}

    wait_until = batches.wait_deadline(
        time.monotonic(), getattr(summarizer, "batch_wait_seconds", 0.0), step_deadline_at
    )
    for key, sub in subs.items():
        if sub["status"] in ("collected", "failed", "expired", "canceled") and key in by_key:
            # Done with, yet memories still point at it (a crash between its last two writes).
            batches.release_memories(conn, key, list(by_key[key]))
            fallback.extend(by_key.pop(key).values())
    pending = {
        k: s
        for k, s in subs.items()
        if s["provider_batch_id"] and s["status"] in ("submitted", "ended") and k in by_key
    }
    for key in set(by_key) - set(pending):  # no provider batch: a submit without an answer, left for later
        result.waiting += len(by_key[key])
    while pending:
        for key, sub in list(pending.items()):
            pb = api.retrieve(sub["provider_batch_id"])
            if pb.status == "in_progress":
                continue
            del pending[key]
            fallback.extend(
                _collect(conn, api, summarizer, sub, pb.status, by_key[key], originals, ledger, checkpoints)
            )
        if pending:
            renew_lease(conn, batch_key, criteria)
            if not batches.sleep_until_next_poll(getattr(summarizer, "batch_poll_seconds", 30.0), wait_until):
                break
    for key in pending:
        result.waiting += len(by_key[key])
    return fallback


def _collect(
    conn: Conn,
    api: batches.BatchClient,
    summarizer: Any,
    sub: Row,
    status: str,
    attempts: dict[uuid.UUID, Row],
    originals: dict[uuid.UUID, Row],
    ledger: _LedgerBuffer,
    checkpoints: _Checkpoints,
) -> list[Row]:
    """Apply an ended provider batch's results to the memories still waiting in it; return those to
    summarize synchronously (canceled or expired, or missing from the results)."""
    key, provider_id = sub["submission_key"], sub["provider_batch_id"]
    batches.mark(conn, key, "ended")
    results = [] if status == "failed" else list(api.results(provider_id))
    fallback: list[Row] = []
    seen: set[uuid.UUID] = set()
    for r in results:
        attempt = attempts.get(r.memory_id)
        if attempt is None or r.memory_id in seen:
            continue  # not ours any more (applied by an earlier collect, or moved on)
        seen.add(r.memory_id)
        if r.kind in ("canceled", "expired"):
            fallback.append(attempt)
            continue
        if r.kind != "succeeded":
            checkpoints.add(r.memory_id, batches.describe_failure(r.kind, r.error))
            continue
        request_id = f"{provider_id}:{r.memory_id}"
        try:
            summary = replace(summarizer.parse_response(r.response, mode="batch"), request_id=request_id)
        except PaidSummarizationError as exc:
            ledger.add(attempt, replace(exc.spent, request_id=request_id), "failed")
            checkpoints.add(r.memory_id, exc)
            continue
        row = originals.get(r.memory_id)
        try:
            if row is None:
                raise NotFoundError(f"memory {r.memory_id} no longer exists")
            outcome: Any = accept_summary(summary, row, attempt, ledger)
        except Exception as exc:
            outcome = exc
        checkpoints.add(r.memory_id, outcome)
    fallback.extend(a for mid, a in attempts.items() if mid not in seen)
    checkpoints.flush()  # ledger first (before_flush), then the summaries
    batches.release_memories(conn, key, list(attempts))
    kinds = {r.kind for r in results}
    # Anthropic reports an expired or canceled batch as "ended" with expired/canceled results.
    final = {"expired": "expired", "canceled": "canceled", "failed": "failed"}.get(
        status, "expired" if "expired" in kinds else "canceled" if "canceled" in kinds else "collected"
    )
    batches.mark(conn, key, final)
    if fallback:
        log.warning(
            "provider batch %s (%s): %d memories summarized synchronously instead",
            provider_id,
            status,
            len(fallback),
        )
    return fallback


class _LedgerBuffer:
    """Ledger rows of one step, collected from worker threads and written before each checkpoint flush."""

    def __init__(self, conn: Conn, batch_key: str):
        self.conn, self.batch_key = conn, batch_key
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()

    def add(self, attempt: Row, spent: Summary, outcome: str) -> None:
        if spent.kind == "extractive-offline":
            return  # no provider, no bill
        entry = LedgerEntry(spent, outcome, self.batch_key, attempt["memory_id"], attempt["user_id"])
        with self._lock:
            self._entries.append(entry)

    def flush(self) -> None:
        with self._lock:
            entries, self._entries = self._entries, []
        record_usage(self.conn, entries)


def accept_summary(
    summary: Summary, row: Row, attempt: Row, ledger: _LedgerBuffer
) -> tuple[Summary, list[str]]:
    """Check a summary against its memory and ledger it: the checkpoint's outcome, or raise for this memory."""
    try:
        # A NUL, a lone surrogate, a refusal or text unrelated to the memory fails this memory only.
        check_summary_text(summary.text, row["content"], source=f"{summary.kind}:{summary.model}")
    except SummarizationError:
        ledger.add(attempt, summary, "failed")
        raise
    ledger.add(attempt, summary, "ok")
    entities = summary.entity_names if summary.entities is not None else extract_key_entities(row["content"])
    return summary, entities


def summary_checkpoints(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    result: StepResult,
    ledger: _LedgerBuffer,
) -> _Checkpoints:
    """Checkpoints of accepted summaries (claimed -> summarized), the ledger written before each set."""

    def params(mid: uuid.UUID, outcome: Any) -> tuple[Any, ...]:
        summary, entities = outcome
        typed = None if summary.entities is None else Jsonb([[e.name, e.type] for e in summary.entities])
        return (
            summary.text,
            summary.model,
            summary.kind,
            entities,
            typed,
            summary.domain_guess,
            summary.input_tokens,
            summary.output_tokens,
            summary.cost_usd,
            batch_key,
            mid,
        )

    def saved(outcome: Any) -> None:
        summary = outcome[0]
        result.input_tokens += summary.input_tokens
        result.output_tokens += summary.output_tokens
        result.cost_usd += summary.cost_usd

    return _Checkpoints(
        conn,
        batch_key,
        Step.SUMMARIZE,
        """UPDATE archival_attempts
           SET status = 'summarized', summary = %s, summary_model = %s, summarizer_kind = %s,
               key_entities = %s, summary_entities = %s, domain_guess = %s, input_tokens = %s,
               output_tokens = %s, cost_usd = %s, llm_submission = NULL,
               error = NULL, failed_step = NULL, updated_at = now()
           WHERE batch_key = %s AND memory_id = %s AND status = 'claimed'""",
        params,
        criteria,
        result,
        saved,
        before_flush=ledger.flush,
    )


def check_embedder(conn: Conn, embedder: Embedder) -> None:
    """Summary embeddings are searched with the same query vector as hot memories: same model and dim."""
    shape = store_shape(conn)
    reason = embedding_mismatch_reason(shape.embedding_model, shape.dim, embedder.model, embedder.dim)
    if embedder.dim != shape.dim:
        raise EmbeddingMismatchError("embedder.dim", embedder.dim, reason)
    if shape.embedding_model is not None and embedder.model != shape.embedding_model:
        raise EmbeddingMismatchError("embedder.model", embedder.model, reason)


def embed_batch(
    conn: Conn,
    batch_key: str,
    embedder: Embedder,
    criteria: ArchivalCriteria,
    *,
    chunk_size: int = 64,
) -> StepResult:
    """Embed every summary of the batch that has no embedding yet."""
    result = StepResult(Step.EMBED)
    started = time.monotonic()
    deadline = _start_step(conn, batch_key, criteria)
    check_embedder(conn, embedder)
    todo = _pending(conn, batch_key, AttemptStatus.SUMMARIZED, ", a.summary")

    def embed_chunk(chunk: list[Row]) -> list[Any]:
        try:
            return list(embedder.embed([r["summary"] for r in chunk]))
        except Exception:
            # Isolate the bad input: one failing summary must not fail its neighbours.
            vectors: list[Any] = []
            for r in chunk:
                try:
                    vectors.append(embedder.embed([r["summary"]])[0])
                except Exception as exc:
                    vectors.append(exc)
            return vectors

    def params(mid: uuid.UUID, vec: Any) -> tuple[Any, ...]:
        # Binary: a float32 vector travels as 4 bytes per dimension, not as text to parse.
        return (Vector(vec), embedder.model, batch_key, mid)

    checkpoints = _Checkpoints(
        conn,
        batch_key,
        Step.EMBED,
        """UPDATE archival_attempts
           SET status = 'embedded', summary_embedding = %b::vector::halfvec,
               summary_embedding_model = %s, error = NULL, failed_step = NULL, updated_at = now()
           WHERE batch_key = %s AND memory_id = %s AND status = 'summarized'""",
        params,
        criteria,
        result,
    )
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    for chunk, vectors in run_parallel(embed_chunk, chunks, 1, deadline=deadline):
        if isinstance(vectors, BaseException):
            vectors = [vectors] * len(chunk)
        for attempt, vec in zip(chunk, vectors, strict=True):
            checkpoints.add(attempt["memory_id"], vec)
    checkpoints.flush()
    result.seconds = time.monotonic() - started
    return result


def _drop_forgotten(conn: Conn, batch_key: str, users: list[str], ids: list[uuid.UUID]) -> None:
    """Memories an open forget request covers leave the batch: their attempts go, as forget's own rows
    step would delete them (a user's erasure is no archival failure, and the gate does not count it)."""
    n = conn.execute(
        """DELETE FROM archival_attempts
           WHERE batch_key = %s AND user_id = ANY(%s) AND memory_id = ANY(%s) AND status = 'embedded'""",
        (batch_key, users, ids),
    ).rowcount
    log.info("backup of %s: %d memories left the batch, being forgotten", batch_key, n)


def backup_batch(
    conn: Conn,
    batch_key: str,
    object_store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    workers: int = 8,
    now: datetime | None = None,
) -> StepResult:
    """Write each original as a backup (alone, or as a member of its user's pack: memory_lib.storage.packs),
    verified by the store, and checkpoint its ref, sha256 and size."""
    result = StepResult(Step.BACKUP)
    started = time.monotonic()
    deadline = _start_step(conn, batch_key, criteria)
    todo = _pending(conn, batch_key, AttemptStatus.EMBEDDED, ", a.claimed_at")
    users = sorted({r["user_id"] for r in todo})
    # Under the users' backup locks (memory_lib.core.locks) from before the originals are read until
    # their checkpoints: a forget of one of them waits, and what an open forget covers is not put.
    with backups_in_flight(conn, users):
        forgotten = forgetting(conn, users)
        dropped = [a["memory_id"] for a in todo if forgotten(a["user_id"], a["memory_id"])]
        if dropped:
            _drop_forgotten(conn, batch_key, users, dropped)
            todo = [a for a in todo if not forgotten(a["user_id"], a["memory_id"])]
        originals = fetch_memories(
            conn, [r["memory_id"] for r in todo], users=(r["user_id"] for r in todo), with_xmin=True
        )
        started_before = conn.execute(
            """UPDATE archival_batches b SET backup_started_at = coalesce(b.backup_started_at, now())
               FROM (SELECT backup_started_at FROM archival_batches WHERE batch_key = %s) AS before
               WHERE b.batch_key = %s RETURNING before.backup_started_at AS at""",
            (batch_key, batch_key),
        ).fetchone()
        try:
            if started_before is not None and started_before["at"] is not None:
                integrity.purge_unrecorded_packs(
                    conn, batch_key, object_store, sorted({r["user_id"] for r in todo})
                )
        except Exception as exc:  # hygiene, not this night's work: the puts below report a store that is down
            log.warning(
                "backup of %s: could not look for a dead run's packs (%s); `sweep` removes them later",
                batch_key,
                exc,
            )

        def archived_at(attempt: Row) -> datetime:
            # The claim's time, not the clock's: a re-run after a crash writes the same bytes, so the same
            # pack key, and a dead run's pack is overwritten rather than left beside the new one.
            return (now or attempt["claimed_at"]).astimezone(UTC)

        def params(mid: uuid.UUID, outcome: Any) -> tuple[Any, ...]:
            stored, row_xmin, at = outcome
            return (
                stored.object.key,
                stored.ref,
                stored.sha256,
                stored.size,
                stored.object.version_id,
                at,
                row_xmin,
                batch_key,
                mid,
            )

        def saved(outcome: Any) -> None:
            result.bytes_written += outcome[0].size

        checkpoints = _Checkpoints(
            conn,
            batch_key,
            Step.BACKUP,
            """UPDATE archival_attempts
               SET status = 'backed_up', backup_key = %s, backup_ref = %s, backup_sha256 = %s,
                   backup_size_bytes = %s, backup_version_id = %s, backup_archived_at = %s,
                   backup_row_xmin = %s, error = NULL, failed_step = NULL, updated_at = now()
               WHERE batch_key = %s AND memory_id = %s AND status = 'embedded'""",
            params,
            criteria,
            result,
            saved,
        )
        when: dict[uuid.UUID, datetime] = {}
        by_user: dict[str, list[Row]] = {}
        for attempt in todo:
            by_user.setdefault(attempt["user_id"], []).append(attempt)

        def units() -> Iterator[packs.Unit]:
            """One user's objects at a time, in the order plan_units gives for the whole batch (so a re-run
            writes the same packs): run_parallel puts each user's while the next user's are serialized."""
            for user_id, attempts in by_user.items():
                members: list[tuple[str, packs.Member]] = []
                for attempt in attempts:
                    row = originals.get(attempt["memory_id"])
                    try:
                        if row is None:
                            raise NotFoundError(f"memory {attempt['memory_id']} no longer exists")
                        at = archived_at(attempt)
                        doc = BackupObject.from_row(
                            row, archived_at=at, archive_reason=attempt["archive_reason"]
                        )
                        data = (
                            doc.to_json_bytes()
                        )  # serialized once: later steps compare row versions, not bytes
                    except Exception as exc:  # this memory only
                        checkpoints.add(attempt["memory_id"], exc)
                        continue
                    members.append((user_id, packs.Member(row["id"], data, sha256_hex(data))))
                    when[row["id"]] = at
                yield from packs.plan_units(
                    object_store, batch_key, members, min_members=criteria.pack_min_members
                )

        def backup(unit: packs.Unit) -> list[packs.StoredMember]:
            return packs.put_unit(object_store, unit)

        for unit, outcome in run_parallel(backup, units(), workers, deadline=deadline):
            # A unit's members are checkpointed in one transaction: a pack is recorded whole or not at all.
            with checkpoints.together():
                for i, member in enumerate(unit.members):
                    stored = outcome if isinstance(outcome, BaseException) else outcome[i]
                    mid = member.memory_id
                    checkpoints.add(
                        mid,
                        stored
                        if isinstance(stored, BaseException)
                        else (stored, originals[mid]["row_xmin"], when[mid]),
                    )
        checkpoints.flush()
    result.seconds = time.monotonic() - started
    return result


# The 'archived' event of each memory of the chunk (its batch, reason and backup in the details).
_ARCHIVED_EVENTS_SQL = events.insert_select(
    """SELECT a.memory_id, a.user_id,
              jsonb_build_object('batch_key', a.batch_key, 'reason', a.archive_reason,
                                 'storage_ref', a.backup_ref, 'sha256', a.backup_sha256) AS details
       FROM archival_attempts a
       WHERE a.batch_key = %(batch)s AND a.user_id = ANY(%(users)s) AND a.memory_id = ANY(%(ids)s)"""
)
_COMMIT_INSERT = """
    INSERT INTO archived_memories (
        original_id, user_id, summary, summary_embedding, summary_embedding_model, key_entities,
        original_domain, original_category, original_embedding_model, original_updated_at,
        original_superseded_by, importance_score, access_count, last_accessed_at, archived_at,
        original_created_at, archive_reason, backup_object, backup_offset, storage_verified, backup_digest,
        backup_size_bytes, backup_version_id, schema_version, summary_model, summarizer_kind,
        summary_input_tokens, summary_output_tokens, summary_cost_usd, metadata, original_dedupe_key)
    SELECT m.id, m.user_id, a.summary, a.summary_embedding, a.summary_embedding_model,
           coalesce(a.key_entities, '{}'), m.domain, m.category, m.embedding_model, m.updated_at,
           m.superseded_by, m.importance_score, m.access_count, m.last_accessed_at, a.backup_archived_at,
           m.created_at, a.archive_reason, o.id, backup_member_offset(a.backup_ref), true, decode(a.backup_sha256, 'hex'),
           a.backup_size_bytes,
           a.backup_version_id, 1, a.summary_model, a.summarizer_kind, coalesce(a.input_tokens, 0),
           coalesce(a.output_tokens, 0), coalesce(a.cost_usd, 0),
           -- the model's typed entities and domain guess live on with the row: checkpoints are pruned.
           -- Not the batch's pack key: the backup object's ref holds it, once per object.
           jsonb_build_object('batch_key', a.batch_key)
             || jsonb_strip_nulls(jsonb_build_object('summary_entities', a.summary_entities,
                                                     'domain_guess', a.domain_guess)),
           m.dedupe_key
    FROM archival_attempts a JOIN memories m ON m.id = a.memory_id AND m.user_id = a.user_id
         JOIN backup_objects o ON o.ref = backup_object_ref(a.backup_ref) AND o.user_id = a.user_id
    WHERE a.batch_key = %(batch)s AND a.user_id = ANY(%(users)s) AND a.memory_id = ANY(%(ids)s) AND a.status = 'backed_up'
"""


def commit_batch(
    conn: Conn,
    batch_key: str,
    object_store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    actor: str,
    chunk_size: int = 100,
    workers: int = 8,
) -> StepResult:
    """Replace each backed-up original by its archive row, in one transaction per chunk.

    Before deleting, the backup is verified in object storage and the live row is re-serialized:
    if the memory changed since its backup, it goes back to be backed up again instead. Where the
    backup is verified is the rule that keeps every archive row's original:

    * a backup that no bucket version keeps (a local store, a bucket without versioning) is verified
      inside its chunk's transaction, after the rows are locked and before the originals are deleted
      (_commit_chunk). One deleted or changed since the backup step fails its memories at step
      'verify': they stay hot and go back to be backed up again. Never an archive row without it.
    * a backup a bucket version keeps is verified first, outside any lock; one deleted or overwritten
      after that is put back from its version by the audit after commit (integrity.audit_batch).

    Either way each backup object is checked once per chunk holding its members (a HEAD for a lone
    backup or a whole pack, packs.verify_members): the chunks keep an object's members together.
    """
    result = StepResult(Step.COMMIT)
    started = time.monotonic()
    deadline = _start_step(conn, batch_key, criteria)
    todo = _pending(
        conn,
        batch_key,
        AttemptStatus.BACKED_UP,
        ", a.backup_key, a.backup_ref, a.backup_sha256, a.backup_size_bytes, a.backup_version_id",
    )
    by_key: dict[str, list[Row]] = {}
    ready: list[Row] = []  # verified here, or (no version kept) to be verified under the locks
    for a in todo:
        if kept_version(a["backup_version_id"]):
            by_key.setdefault(a["backup_key"], []).append(a)
        else:
            ready.append(a)

    def verify(key: str) -> list[BaseException | None]:
        return _verify_object(object_store, key, by_key[key])

    for key, outcome in run_parallel(verify, list(by_key), workers, deadline=deadline):
        outcomes = [outcome] * len(by_key[key]) if isinstance(outcome, BaseException) else outcome
        for attempt, problem in zip(by_key[key], outcomes, strict=True):
            if problem is not None:
                result.processed += 1
                record_failure(conn, batch_key, attempt["memory_id"], Step.VERIFY, problem, criteria, result)
                return_to_status(conn, batch_key, attempt["memory_id"], AttemptStatus.EMBEDDED)
            else:
                ready.append(attempt)
    # A user's memories together, a backup object's members together: a chunk locks few users, and
    # an object spans as few chunks (so checks under the lock) as it can.
    ready.sort(key=lambda a: (a["user_id"], a["backup_key"], a["memory_id"]))

    def commit(chunk: list[Row], workers: int) -> None:
        missing = _commit_chunk(
            conn,
            batch_key,
            chunk,
            actor,
            result,
            object_store=object_store,
            workers=workers,
            deadline=deadline,
        )
        for mid, problem in missing:  # not archived: hot, and backed up again by the next run
            result.processed += 1
            record_failure(conn, batch_key, mid, Step.VERIFY, problem, criteria, result)
            return_to_status(conn, batch_key, mid, AttemptStatus.EMBEDDED)

    for i in range(0, len(ready), chunk_size):
        chunk = ready[i : i + chunk_size]
        try:
            commit(chunk, workers)
        except psycopg.Error:
            # One bad row must not block its chunk: retry one memory per transaction.
            for attempt in chunk:
                try:
                    commit([attempt], 1)
                except psycopg.Error as exc:
                    result.processed += 1
                    record_failure(conn, batch_key, attempt["memory_id"], Step.COMMIT, exc, criteria, result)
    result.seconds = time.monotonic() - started
    return result


def _verify_object(store: ObjectStore, key: str, group: Sequence[Row]) -> list[BaseException | None]:
    """Per attempt of `group` (attempts whose backup is in the object `key`): None when its backup is
    there as recorded, else why not. A lone backup is one HEAD; a pack is one HEAD too when the
    store's checksum of it is the sha256 its name carries (packs.verify_members), else one GET with
    every member's bytes checked."""
    if all(store.locate(a["backup_ref"])[1] is None for a in group):
        out: list[BaseException | None] = []
        for a in group:
            try:
                store.verify(key, a["backup_sha256"], a["backup_size_bytes"])
                out.append(None)
            except Exception as exc:
                out.append(exc)
        return out
    return packs.verify_members(store, [(a["backup_ref"], a["backup_sha256"]) for a in group], workers=1)


# The checks under the user locks stop waiting after this (or at the step's deadline): a store that
# stops answering fails the chunk's unchecked memories (they stay hot) instead of holding the users'
# writes for its own timeouts and retries (object_store.*: up to minutes).
LOCKED_VERIFY_SECONDS = 10.0


def _verify_unkept(
    store: ObjectStore, attempts: Sequence[Row], workers: int, deadline: float | None
) -> dict[uuid.UUID, BaseException]:
    """Verify the backups among `attempts` that no bucket version keeps (nothing could put them back
    after commit), one check per object (a HEAD for a lone backup or a whole pack), in parallel:
    memory id -> why its backup is not there as recorded, for those that fail."""
    by_key: dict[str, list[Row]] = {}
    for a in attempts:
        if not kept_version(a["backup_version_id"]):
            by_key.setdefault(a["backup_key"], []).append(a)
    if not by_key:
        return {}

    def verify(key: str) -> list[BaseException | None]:
        return _verify_object(store, key, by_key[key])

    failed: dict[uuid.UUID, BaseException] = {}
    locked_until = time.monotonic() + LOCKED_VERIFY_SECONDS
    until = locked_until if deadline is None else min(deadline, locked_until)
    for key, outcome in run_parallel(verify, list(by_key), workers, deadline=until):
        if isinstance(outcome, DeadlineExceeded) and until == locked_until:
            outcome = DeadlineExceeded(
                f"the object store did not answer within {LOCKED_VERIFY_SECONDS:g} s under the write locks"
            )
        outcomes = [outcome] * len(by_key[key]) if isinstance(outcome, BaseException) else outcome
        for a, problem in zip(by_key[key], outcomes, strict=True):
            if problem is not None:
                failed[a["memory_id"]] = problem
    return failed


def backup_still_matches(row: Row, attempt: Row) -> bool:
    """Whether the live row still serializes to the attempt's backup (its recorded sha256).

    The row version it was serialized from unchanged: yes, without serializing again (the common
    case). Otherwise (any UPDATE since, even one that leaves the backed-up fields alone): serialize
    the live row and compare the sha256.
    """
    if attempt.get("backup_row_xmin") is not None and row.get("row_xmin") == attempt["backup_row_xmin"]:
        return True
    doc = BackupObject.from_row(
        row, archived_at=attempt["backup_archived_at"], archive_reason=attempt["archive_reason"]
    )
    return sha256_hex(doc.to_json_bytes()) == attempt["backup_sha256"]


def return_to_status(conn: Conn, batch_key: str, memory_id: uuid.UUID, status: str) -> None:
    conn.execute(
        "UPDATE archival_attempts SET status = %s WHERE batch_key = %s AND memory_id = %s AND status <> 'released'",
        (status, batch_key, memory_id),
    )


def _commit_chunk(
    conn: Conn,
    batch_key: str,
    chunk: list[Row],
    actor: str,
    result: StepResult,
    *,
    object_store: ObjectStore,
    workers: int = 8,
    deadline: float | None = None,
) -> list[tuple[uuid.UUID, BaseException]]:
    """Archive the chunk's memories whose backup still matches the live row, in one transaction.

    Invariant: no archive row is committed whose backup was not found as recorded after the rows were
    locked, unless a bucket version keeps its bytes (integrity.recover_from_versions puts that back).
    Those the check does not find are left untouched (hot, attempt still backed up) and returned, with
    why, for the caller to record and send back to be backed up again.
    """
    ids = [a["memory_id"] for a in chunk]
    users = sorted({a["user_id"] for a in chunk})  # every statement names the users: one shard each
    with conn.transaction():
        # The users' write locks before any row lock (memory_lib.core.locks): a forget of the same user
        # waits for this commit, or this commit finds the rows it erased gone.
        lock_users(conn, (a["user_id"] for a in chunk))
        rows = conn.execute(
            f"""SELECT {MEMORY_COLUMNS}, {ROW_XMIN} FROM memories WHERE user_id = ANY(%s) AND id = ANY(%s)
                ORDER BY id FOR UPDATE""",
            (users, ids),
            binary=True,
        ).fetchall()
        live = {r["id"]: r for r in rows}
        # Read under the row locks, and only what is still backed up in this batch: an attempt another
        # run committed, or that a takeover moved, since `todo` was read is not ours to touch.
        meta = {
            r["memory_id"]: r
            for r in conn.execute(
                """SELECT memory_id, user_id, archive_reason, backup_archived_at, backup_key, backup_ref,
                          backup_sha256, backup_size_bytes, backup_version_id, backup_row_xmin
                   FROM archival_attempts
                   WHERE batch_key = %s AND user_id = ANY(%s) AND memory_id = ANY(%s) AND status = 'backed_up'""",
                (batch_key, users, ids),
            ).fetchall()
        }
        ready: list[uuid.UUID] = []
        stale: list[uuid.UUID] = []
        gone: list[uuid.UUID] = []
        for mid in (m for m in ids if m in meta):
            row, att = live.get(mid), meta[mid]
            if row is None:
                gone.append(mid)
                continue
            if backup_still_matches(row, att):
                ready.append(mid)
            else:
                stale.append(mid)
        # Verified here, under the user and row locks and before any original is deleted: a backup
        # deleted or overwritten after an earlier check would leave an archive row without its
        # original, with no version to put back (a network call under the lock, bounded:
        # memory_lib.core.locks).
        missing = _verify_unkept(object_store, [meta[m] for m in ready], workers, deadline)
        ready = [m for m in ready if m not in missing]
        if ready:
            params = {"batch": batch_key, "users": users, "ids": ready}
            # The backup objects the archive rows will name, each recorded once.
            conn.execute(
                packs.RECORD_OBJECTS_SQL,
                {
                    "users": [meta[m]["user_id"] for m in ready],
                    "refs": [meta[m]["backup_ref"] for m in ready],
                },
            )
            inserted = conn.execute(_COMMIT_INSERT, params).rowcount
            if inserted != len(ready):
                raise IntegrityError(f"batch {batch_key} commit", f"{len(ready)} archive rows", f"{inserted}")
            conn.execute(_ARCHIVED_EVENTS_SQL, params | events.event_params(EventType.ARCHIVED, actor, None))
            deleted = conn.execute(
                "DELETE FROM memories WHERE user_id = ANY(%(users)s) AND id = ANY(%(ids)s)", params
            ).rowcount
            if deleted != len(ready):
                raise IntegrityError(f"batch {batch_key} commit", f"{len(ready)} deletions", f"{deleted}")
            # The archive row now holds the summary and its embedding: keep only the record of the
            # attempt, or the checkpoint would cost as much Postgres space as archiving saves.
            conn.execute(
                """UPDATE archival_attempts SET status = 'archived', error = NULL, failed_step = NULL,
                          summary = NULL, summary_embedding = NULL, updated_at = now()
                   WHERE batch_key = %(batch)s AND user_id = ANY(%(users)s) AND memory_id = ANY(%(ids)s)""",
                params,
            )
        if stale:
            # The memory changed after its backup: back it up again rather than archive an old copy.
            conn.execute(
                """UPDATE archival_attempts SET status = 'embedded', updated_at = now()
                   WHERE batch_key = %s AND user_id = ANY(%s) AND memory_id = ANY(%s)""",
                (batch_key, users, stale),
            )
        if gone:
            conn.execute(
                """UPDATE archival_attempts SET status = 'released', error = 'memory deleted before archiving',
                          failed_step = 'commit', updated_at = now()
                   WHERE batch_key = %s AND user_id = ANY(%s) AND memory_id = ANY(%s)""",
                (batch_key, users, gone),
            )
    result.processed += len(ready) + len(gone)
    result.succeeded += len(ready)
    return list(missing.items())


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
