"""The archival step and its inverse.

A batch goes through checkpointed steps, each recorded per memory in `archival_attempts`:

    claim -> summarize -> embed summary -> back up original (put + verify) -> commit

`commit` is one transaction per chunk that, for each memory, re-checks that the backup still
matches the live row, inserts the archive row, deletes the original and writes the audit event.
A failure at any step leaves the memory hot with the error recorded; running the step again
retries it. Killing the process anywhere loses at most in-flight work: every step is idempotent.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from .config import ArchivalCriteria, Settings
from .embedding import Embedder
from .errors import EmbeddingMismatchError, IntegrityError, InvalidInputError, NotFoundError
from .models import BackupObject, sha256_hex
from .objectstore import ObjectStore
from .store import MEMORY_COLUMNS, fetch_memories, store_shape
from .summarize import Summarizer, SummaryInput, extract_key_entities

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

OPEN_STATUSES = ("claimed", "summarized", "embedded", "backed_up")
REASON_LOW_IMPORTANCE = "stale_low_importance"
REASON_FORCE_AGE = "force_age"


@dataclass(frozen=True)
class ArchivalServices:
    summarizer: Summarizer
    embedder: Embedder
    object_store: ObjectStore

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchivalServices:
        from .embedding import embedder_from_settings
        from .objectstore import object_store_from_settings
        from .summarize import summarizer_from_settings

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
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClaimResult:
    batch_key: str
    as_of: datetime
    claimed: int
    by_reason: dict[str, int]
    newly_claimed: bool


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
        return self.by_status.get("archived", 0)


# --------------------------------------------------------------------------- eligibility


def criteria_params(criteria: ArchivalCriteria, as_of: datetime) -> dict[str, Any]:
    return {
        "min_cutoff": as_of - timedelta(days=criteria.min_age_days),
        "force_cutoff": as_of - timedelta(days=criteria.force_archive_age_days),
        "recent_cutoff": as_of - timedelta(days=criteria.recent_access_window_days),
        "max_imp": criteria.max_importance_score,
        "max_access": criteria.max_recent_access_count,
        "exempt": list(criteria.exempt_categories),
    }


# Eligible = old enough, not pinned or exempt, not in an open attempt, not in active use, and either
# unimportant or past the force age. "In active use" = more accesses than allowed with the last one
# inside the recent window (the table keeps a count and a last-access time, not a full access log).
ELIGIBLE_SQL = """
    FROM memories m
    WHERE NOT m.pinned
      AND m.category <> ALL(%(exempt)s)
      AND m.created_at <= %(min_cutoff)s
      AND (m.importance_score <= %(max_imp)s OR m.created_at <= %(force_cutoff)s)
      AND NOT (m.access_count > %(max_access)s AND m.last_accessed_at >= %(recent_cutoff)s)
      AND NOT EXISTS (SELECT 1 FROM archival_attempts a
                      WHERE a.memory_id = m.id AND a.status IN ('claimed','summarized','embedded','backed_up'))
