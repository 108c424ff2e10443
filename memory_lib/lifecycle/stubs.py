"""Stubs: a third tier on top of the archive (sql/011).

An archive row neither expanded nor used for `RetentionConfig.stub_after_days` (a cold-storage
TTL, 180 days) becomes a stub: its summary vector (summary_bits) is dropped, and with it
its entry in the HNSW index, so vector search never returns it. Its summary and full-text entry stay:
search shows it as `[archived] ` + the summary's first 200 characters, found by full text only.
Nothing is lost: the original stays in object storage, and expanding a stub
re-embeds its summary (`restore_vector_plan`), or re-promotes the memory by the existing rule
(memory_lib.lifecycle.promotion: 3 expansions in 30 days).

Invariants:
* A row becomes a stub only after its backup was HEADed and matches the recorded sha256 and size
  (and version id, when both are known); a row whose backup does not verify stays searchable and is
  reported.
* One transaction per batch: the stub UPDATE and its 'stubbed' audit events commit together, and a
  row already a stub is never touched again. Re-running a night, or a run killed between batches and
  re-run, ends in the same state (idempotent, crash-safe).
* Every statement is per row (its own id and user_id); a shard converts only its own users' rows:
  nothing crosses user_id.
* core memories are exempt (they skip the lifecycle), as for the retention policy.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np

from ..core import validation
from ..core.errors import IntegrityError, ObjectNotFoundError
from ..core.plans import Plan, Sql
from ..core.rows import Conn, Row
from ..core.shards import ALL, Shard, shard_filter
from ..storage import events, packs
from ..storage.events import EventType, event
from ..storage.objectstore import ObjectStore, StoredObject
from .eligibility import RETENTION_EXEMPT

STUB_PREFIX = "[archived] "
STUB_CHARS = 200


def stub_text(summary: str) -> str:
    """What a stub shows: `[archived] ` and the summary's first 200 characters."""
    return STUB_PREFIX + summary[:STUB_CHARS]


# Last use of an archive row: archived, expanded or accessed (record_access), whichever is latest.
_LAST_USE = "greatest(a.archived_at, coalesce(a.last_expanded_at, a.archived_at), coalesce(a.last_accessed_at, a.archived_at))"

_DUE_SQL = f"""
    SELECT a.id, a.user_id, a.original_id, {packs.backup_sql("a")}, a.backup_size_bytes,
           a.backup_version_id
    FROM archived_memories a
    WHERE a.stubbed_at IS NULL AND a.id > %(after)s AND {shard_filter("a.user_id")}
      AND a.original_category <> ALL(%(exempt)s) AND {_LAST_USE} <= %(cutoff)s
    ORDER BY a.id LIMIT %(n)s"""

_STUBBED_SQL = """
    SELECT s.original_id AS memory_id, s.user_id,
           jsonb_build_object('archive_id', s.id::text, 'storage_ref', s.storage_ref,
                              'backup_version_id', s.backup_version_id, 'as_of', %(as_of)s::text,
                              'stub_after_days', %(days)s::integer) AS details
    FROM s"""
# The row is re-checked under the UPDATE: an expansion since the HEAD keeps it searchable.
_STUB_SQL = f"""
    WITH s AS (
        UPDATE archived_memories a SET summary_bits = NULL, stubbed_at = %(as_of)s
        WHERE a.id = ANY(%(ids)s) AND a.stubbed_at IS NULL
          AND a.original_category <> ALL(%(exempt)s) AND {_LAST_USE} <= %(cutoff)s
        RETURNING a.id, a.user_id, a.original_id, {packs.ref_sql("a")} AS storage_ref, a.backup_version_id
    )
    {events.insert_select(_STUBBED_SQL)}"""


@dataclass
class StubRun:
    as_of: datetime
    due: int = 0  # rows past stub_after_days, not yet stubs
    stubbed: int = 0
    unverified: dict[str, str] = field(default_factory=dict)  # storage_ref -> why it was kept searchable
    statements: int = 0
    seconds: float = 0.0


def backup_problem(store: ObjectStore, row: Row) -> str | None:
    """None when the row's backup is there as recorded (HEAD: sha256, size, version id), else why not."""
    try:
        obj: StoredObject | None = store.head(store.key_from_ref(row["storage_ref"]))
    except ObjectNotFoundError:
        obj = None
    if obj is None:
        return "missing"
    if obj.sha256 != row["backup_sha256"] or obj.size != row["backup_size_bytes"]:
        return f"differs: sha256 {obj.sha256[:12]}… size {obj.size}"
    if row["backup_version_id"] and obj.version_id and obj.version_id != row["backup_version_id"]:
        return f"another version: {obj.version_id} (recorded {row['backup_version_id']})"
    return None


