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

The summarize step is in summarizing.py; what every step shares (its result, checkpoints, failures,
threads, deadline, and batch_status) in steps.py. Both are importable from here as before.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from pgvector import Vector

from ..core.config import ArchivalCriteria, Settings
from ..core.errors import (
    DeadlineExceeded,
    EmbeddingMismatchError,
    IntegrityError,
    NotFoundError,
    embedding_mismatch_reason,
)
from ..core.locks import backups_in_flight, lock_users
from ..core.models import BackupObject, sha256_hex
from ..core.rows import Conn, Row
from ..core.statuses import AttemptStatus, EventType, Step
from ..lifecycle.forget import forgetting
from ..llm.embedding import Embedder, embedder_from_settings
from ..llm.summarize import (
    Summarizer,
    summarizer_from_settings,
)
from ..storage import events, packs
from ..storage.db import ONE_CONNECTION_PER_WORKER
from ..storage.object_versions import kept_version
from ..storage.objectstore import ObjectStore, object_store_from_settings
from ..storage.store import MEMORY_COLUMNS, ROW_XMIN, fetch_memories, store_shape
from . import integrity
from .steps import (
    CHECKPOINT_CHUNK,
    BatchStatus,
    Checkpoints,
    StepResult,
    batch_status,
    pending_attempts,
    record_failure,
    run_parallel,
    start_step,
    step_deadline,
)
from .summarizing import accept_summary, summarize_batch, summary_checkpoints

log = logging.getLogger(__name__)

# Moved to .steps and .summarizing; importable from here as before.
__all__ = [
    "CHECKPOINT_CHUNK",
    "LOCKED_VERIFY_SECONDS",
    "ArchivalServices",
    "BatchStatus",
    "StepResult",
    "accept_summary",
    "backup_batch",
    "backup_still_matches",
    "batch_status",
    "check_embedder",
    "commit_batch",
    "embed_batch",
    "record_failure",
    "return_to_status",
    "run_parallel",
    "step_deadline",
    "summarize_batch",
    "summary_checkpoints",
]


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


# --------------------------------------------------------------------------- steps


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
    deadline = start_step(conn, batch_key, criteria)
    check_embedder(conn, embedder)
    todo = pending_attempts(conn, batch_key, AttemptStatus.SUMMARIZED, ", a.summary")

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

    checkpoints = Checkpoints(
        conn,
        batch_key,
        Step.EMBED,
        """UPDATE archival_attempts
           SET status = 'embedded', summary_embedding = %b::vector::halfvec,
               summary_embedding_model = %s, error = NULL, failed_step = NULL, updated_at = now()
           WHERE batch_key = %s AND memory_id = %s AND status = 'summarized' AND user_id = %s""",
        params,
        criteria,
        result,
        users={a["memory_id"]: a["user_id"] for a in todo},
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
    deadline = start_step(conn, batch_key, criteria)
    todo = pending_attempts(conn, batch_key, AttemptStatus.EMBEDDED, ", a.claimed_at")
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
        # Two statements, not coalesce(backup_started_at, now()): Citus refuses now() in a COALESCE on a
        # reference table. Two runs of one batch take turns (claims.working_on), so none races here.
        started_before = conn.execute(
            "SELECT backup_started_at AS at FROM archival_batches WHERE batch_key = %s", (batch_key,)
        ).fetchone()
        conn.execute(
            "UPDATE archival_batches SET backup_started_at = now() WHERE batch_key = %s AND backup_started_at IS NULL",
            (batch_key,),
        )
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

        checkpoints = Checkpoints(
            conn,
            batch_key,
            Step.BACKUP,
            """UPDATE archival_attempts
               SET status = 'backed_up', backup_key = %s, backup_ref = %s, backup_sha256 = %s,
                   backup_size_bytes = %s, backup_version_id = %s, backup_archived_at = %s,
                   backup_row_xmin = %s, error = NULL, failed_step = NULL, updated_at = now()
               WHERE batch_key = %s AND memory_id = %s AND status = 'embedded' AND user_id = %s""",
            params,
            criteria,
            result,
            saved,
            users={a["memory_id"]: a["user_id"] for a in todo},
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
    deadline = start_step(conn, batch_key, criteria)
    todo = pending_attempts(
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
                mid, user = attempt["memory_id"], attempt["user_id"]
                record_failure(conn, batch_key, mid, Step.VERIFY, problem, criteria, result, user_id=user)
                return_to_status(conn, batch_key, mid, AttemptStatus.EMBEDDED, user)
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
        users = {a["memory_id"]: a["user_id"] for a in chunk}
        for mid, problem in missing:  # not archived: hot, and backed up again by the next run
            result.processed += 1
            record_failure(conn, batch_key, mid, Step.VERIFY, problem, criteria, result, user_id=users[mid])
            return_to_status(conn, batch_key, mid, AttemptStatus.EMBEDDED, users[mid])

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
                    record_failure(
                        conn,
                        batch_key,
                        attempt["memory_id"],
                        Step.COMMIT,
                        exc,
                        criteria,
                        result,
                        user_id=attempt["user_id"],
                    )
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


def return_to_status(conn: Conn, batch_key: str, memory_id: uuid.UUID, status: str, user_id: str) -> None:
    conn.execute(
        """UPDATE archival_attempts SET status = %s
           WHERE batch_key = %s AND user_id = %s AND memory_id = %s AND status <> 'released'""",
        (status, batch_key, user_id, memory_id),
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
        conn.execute(ONE_CONNECTION_PER_WORKER)
        # The users' write locks before any row lock (memory_lib.core.locks): a forget of the same user
        # waits for this commit, or this commit finds the rows it erased gone.
        lock_users(conn, (a["user_id"] for a in chunk))
        # Row locks one user at a time: a locking read must route to one shard on Citus.
        live: dict[uuid.UUID, Row] = {}
        for user in users:
            rows = conn.execute(
                f"""SELECT {MEMORY_COLUMNS}, {ROW_XMIN} FROM memories WHERE user_id = %s AND id = ANY(%s)
                    ORDER BY id FOR UPDATE""",
                (user, [a["memory_id"] for a in chunk if a["user_id"] == user]),
                binary=True,
            ).fetchall()
            live.update((r["id"], r) for r in rows)
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