"""
REASON_SQL = f"""CASE WHEN m.importance_score <= %(max_imp)s THEN '{REASON_LOW_IMPORTANCE}'
                      ELSE '{REASON_FORCE_AGE}' END"""


def eligible_counts(conn: psycopg.Connection, criteria: ArchivalCriteria, as_of: datetime) -> dict[str, int]:
    """How many hot memories are eligible now, by archive reason (read-only)."""
    rows = conn.execute(
        f"SELECT {REASON_SQL} AS reason, count(*) AS n {ELIGIBLE_SQL} GROUP BY 1",
        criteria_params(criteria, as_of),
    ).fetchall()
    return {r["reason"]: r["n"] for r in rows}


def select_eligible(
    conn: psycopg.Connection, criteria: ArchivalCriteria, as_of: datetime, limit: int
) -> list[dict[str, Any]]:
    """Eligible memories, lowest importance then oldest first (read-only, no locks)."""
    params = criteria_params(criteria, as_of) | {"limit": limit}
    return conn.execute(
        f"""SELECT m.id, m.user_id, {REASON_SQL} AS reason {ELIGIBLE_SQL}
            ORDER BY m.importance_score, m.created_at, m.id LIMIT %(limit)s""",
        params,
    ).fetchall()


def claim_batch(
    conn: psycopg.Connection,
    batch_key: str,
    criteria: ArchivalCriteria,
    as_of: datetime,
    *,
    limit: int | None = None,
) -> ClaimResult:
    """Claim up to `limit` (default criteria.batch_size) eligible memories for `batch_key`.

    Idempotent: a batch is claimed once; claiming it again returns what it already holds.
    Concurrent claimers never share a memory (row locks with SKIP LOCKED, and a unique index on
    open attempts).
    """
    if not batch_key or "\x00" in batch_key:
        raise InvalidInputError("batch_key", batch_key, "must be a non-empty string")
    as_of = as_of.astimezone(UTC)
    limit = criteria.batch_size if limit is None else limit
    if not 0 <= limit <= criteria.batch_size:
        raise InvalidInputError("limit", limit, f"must be between 0 and batch_size={criteria.batch_size}")
    with conn.transaction():
        inserted = conn.execute(
            """INSERT INTO archival_batches (batch_key, as_of, criteria, claimed_count)
               VALUES (%s, %s, %s, 0) ON CONFLICT (batch_key) DO NOTHING RETURNING batch_key""",
            (batch_key, as_of, Jsonb(criteria.model_dump(mode="json"))),
        ).fetchone()
        if inserted is None:
            existing = conn.execute("SELECT as_of FROM archival_batches WHERE batch_key = %s", (batch_key,)).fetchone()
            by_reason = _reason_counts(conn, batch_key)
            return ClaimResult(batch_key, existing["as_of"], sum(by_reason.values()), by_reason, False)
        params = criteria_params(criteria, as_of) | {"limit": limit}
        rows = conn.execute(
            f"""SELECT m.id, m.user_id, {REASON_SQL} AS reason {ELIGIBLE_SQL}
                ORDER BY m.importance_score, m.created_at, m.id LIMIT %(limit)s
                FOR UPDATE OF m SKIP LOCKED""",
            params,
        ).fetchall()
        claimed = 0
        if rows:
            with conn.cursor() as cur:
                cur.executemany(
                    """INSERT INTO archival_attempts (batch_key, memory_id, user_id, archive_reason)
                       VALUES (%s, %s, %s, %s)
                       ON CONFLICT (memory_id) WHERE status NOT IN ('archived', 'released') DO NOTHING""",
                    [(batch_key, r["id"], r["user_id"], r["reason"]) for r in rows],
                )
            claimed = len(rows)
        conn.execute("UPDATE archival_batches SET claimed_count = %s WHERE batch_key = %s", (claimed, batch_key))
    by_reason = _reason_counts(conn, batch_key)
    return ClaimResult(batch_key, as_of, sum(by_reason.values()), by_reason, True)


def _reason_counts(conn: psycopg.Connection, batch_key: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT archive_reason, count(*) AS n FROM archival_attempts WHERE batch_key = %s GROUP BY 1",
        (batch_key,),
    ).fetchall()
    return {r["archive_reason"]: r["n"] for r in rows}


# --------------------------------------------------------------------------- step plumbing


def _pending(conn: psycopg.Connection, batch_key: str, status: str, extra_cols: str = "") -> list[dict[str, Any]]:
    return conn.execute(
        f"""SELECT a.memory_id, a.user_id, a.archive_reason, a.attempts {extra_cols}
            FROM archival_attempts a WHERE a.batch_key = %s AND a.status = %s ORDER BY a.memory_id""",
        (batch_key, status),
    ).fetchall()


def record_failure(
    conn: psycopg.Connection, batch_key: str, memory_id: uuid.UUID, step: str, exc: BaseException,
    criteria: ArchivalCriteria, result: StepResult,
) -> None:
    message = f"{type(exc).__name__}: {exc}"[:1000]
    row = conn.execute(
        """UPDATE archival_attempts
           SET attempts = attempts + 1, failed_step = %s, error = %s, updated_at = now(),
               status = CASE WHEN attempts + 1 >= %s THEN 'released' ELSE status END
           WHERE batch_key = %s AND memory_id = %s RETURNING status""",
        (step, message, criteria.max_attempts, batch_key, memory_id),
    ).fetchone()
    result.failed += 1
    if row and row["status"] == "released":
        result.released += 1
    if len(result.errors) < 20:
        result.errors.append(f"{memory_id}: {message}")
    log.warning("archival %s failed for memory %s: %s", step, memory_id, message)


def run_parallel(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterable[tuple[T, R | BaseException]]:
    """Run fn over items in threads; yield (item, result or exception) in input order."""

    def safe(item: T) -> R | BaseException:
        try:
            return fn(item)
        except Exception as exc:  # recorded per memory by the caller
            return exc

    if workers <= 1 or len(items) <= 1:
        for item in items:
            yield item, safe(item)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from zip(items, pool.map(safe, items), strict=True)


# --------------------------------------------------------------------------- steps


def summarize_batch(
    conn: psycopg.Connection, batch_key: str, summarizer: Summarizer, criteria: ArchivalCriteria,
    *, workers: int = 4,
) -> StepResult:
    """Summarize every claimed memory of the batch that has no summary yet."""
    result = StepResult("summarize")
    started = time.monotonic()
    todo = _pending(conn, batch_key, "claimed")
    originals = fetch_memories(conn, [r["memory_id"] for r in todo])

    def run(attempt: dict[str, Any]):
        row = originals.get(attempt["memory_id"])
        if row is None:
            raise NotFoundError(f"memory {attempt['memory_id']} no longer exists")
        item = SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
        return summarizer.summarize(item), extract_key_entities(row["content"])

    for attempt, outcome in run_parallel(run, todo, workers):
        result.processed += 1
        mid = attempt["memory_id"]
        if isinstance(outcome, BaseException):
            record_failure(conn, batch_key, mid, "summarize", outcome, criteria, result)
            continue
        summary, entities = outcome
        conn.execute(
            """UPDATE archival_attempts
               SET status = 'summarized', summary = %s, summary_model = %s, summarizer_kind = %s,
                   key_entities = %s, input_tokens = %s, output_tokens = %s, cost_usd = %s,
                   error = NULL, failed_step = NULL, updated_at = now()
               WHERE batch_key = %s AND memory_id = %s AND status = 'claimed'""",
            (summary.text, summary.model, summary.kind, entities, summary.input_tokens,
             summary.output_tokens, summary.cost_usd, batch_key, mid),
        )  # fmt: skip
        result.succeeded += 1
        result.input_tokens += summary.input_tokens
        result.output_tokens += summary.output_tokens
        result.cost_usd += summary.cost_usd
    result.seconds = time.monotonic() - started
    return result


def check_embedder(conn: psycopg.Connection, embedder: Embedder) -> None:
    """Summary embeddings are searched with the same query vector as hot memories: same model and dim."""
    shape = store_shape(conn)
    if embedder.dim != shape.dim:
        raise EmbeddingMismatchError("embedder.dim", embedder.dim, f"this database holds {shape.dim}-d embeddings")
    if shape.embedding_model is not None and embedder.model != shape.embedding_model:
        raise EmbeddingMismatchError(
            "embedder.model", embedder.model, f"this database's embeddings come from {shape.embedding_model!r}"
        )


def embed_batch(
    conn: psycopg.Connection, batch_key: str, embedder: Embedder, criteria: ArchivalCriteria,
    *, chunk_size: int = 64,
) -> StepResult:
    """Embed every summary of the batch that has no embedding yet."""
    result = StepResult("embed")
    started = time.monotonic()
    check_embedder(conn, embedder)
    todo = _pending(conn, batch_key, "summarized", ", a.summary")
    for i in range(0, len(todo), chunk_size):
        chunk = todo[i : i + chunk_size]
        try:
            vectors = list(embedder.embed([r["summary"] for r in chunk]))
        except Exception:
            # Isolate the bad input: one failing summary must not fail its neighbours.
            vectors = []
            for r in chunk:
                try:
                    vectors.append(embedder.embed([r["summary"]])[0])
                except Exception as exc:
                    vectors.append(exc)
        for attempt, vec in zip(chunk, vectors, strict=True):
            result.processed += 1
            if isinstance(vec, BaseException):
                record_failure(conn, batch_key, attempt["memory_id"], "embed", vec, criteria, result)
                continue
            conn.execute(
                """UPDATE archival_attempts
                   SET status = 'embedded', summary_embedding = %s::vector::halfvec,
                       summary_embedding_model = %s, error = NULL, failed_step = NULL, updated_at = now()
                   WHERE batch_key = %s AND memory_id = %s AND status = 'summarized'""",
                (vec, embedder.model, batch_key, attempt["memory_id"]),
            )
            result.succeeded += 1
    result.seconds = time.monotonic() - started
    return result


def backup_batch(
    conn: psycopg.Connection, batch_key: str, object_store: ObjectStore, criteria: ArchivalCriteria,
    *, workers: int = 8, now: datetime | None = None,
) -> StepResult:
    """Write each original as a backup object, verify it, and checkpoint its sha256 and size."""
    result = StepResult("backup")
    started = time.monotonic()
    todo = _pending(conn, batch_key, "embedded")
    originals = fetch_memories(conn, [r["memory_id"] for r in todo])
    archived_at = (now or datetime.now(UTC)).astimezone(UTC)

    def run(attempt: dict[str, Any]):
        row = originals.get(attempt["memory_id"])
        if row is None:
            raise NotFoundError(f"memory {attempt['memory_id']} no longer exists")
        doc = BackupObject.from_row(row, archived_at=archived_at, archive_reason=attempt["archive_reason"])
        data = doc.to_json_bytes()
        key = object_store.key_for(row["id"])
        return object_store.put(key, data, sha256_hex(data))

    for attempt, outcome in run_parallel(run, todo, workers):
        result.processed += 1
        mid = attempt["memory_id"]
        if isinstance(outcome, BaseException):
            record_failure(conn, batch_key, mid, "backup", outcome, criteria, result)
            continue
        conn.execute(
            """UPDATE archival_attempts
               SET status = 'backed_up', backup_key = %s, backup_ref = %s, backup_sha256 = %s,
                   backup_size_bytes = %s, backup_version_id = %s, backup_archived_at = %s,
                   error = NULL, failed_step = NULL, updated_at = now()
               WHERE batch_key = %s AND memory_id = %s AND status = 'embedded'""",
            (outcome.key, outcome.ref, outcome.sha256, outcome.size, outcome.version_id, archived_at,
             batch_key, mid),
        )  # fmt: skip
        result.succeeded += 1
        result.bytes_written += outcome.size
    result.seconds = time.monotonic() - started
    return result


_COMMIT_INSERT = """
    INSERT INTO archived_memories (
        original_id, user_id, summary, summary_embedding, summary_embedding_model, key_entities,
        original_domain, original_category, original_embedding_model, original_updated_at,
        original_superseded_by, importance_score, access_count, last_accessed_at, archived_at,
        original_created_at, archive_reason, storage_ref, storage_verified, backup_sha256,
        backup_size_bytes, backup_version_id, schema_version, summary_model, summarizer_kind,
        summary_input_tokens, summary_output_tokens, summary_cost_usd, metadata, original_dedupe_key)
    SELECT m.id, m.user_id, a.summary, a.summary_embedding, a.summary_embedding_model,
           coalesce(a.key_entities, '{}'), m.domain, m.category, m.embedding_model, m.updated_at,
           m.superseded_by, m.importance_score, m.access_count, m.last_accessed_at, a.backup_archived_at,
           m.created_at, a.archive_reason, a.backup_ref, true, a.backup_sha256, a.backup_size_bytes,
           a.backup_version_id, 1, a.summary_model, a.summarizer_kind, coalesce(a.input_tokens, 0),
           coalesce(a.output_tokens, 0), coalesce(a.cost_usd, 0),
           jsonb_build_object('batch_key', a.batch_key, 'backup_key', a.backup_key), m.dedupe_key
    FROM archival_attempts a JOIN memories m ON m.id = a.memory_id
    WHERE a.batch_key = %(batch)s AND a.memory_id = ANY(%(ids)s) AND a.status = 'backed_up'