def _problems(store: ObjectStore, rows: list[Row], workers: int) -> list[str | None]:
    """backup_problem of each row; a pack's members are read with one GET of the pack and each
    checked against its own sha256 (memory_lib.storage.packs), instead of a HEAD each."""
    if not rows:
        return []
    out: list[str | None] = [None] * len(rows)
    packed = [i for i, r in enumerate(rows) if store.locate(r["storage_ref"])[1] is not None]
    in_pack = set(packed)
    whole = [i for i in range(len(rows)) if i not in in_pack]
    if whole:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(whole)))) as pool:
            for i, problem in zip(
                whole, pool.map(lambda i: backup_problem(store, rows[i]), whole), strict=True
            ):
                out[i] = problem
    read = packs.read_members(
        store, [(rows[i]["storage_ref"], rows[i]["backup_sha256"]) for i in packed], workers=workers
    )
    for i, got in zip(packed, read, strict=True):
        if isinstance(got, ObjectNotFoundError):
            out[i] = "missing"
        elif isinstance(got, IntegrityError):
            out[i] = f"differs: {got}"[:300]
        elif isinstance(got, BaseException):
            raise got  # the store down: as a lone backup's HEAD would
    return out


def convert(
    conn: Conn,
    store: ObjectStore,
    as_of: datetime,
    *,
    stub_after_days: int,
    shard: Shard = ALL,
    actor: str = "stub_conversions",
    batch_size: int = 500,
    workers: int = 8,
) -> StubRun:
    """Turn the shard's archive rows unused for `stub_after_days` before `as_of` into stubs, after
    verifying each backup; one transaction per batch of `batch_size` rows."""
    as_of = validation.timestamp("as_of", as_of).astimezone(UTC)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    started = time.monotonic()
    run = StubRun(as_of)
    cutoff = as_of - timedelta(days=stub_after_days)
    # The event's time: the database clock when the stub is made (as_of is in its details).
    params = (
        shard.params()
        | events.event_params(EventType.STUBBED, actor, None)
        | {
            "cutoff": cutoff,
            "as_of": as_of,
            "exempt": list(RETENTION_EXEMPT),
            "days": stub_after_days,
            "n": batch_size,
        }
    )
    after = uuid.UUID(int=0)
    while True:
        rows = conn.execute(_DUE_SQL, params | {"after": after}).fetchall()
        if not rows:
            break
        run.due += len(rows)
        ok = []
        for row, problem in zip(rows, _problems(store, rows, workers), strict=True):
            if problem is None:
                ok.append(row["id"])
            else:
                run.unverified[row["storage_ref"]] = problem
        if ok:
            with conn.transaction():
                run.stubbed += conn.execute(_STUB_SQL, params | {"ids": ok}).rowcount
            run.statements += 1
        after = rows[-1]["id"]
    run.seconds = time.monotonic() - started
    return run


@dataclass(frozen=True)
class StubBackups:
    """Every stub of a shard HEADed: its backup must still be there as recorded."""

    stubs: int
    missing: list[str]  # storage refs
    mismatched: dict[str, str]  # storage ref -> how it differs

    @property
    def passed(self) -> bool:
        return not (self.missing or self.mismatched)


def verify_stub_backups(
    conn: Conn, store: ObjectStore, *, shard: Shard = ALL, workers: int = 8
) -> StubBackups:
    """Read-only: HEAD the backup of every stub of `shard`'s users (a stub's only full copy)."""
    rows = conn.execute(
        f"""SELECT {packs.backup_sql("a")}, a.backup_size_bytes, a.backup_version_id
            FROM archived_memories a WHERE a.stubbed_at IS NOT NULL AND {shard_filter("a.user_id")}
            ORDER BY a.id""",
        shard.params(),
    ).fetchall()
    missing: list[str] = []
    mismatched: dict[str, str] = {}
    for row, problem in zip(rows, _problems(store, rows, workers), strict=True):
        if problem == "missing":
            missing.append(row["storage_ref"])
        elif problem is not None:
            mismatched[row["storage_ref"]] = problem
    return StubBackups(len(rows), missing, mismatched)


# --------------------------------------------------------------------------- expanding a stub

_STUB_SUMMARY_SQL = """
    SELECT summary FROM archived_memories
    WHERE user_id = %(user_id)s AND id = %(archive_id)s AND stubbed_at IS NOT NULL"""
_RESTORE_VECTOR_SQL = f"""
    UPDATE archived_memories a SET summary_embedding = %(embedding)s::vector::halfvec, stubbed_at = NULL,
           summary_embedding_model = %(model)s
    WHERE a.user_id = %(user_id)s AND a.id = %(archive_id)s AND a.stubbed_at IS NOT NULL
    RETURNING a.original_id, {packs.ref_sql("a")} AS storage_ref"""


def stub_summary_plan(user_id: str, archive_id: uuid.UUID) -> Plan[str | None]:
    """The summary of the archive row when it is a stub of this user, else None (read-only)."""
    row = yield Sql(_STUB_SUMMARY_SQL, {"user_id": user_id, "archive_id": archive_id}, "one")
    return None if row is None else row["summary"]


def restore_vector_plan(
    user_id: str, archive_id: uuid.UUID, embedding: np.ndarray, *, model: str, actor: str, now: datetime
) -> Plan[bool]:
    """Give a stub its summary vector back (the trigger of 007 stores its bits), audited 'unstubbed'.
    False, writing nothing, when the row is no longer a stub (restored by a concurrent expand)."""
    row = yield Sql(
        _RESTORE_VECTOR_SQL,
        {"user_id": user_id, "archive_id": archive_id, "embedding": embedding, "model": model},
        "one",
    )
    if row is None:
        return False
    yield event(
        row["original_id"],
        user_id,
        EventType.UNSTUBBED,
        actor,
        now,
        {"archive_id": str(archive_id), "storage_ref": row["storage_ref"]},
    )
    return True