"""


def commit_batch(
    conn: psycopg.Connection, batch_key: str, object_store: ObjectStore, criteria: ArchivalCriteria,
    *, actor: str, chunk_size: int = 100, workers: int = 8,
) -> StepResult:
    """Replace each backed-up original by its archive row, in one transaction per chunk.

    Before deleting, the backup is verified in object storage and the live row is re-serialized:
    if the memory changed since its backup, it goes back to be backed up again instead.
    """
    result = StepResult("commit")
    started = time.monotonic()
    todo = _pending(conn, batch_key, "backed_up", ", a.backup_key, a.backup_sha256, a.backup_size_bytes")

    def verify(attempt: dict[str, Any]):
        return object_store.verify(attempt["backup_key"], attempt["backup_sha256"], attempt["backup_size_bytes"])

    verified: list[dict[str, Any]] = []
    for attempt, outcome in run_parallel(verify, todo, workers):
        if isinstance(outcome, BaseException):
            result.processed += 1
            record_failure(conn, batch_key, attempt["memory_id"], "verify", outcome, criteria, result)
            return_to_status(conn, batch_key, attempt["memory_id"], "embedded")
        else:
            verified.append(attempt)
    for i in range(0, len(verified), chunk_size):
        chunk = verified[i : i + chunk_size]
        try:
            _commit_chunk(conn, batch_key, chunk, actor, result)
        except psycopg.Error:
            # One bad row must not block its chunk: retry one memory per transaction.
            for attempt in chunk:
                try:
                    _commit_chunk(conn, batch_key, [attempt], actor, result)
                except psycopg.Error as exc:
                    result.processed += 1
                    record_failure(conn, batch_key, attempt["memory_id"], "commit", exc, criteria, result)
    result.seconds = time.monotonic() - started
    return result


def return_to_status(conn: psycopg.Connection, batch_key: str, memory_id: uuid.UUID, status: str) -> None:
    conn.execute(
        "UPDATE archival_attempts SET status = %s WHERE batch_key = %s AND memory_id = %s AND status <> 'released'",
        (status, batch_key, memory_id),
    )


def _commit_chunk(
    conn: psycopg.Connection, batch_key: str, chunk: list[dict[str, Any]], actor: str, result: StepResult
) -> None:
    ids = [a["memory_id"] for a in chunk]
    with conn.transaction():
        rows = conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ids,)
        ).fetchall()
        live = {r["id"]: r for r in rows}
        meta = {
            r["memory_id"]: r
            for r in conn.execute(
                """SELECT memory_id, archive_reason, backup_archived_at, backup_sha256 FROM archival_attempts
                   WHERE batch_key = %s AND memory_id = ANY(%s)""",
                (batch_key, ids),
            ).fetchall()
        }
        ready: list[uuid.UUID] = []
        stale: list[uuid.UUID] = []
        gone: list[uuid.UUID] = []
        for mid in ids:
            row, att = live.get(mid), meta[mid]
            if row is None:
                gone.append(mid)
                continue
            doc = BackupObject.from_row(row, archived_at=att["backup_archived_at"], archive_reason=att["archive_reason"])
            if sha256_hex(doc.to_json_bytes()) == att["backup_sha256"]:
                ready.append(mid)
            else:
                stale.append(mid)
        if ready:
            params = {"batch": batch_key, "ids": ready}
            conn.execute(_COMMIT_INSERT, params)
            conn.execute(
                """INSERT INTO memory_events (memory_id, user_id, event_type, actor, details)
                   SELECT a.memory_id, a.user_id, 'archived', %(actor)s,
                          jsonb_build_object('batch_key', a.batch_key, 'reason', a.archive_reason,
                                             'storage_ref', a.backup_ref, 'sha256', a.backup_sha256)
                   FROM archival_attempts a WHERE a.batch_key = %(batch)s AND a.memory_id = ANY(%(ids)s)""",
                params | {"actor": actor},
            )
            deleted = conn.execute("DELETE FROM memories WHERE id = ANY(%(ids)s)", params).rowcount
            if deleted != len(ready):
                raise IntegrityError(f"batch {batch_key} commit", f"{len(ready)} deletions", f"{deleted}")
            # The archive row now holds the summary and its embedding: keep only the record of the
            # attempt, or the checkpoint would cost as much Postgres space as archiving saves.
            conn.execute(
                """UPDATE archival_attempts SET status = 'archived', error = NULL, failed_step = NULL,
                          summary = NULL, summary_embedding = NULL, updated_at = now()
                   WHERE batch_key = %(batch)s AND memory_id = ANY(%(ids)s)""",
                params,
            )
        if stale:
            # The memory changed after its backup: back it up again rather than archive an old copy.
            conn.execute(
                """UPDATE archival_attempts SET status = 'embedded', updated_at = now()
                   WHERE batch_key = %s AND memory_id = ANY(%s)""",
                (batch_key, stale),
            )
        if gone:
            conn.execute(
                """UPDATE archival_attempts SET status = 'released', error = 'memory deleted before archiving',
                          failed_step = 'commit', updated_at = now()
                   WHERE batch_key = %s AND memory_id = ANY(%s)""",
                (batch_key, gone),
            )
    result.processed += len(ready) + len(gone)
    result.succeeded += len(ready)


# --------------------------------------------------------------------------- batch views


def batch_status(conn: psycopg.Connection, batch_key: str) -> BatchStatus:
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
    attempted = sum(by_status.values())
    return BatchStatus(batch_key, dict(by_status), attempted, sum(failed_by_step.values()), dict(failed_by_step))


@dataclass
class BatchReport:
    claim: ClaimResult
    steps: list[StepResult]
    status: BatchStatus
    gate_passed: bool


def archive_batch(
    conn: psycopg.Connection,
    services: ArchivalServices,
    criteria: ArchivalCriteria,
    *,
    batch_key: str,
    as_of: datetime,
    actor: str,
    limit: int | None = None,
    workers: int = 4,
) -> BatchReport:
    """Run every step of one batch; commit only when the batch's error rate is within the gate."""
    claim = claim_batch(conn, batch_key, criteria, as_of, limit=limit)
    steps = [
        summarize_batch(conn, batch_key, services.summarizer, criteria, workers=workers),
        embed_batch(conn, batch_key, services.embedder, criteria),
        backup_batch(conn, batch_key, services.object_store, criteria, workers=workers),
    ]
    status = batch_status(conn, batch_key)
    gate_passed = status.error_rate <= criteria.max_error_rate
    if gate_passed:
        steps.append(commit_batch(conn, batch_key, services.object_store, criteria, actor=actor, workers=workers))
        status = batch_status(conn, batch_key)
    else:
        log.error(
            "batch %s: error rate %.1f%% above %.1f%%: originals kept, nothing archived",
            batch_key, 100 * status.error_rate, 100 * criteria.max_error_rate,
        )  # fmt: skip
    return BatchReport(claim, steps, status, gate_passed)


# --------------------------------------------------------------------------- restore


@dataclass(frozen=True)
class RestoreResult:
    original_id: uuid.UUID
    user_id: str
    restored: bool  # False when it was already hot (idempotent re-run)


def restore_archive(
    conn: psycopg.Connection,
    object_store: ObjectStore,
    *,
    user_id: str,
    original_id: uuid.UUID | None = None,
    archive_id: uuid.UUID | None = None,
    actor: str,
    now: datetime | None = None,
) -> RestoreResult:
    """Bring one archived memory back to `memories` exactly as it was, in one transaction.

    The backup is verified against the sha256 recorded at archival before anything is written.
    Restoring a memory that is already hot is a no-op. The backup object is kept: it is the record
    of what was archived, and the next archival overwrites it. (The statements are
    promotion.restore_plan's, shared with re-promotion and the async client.)
    """
    from .promotion import restore_plan
    from .search import run_plan

    plan = restore_plan(
        user_id, archive_id=archive_id, original_id=original_id, actor=actor, now=now or datetime.now(UTC)
    )
    outcome = run_plan(conn, plan, object_store=object_store)
    return RestoreResult(outcome.memory_id, outcome.user_id, outcome.restored)


def archived_ids(
    conn: psycopg.Connection, *, user_id: str | None = None, limit: int | None = None
) -> list[tuple[str, uuid.UUID]]:
    """(user_id, original_id) of archived memories, oldest archive first."""
    rows = conn.execute(
        """SELECT user_id, original_id FROM archived_memories
           WHERE (%(u)s::text IS NULL OR user_id = %(u)s) ORDER BY archived_at, original_id LIMIT %(n)s""",
        {"u": user_id, "n": limit},
    ).fetchall()
    return [(r["user_id"], r["original_id"]) for r in rows]
