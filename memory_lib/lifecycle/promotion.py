"""Expansion on demand, re-promotion, access tracking and the nightly promotion sweep.

`expand` reads an archived memory's original from object storage, verified against the sha256
recorded at archival (a mismatch raises IntegrityError and nothing is recorded), before it locks
anything (memory_lib.core.locks); then, in one transaction that re-checks the row is still the one read,
it appends an 'expanded' event (memory_events is the expansion log), bumps the archive row's
expansion_count and last_expanded_at, and re-promotes the memory to `memories` when the expansions of
this archive row within `PromotionConfig.window_days` reach `expansions_to_promote` (default: 3 in 30
days). Expansions count per archive row (the event's details.archive_id), so a memory archived
again starts from zero. Uses through an association (record_access of an archived memory a live hot
memory links to: memory_lib.retrieval.associations, table archive_link_uses) count as expansions: the rule is
"N uses in the window", here and only here (EXPANSIONS_IN_WINDOW_SQL, DUE_FOR_PROMOTION_SQL).

`sweep_promotions` applies the same rule to every archive row nightly, for rule changes and for
promotions an expansion could not complete; each promotion is its own transaction and re-running is
a no-op.

The restore here is `archive.restore_archive` as a flow: the same statements, runnable on sync and
async connections. Every move back to hot (expand_flow, promote_flow, restore_flow) reads and verifies
the backup, and re-embeds its text when its space is not the active one, with no transaction open, then
locks and writes; the row and the active space are re-read under the locks and the move starts over
when either changed meanwhile (`_Read.unchanged`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.config import PromotionConfig
from ..core.errors import IntegrityError, InvalidInputError, MemoryArchiveError, NotFoundError
from ..core.locks import USER_LOCK_SQL
from ..core.models import BackupObject, sha256_hex
from ..core.plans import EmbedText, Flow, GetVerified, Plan, RunPlan, Sql, drive, run_plan
from ..retrieval.associations import LINK_USES_SQL
from ..storage import packs
from ..storage.events import EventType, event, events
from ..storage.space import SHAPE_SQL
from ..storage.store import MEMORY_COLUMNS

if TYPE_CHECKING:
    from ..core.rows import Conn, Row
    from ..llm.embedding import Embedder
    from ..storage.objectstore import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expansion:
    user_id: str
    memory_id: uuid.UUID  # the original memory's id
    archive_id: uuid.UUID
    content: str  # the exact original text, verified
    original: BackupObject  # the whole verified backup (embedding, metadata, timestamps)
    storage_ref: str
    expansions_in_window: int
    promoted: bool  # True when this expansion brought the memory back to the hot tier
    vector_restored: bool = False  # True when the row was a stub and got its summary vector back (stubs.py)


@dataclass(frozen=True)
class RestoreOutcome:
    user_id: str
    memory_id: uuid.UUID
    archive_id: uuid.UUID | None
    restored: bool  # False when the memory was already hot (idempotent)


# --------------------------------------------------------------------------- SQL

# An archive row as every move reads it: its columns and its backup (storage_ref, backup_sha256).
ARCHIVE_ROW = f"a.*, {packs.backup_sql('a')}"
# The same from JOINED_FROM: the backup object by a join on (user_id, id) instead of packs.ref_sql's
# correlated subquery, so that a locking read of one user routes to that user's shard (Citus refuses
# FOR UPDATE across shards, and the subquery makes the statement multi-shard).
JOINED_ROW = (
    "a.*, backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) AS storage_ref,"
    " encode(a.backup_digest, 'hex') AS backup_sha256"
)
JOINED_FROM = (
    "archived_memories a LEFT JOIN backup_objects o ON o.user_id = a.user_id AND o.id = a.backup_object"
)
ARCHIVE_SQL = f"""
    SELECT {JOINED_ROW} FROM {JOINED_FROM}
    WHERE a.user_id = %(user_id)s AND a.id = %(archive_id)s"""
ARCHIVE_BY_ORIGINAL_SQL = f"""
    SELECT {JOINED_ROW} FROM {JOINED_FROM}
    WHERE a.user_id = %(user_id)s AND a.original_id = %(original_id)s"""
LOCK_ARCHIVE_SQL = ARCHIVE_SQL + " FOR UPDATE OF a"
LOCK_ARCHIVE_BY_ORIGINAL_SQL = ARCHIVE_BY_ORIGINAL_SQL + " FOR UPDATE OF a"
HOT_BY_ID_SQL = "SELECT id, content FROM memories WHERE user_id = %(user_id)s AND id = %(id)s"
# An archive id that was promoted or restored: the memory it became, when still hot.
PROMOTED_FROM_SQL = """
    SELECT m.id, m.content FROM memory_events e JOIN memories m ON m.id = e.memory_id AND m.user_id = e.user_id
    WHERE e.user_id = %(user_id)s AND e.event_type IN ('promoted', 'restored')
      AND e.details ->> 'archive_id' = %(archive_id)s
    ORDER BY e.occurred_at DESC LIMIT 1"""
# An id of the other kind: an archive id (archived_memories.id, what search and expand return) given as
# an original_id, or a memory's own id given as an archive id (restore says which it is).
ORIGINAL_OF_ARCHIVE_SQL = """
    SELECT original_id FROM archived_memories
    WHERE id = %(id)s AND (%(u)s::text IS NULL OR user_id = %(u)s) LIMIT 1"""
IS_MEMORY_ID_SQL = """
    SELECT EXISTS (SELECT 1 FROM archived_memories
                   WHERE original_id = %(id)s AND (%(u)s::text IS NULL OR user_id = %(u)s))
        OR EXISTS (SELECT 1 FROM memories WHERE id = %(id)s AND (%(u)s::text IS NULL OR user_id = %(u)s)) AS found"""
AN_ARCHIVE_ID = (
    "that is an archive id (what search and expand return), not an original_id; its original_id is {}"
)
AN_ORIGINAL_ID = "that is a memory's original_id, not an archive id: restore it by original_id"
BUMP_EXPANSION_SQL = """
    UPDATE archived_memories SET expansion_count = expansion_count + 1,
           last_expanded_at = greatest(coalesce(last_expanded_at, %(now)s), %(now)s)
    WHERE user_id = %(user_id)s AND id = %(archive_id)s"""
# The rule's uses of one archive row in the window: its expansions and its uses through an association.
EXPANSIONS_IN_WINDOW_SQL = """
    SELECT (SELECT count(*) FROM memory_events
            WHERE memory_id = %(memory_id)s AND user_id = %(user_id)s AND event_type = 'expanded'
              AND details ->> 'archive_id' = %(archive_id)s
              AND occurred_at > %(since)s AND occurred_at <= %(now)s)
         + (SELECT count(*) FROM archive_link_uses
            WHERE archive_id = %(archive_id)s::uuid AND user_id = %(user_id)s
              AND used_at > %(since)s AND used_at <= %(now)s) AS n"""
DUE_FOR_PROMOTION_SQL = """
    WITH uses AS (
        SELECT e.user_id, e.memory_id AS original_id, e.details ->> 'archive_id' AS archive_id
        FROM memory_events e
        WHERE e.event_type = 'expanded' AND e.occurred_at > %(since)s AND e.occurred_at <= %(now)s
        UNION ALL
        SELECT u.user_id, u.original_id, u.archive_id::text
        FROM archive_link_uses u WHERE u.used_at > %(since)s AND u.used_at <= %(now)s
    )
    SELECT a.id AS archive_id, a.user_id, count(*) AS expansions
    FROM uses JOIN archived_memories a ON a.original_id = uses.original_id AND a.user_id = uses.user_id
                                      AND uses.archive_id = a.id::text
    GROUP BY a.id, a.user_id HAVING count(*) >= %(needed)s
    ORDER BY a.id LIMIT %(limit)s"""
# restore_many_rows_plan: the statement heads, then one VALUES row per memory (parameters suffixed _i).
# restored_at: the restore is a use and a new start for the archival criteria (sql/025, eligibility.py).
RESTORE_INSERT_SQL = f"INSERT INTO memories ({MEMORY_COLUMNS}, restored_at) VALUES\n"
_RESTORE_ROW = (
    "(%(id_{i})s, %(user_id_{i})s, %(content_{i})s, %(content_sha256_{i})s, %(embedding_{i})s, "
    "%(embedding_model_{i})s, %(embedding_dim_{i})s, %(entity_links_{i})s, %(metadata_{i})s, %(domain_{i})s, "
    "%(category_{i})s, %(importance_score_{i})s, %(access_count_{i})s, %(last_accessed_at_{i})s, "
    "%(created_at_{i})s, %(updated_at_{i})s, false, %(superseded_by_{i})s, %(dedupe_key_{i})s, %(restored_at)s)"
)
# The archive rows of one user by id: never another user's row with the same id; one statement per user,
# so that each routes to its user's shard on distributed Postgres.
DELETE_ARCHIVES_SQL = """
    DELETE FROM archived_memories a WHERE a.user_id = %(user_id)s AND a.id = ANY(%(ids)s)"""
# The rule for a restored memory's backup: kept, and recorded by the audit event of the restore or
# re-promotion that kept it (details.storage_ref, written by restore_many_rows_plan) until forget, which
# deletes the object, redacts the event. Of the object refs given (%s: backup_objects.ref's form), those
# so recorded; the index memory_events_kept_backups (sql/025) serves it. The refs name objects, not
# users: like every lookup from the bucket's keys to rows, it cannot filter by user_id.
KEPT_BACKUPS_SQL = """
    SELECT DISTINCT backup_object_ref(e.details ->> 'storage_ref') AS ref FROM memory_events e
    WHERE e.event_type IN ('restored', 'promoted') AND NOT e.details ? 'redacted'
      AND backup_object_ref(e.details ->> 'storage_ref') = ANY(%s)"""
ACCESS_HOT_SQL = """
    UPDATE memories SET access_count = access_count + 1,
           last_accessed_at = greatest(coalesce(last_accessed_at, %(now)s), %(now)s)
    WHERE user_id = %(user_id)s AND id = ANY(%(ids)s)"""
ACCESS_ARCHIVED_SQL = """
    UPDATE archived_memories SET access_count = access_count + 1,
           last_accessed_at = greatest(coalesce(last_accessed_at, %(now)s), %(now)s)
    WHERE user_id = %(user_id)s AND (id = ANY(%(ids)s) OR original_id = ANY(%(ids)s))"""


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class _Read:
    """What a move reads before it locks (memory_lib.core.locks): the archive row as it was, its
    verified backup, the active space then, and the text re-embedded into that space when the
    backup's vector is of another (None otherwise)."""

    arch: Row
    doc: BackupObject
    shape: Row
    vector: np.ndarray | None

    def unchanged(self, arch: Row, shape: Row) -> bool:
        """True when the locked row and space are the ones read: the same backup of the same row."""
        return shape == self.shape and all(arch[k] == self.arch[k] for k in _READ_KEYS)


# What a read depends on: the row, its backup, its model (whether the text is re-embedded).
_READ_KEYS = ("id", "original_id", "user_id", "storage_ref", "backup_sha256", "original_embedding_model")
# How many times a move reads again when its row changed between the read and the lock.
_READ_ATTEMPTS = 5


def _shape_plan() -> Plan[Row]:
    return (yield Sql(SHAPE_SQL, {}, "one"))


def _reembeds(arch: Row, doc: BackupObject, shape: Row) -> bool:
    """A backup whose vector is not of the active space (archived before a re-embedding flip)."""
    if shape["model"] is None:
        return False
    return arch["original_embedding_model"] != shape["model"] or doc.embedding_array().size != int(
        shape["dim"]
    )


def _read_flow(arch: Row, query: str, params: dict[str, Any]) -> Flow[_Read | None]:
    """The backup of an archive row, read with no transaction open: its sha256 checked, its identity
    matching the row, and every field restorable (models.BackupObject; the embedding of the store's
    dimension), its text re-embedded when its space is not the active one. A document that fails raises
    MalformedBackupError on expand as on restore, before anything is written. None: the read failed
    because the row changed meanwhile (`query` finds it no longer as it was: a concurrent restore and
    re-archival may have replaced the object); the caller reads the row again."""
    try:
        data = yield GetVerified(arch["storage_ref"], arch["backup_sha256"])
    except MemoryArchiveError:
        current = yield RunPlan(_archive_plan(query, params))
        if current is not None and all(current[k] == arch[k] for k in _READ_KEYS):
            raise
        return None
    shape = yield RunPlan(_shape_plan())
    doc = verified_backup(arch, data, shape)
    vector = None
    if _reembeds(arch, doc, shape):
        vector = yield EmbedText(doc.content, shape["model"], int(shape["dim"]))
    return _Read(arch, doc, shape, vector)


def _changed_too_often(what: str) -> MemoryArchiveError:
    return MemoryArchiveError(f"{what}: the archive row changed between each read and its lock; retry")


def verified_backup(arch: Row, data: bytes, shape: Row) -> BackupObject:
    """The backup document of archive row `arch` from `data` (bytes already checked against the row's
    sha256), checked as _read_flow says; `shape` is SHAPE_SQL's row. Writes nothing."""
    doc = BackupObject.from_json_bytes(data)
    # A backup of the active model must hold a vector of its dimension; one of another model (archived
    # before a re-embedding flip) is re-embedded when restored (restore_rows_plan).
    if shape["dim"] is not None and shape["model"] in (None, arch["original_embedding_model"]):
        doc.check_dimension(int(shape["dim"]))
    if doc.original_id != arch["original_id"] or doc.user_id != arch["user_id"]:
        raise IntegrityError(
            f"backup {arch['storage_ref']}",
            f"original_id={arch['original_id']} user_id={arch['user_id']}",
            f"original_id={doc.original_id} user_id={doc.user_id}",
        )
    return doc


def restore_rows_plan(
    arch: Row,
    doc: BackupObject,
    *,
    event_type: Literal["restored", "promoted"],
    actor: str,
    now: datetime,
    details: dict[str, Any] | None = None,
    vector: np.ndarray | None = None,
) -> Plan[None]:
    """Move a locked archive row back to `memories` from its verified backup (archive.restore_archive's
    statements, inside the caller's transaction): restore_many_rows_plan of one."""
    yield from restore_many_rows_plan(
        [(arch, doc)],
        event_type=event_type,
        actor=actor,
        now=now,
        details=details,
        vectors=None if vector is None else {doc.original_id: vector},
    )


def restore_many_rows_plan(
    items: Sequence[tuple[Row, BackupObject]],
    *,
    event_type: Literal["restored", "promoted"],
    actor: str,
    now: datetime,
    details: dict[str, Any] | None = None,
    vectors: Mapping[uuid.UUID, np.ndarray] | None = None,
) -> Plan[None]:
    """Move locked archive rows back to `memories` from their verified backups, inside the caller's
    transaction, in three statements whatever their number: one multi-row INSERT of the hot rows, a
    DELETE of the archive rows per user (one for a group of one user), one multi-row INSERT of the audit events (the
    statement-level triggers on both tables fire once for all of them). Every row keeps its own
    user_id: each hot row and event is its backup's, each deleted archive row the exact (user_id, id)
    locked. The DELETE must remove every row given (they are locked), else IntegrityError and the
    caller's transaction rolls back: a memory is never in both tiers. Any failure fails them all; a
    caller that wants one memory's failure to spare the others retries them one by one (restore.py).

    Every path back to hot (restore of one, many or all, re-promotion by expansion or by the nightly
    sweep) comes through here, so every one follows the same two rules: the row's columns are the
    archived ones exactly, and `restored_at` is `now` (a restore is a use and a new start: the archival
    criteria count from it, memory_lib.lifecycle.eligibility). The backup object is kept, recorded by the
    audit event written here (details.storage_ref and sha256): the orphan sweep and forget follow that
    record (memory_lib.archival.integrity.orphaned_backups, memory_lib.lifecycle.forget).

    A backup whose vector is of another embedding space than the active one (archived before a
    re-embedding flip) comes back with its text re-embedded: `vectors[original_id]`, embedded by the
    caller before it locked, or else by the runner's embedder here (EmbedText: the bulk restore's stated
    exception, memory_lib.core.locks); the backup object stays as it is."""
    if not items:
        return
    shape = yield Sql(SHAPE_SQL, {}, "one")
    params: dict[str, Any] = {"restored_at": now}
    rows: list[str] = []
    for i, (arch, doc) in enumerate(items):
        embedding, model = doc.embedding_array(), arch["original_embedding_model"]
        if _reembeds(arch, doc, shape):
            given = None if vectors is None else vectors.get(doc.original_id)
            embedding = (
                given
                if given is not None
                else (yield EmbedText(doc.content, shape["model"], int(shape["dim"])))
            )
            model = shape["model"]
        values = {
            "id": doc.original_id,
            "user_id": doc.user_id,
            "content": doc.content,
            "content_sha256": sha256_hex(doc.content),
            "embedding": embedding,
            "embedding_model": model,
            "embedding_dim": int(embedding.size),
            "entity_links": doc.entity_links,
            "metadata": Jsonb(doc.metadata),
            "domain": arch["original_domain"],
            "category": arch["original_category"],
            "importance_score": doc.importance_score,
            "access_count": arch["access_count"],
            "last_accessed_at": arch["last_accessed_at"],
            "created_at": doc.created_at,
            "updated_at": arch["original_updated_at"],
            "superseded_by": arch["original_superseded_by"],
            "dedupe_key": arch["original_dedupe_key"],
        }
        params.update({f"{k}_{i}": v for k, v in values.items()})
        rows.append(_RESTORE_ROW.format(i=i))
    yield Sql(RESTORE_INSERT_SQL + ",\n".join(rows), params, "rowcount")
    by_user: dict[str, list[uuid.UUID]] = {}
    for arch, _ in items:
        by_user.setdefault(arch["user_id"], []).append(arch["id"])
    deleted = 0
    for user, ids in sorted(by_user.items()):
        deleted += yield Sql(DELETE_ARCHIVES_SQL, {"user_id": user, "ids": ids}, "rowcount")
    if deleted != len(items):
        raise IntegrityError("archive rows deleted on restore", str(len(items)), str(deleted))
    recorded = [
        (
            doc.original_id,
            doc.user_id,
            {
                "archive_id": str(arch["id"]),
                "storage_ref": arch["storage_ref"],
                "sha256": arch["backup_sha256"],
            }
            | (details or {}),
        )
        for arch, doc in items
    ]
    yield events(event_type, recorded, actor=actor, now=now)


def _expansions_in_window(arch: Row, config: PromotionConfig, now: datetime) -> Sql:
    return Sql(
        EXPANSIONS_IN_WINDOW_SQL,
        {
            "memory_id": arch["original_id"],
            "user_id": arch["user_id"],
            "archive_id": str(arch["id"]),
            "since": now - timedelta(days=config.window_days),
            "now": now,
        },
        "one",
    )


def _archive_plan(query: str, params: dict[str, Any]) -> Plan[Row | None]:
    """An archive row as it is now, unlocked: what a move reads its backup for."""
    return (yield Sql(query, params, "one"))


def expand_flow(
    user_id: str, archive_id: uuid.UUID, *, config: PromotionConfig, actor: str, now: datetime
) -> Flow[Expansion]:
    """Expand an archived memory (module docstring). Its backup is read and verified, and re-embedded
    when a re-promotion needs it, before the transaction that locks and writes (memory_lib.core.locks);
    that transaction re-reads the row and starts over when it changed meanwhile."""
    user_id = validation.user(user_id)
    archive_id = validation.uuid_value("archive_id", archive_id)
    now = validation.timestamp("now", now)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    params = {"user_id": user_id, "archive_id": archive_id}
    for _ in range(_READ_ATTEMPTS):
        arch = yield RunPlan(_archive_plan(ARCHIVE_SQL, params))
        read = None if arch is None else (yield from _read_flow(arch, ARCHIVE_SQL, params))
        if arch is not None and read is None:
            continue
        expansion = yield RunPlan(_expand_locked_plan(user_id, archive_id, read, config, actor, now))
        if expansion is not None:
            return expansion
    raise _changed_too_often(f"expand archive_id={archive_id}")


def _expand_locked_plan(
    user_id: str,
    archive_id: uuid.UUID,
    read: _Read | None,
    config: PromotionConfig,
    actor: str,
    now: datetime,
) -> Plan[Expansion | None]:
    """expand_flow's transaction; None when the row is not the one read (read again)."""
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")  # memory_lib.core.locks: before the row lock
    arch = yield Sql(LOCK_ARCHIVE_SQL, {"user_id": user_id, "archive_id": archive_id}, "one")
    if arch is None:
        # Already promoted (an agent may hold a hit from before): the hot memory is the original.
        hot = yield Sql(PROMOTED_FROM_SQL, {"user_id": user_id, "archive_id": str(archive_id)}, "one")
        raise NotFoundError(
            f"no archived memory id={archive_id} for user_id={user_id!r}"
            + (f": it was promoted back to hot memory id={hot['id']}" if hot else "")
        )
    if read is None or not read.unchanged(arch, (yield Sql(SHAPE_SQL, {}, "one"))):
        return None
    doc = read.doc
    yield event(
        arch["original_id"],
        user_id,
        EventType.EXPANDED,
        actor,
        now,
        {"archive_id": str(arch["id"]), "storage_ref": arch["storage_ref"]},
    )
    yield Sql(BUMP_EXPANSION_SQL, {"user_id": user_id, "archive_id": arch["id"], "now": now}, "rowcount")
    count = int((yield _expansions_in_window(arch, config, now))["n"])
    promoted = count >= config.expansions_to_promote
    if promoted:
        yield from restore_rows_plan(
            arch,
            doc,
            event_type="promoted",
            actor=actor,
            now=now,
            details={"expansions": count, "window_days": config.window_days, "trigger": "expand"},
            vector=read.vector,
        )
    return Expansion(
        user_id, arch["original_id"], arch["id"], doc.content, doc, arch["storage_ref"], count, promoted
    )


def promote_flow(
    user_id: str, archive_id: uuid.UUID, *, config: PromotionConfig, actor: str, now: datetime
) -> Flow[bool]:
    """Promote one archive row if the rule holds at `now` (re-checked under the row lock); its backup
    read first, as in expand_flow."""
    params = {"user_id": user_id, "archive_id": archive_id}
    for _ in range(_READ_ATTEMPTS):
        arch = yield RunPlan(_archive_plan(ARCHIVE_SQL, params))
        if arch is None:
            return False  # promoted or restored meanwhile
        read = yield from _read_flow(arch, ARCHIVE_SQL, params)
        if read is None:
            continue
        promoted = yield RunPlan(_promote_locked_plan(read, config, actor, now))
        if promoted is not None:
            return bool(promoted)
    raise _changed_too_often(f"promote archive_id={archive_id}")


def _promote_locked_plan(
    read: _Read, config: PromotionConfig, actor: str, now: datetime
) -> Plan[bool | None]:
    user_id, archive_id = read.arch["user_id"], read.arch["id"]
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")  # memory_lib.core.locks: before the row lock
    arch = yield Sql(LOCK_ARCHIVE_SQL, {"user_id": user_id, "archive_id": archive_id}, "one")
    if arch is None:
        return False  # promoted or restored meanwhile
    count = int((yield _expansions_in_window(arch, config, now))["n"])
    if count < config.expansions_to_promote:
        return False
    if not read.unchanged(arch, (yield Sql(SHAPE_SQL, {}, "one"))):
        return None
    yield from restore_rows_plan(
        arch,
        read.doc,
        event_type="promoted",
        actor=actor,
        now=now,
        details={"expansions": count, "window_days": config.window_days, "trigger": "sweep"},
        vector=read.vector,
    )
    return True


def restore_flow(
    user_id: str,
    *,
    archive_id: uuid.UUID | None = None,
    original_id: uuid.UUID | None = None,
    actor: str,
    now: datetime,
) -> Flow[RestoreOutcome]:
    """Bring one archived memory back on request (event 'restored'); already hot is a no-op. Its backup
    is read first, as in expand_flow."""
    user_id = validation.user(user_id)
    now = validation.timestamp("now", now)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    if (archive_id is None) == (original_id is None):
        raise InvalidInputError("archive_id/original_id", (archive_id, original_id), "give exactly one")
    if archive_id is not None:
        archive_id = validation.uuid_value("archive_id", archive_id)
        query, params = ARCHIVE_SQL, {"user_id": user_id, "archive_id": archive_id}
    else:
        original_id = validation.uuid_value("original_id", original_id)
        query, params = ARCHIVE_BY_ORIGINAL_SQL, {"user_id": user_id, "original_id": original_id}
    for _ in range(_READ_ATTEMPTS):
        arch = yield RunPlan(_archive_plan(query, params))
        read = None if arch is None else (yield from _read_flow(arch, query, params))
        if arch is not None and read is None:
            continue
        plan = _restore_locked_plan(user_id, archive_id, original_id, read, actor, now)
        outcome = yield RunPlan(plan)
        if outcome is not None:
            return outcome
    raise _changed_too_often(
        f"restore {'archive_id' if archive_id else 'original_id'}={archive_id or original_id}"
    )


def _restore_locked_plan(
    user_id: str,
    archive_id: uuid.UUID | None,
    original_id: uuid.UUID | None,
    read: _Read | None,
    actor: str,
    now: datetime,
) -> Plan[RestoreOutcome | None]:
    """restore_flow's transaction; None when the row is not the one read (read again)."""
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")  # memory_lib.core.locks: before the row lock
    if archive_id is not None:
        arch = yield Sql(LOCK_ARCHIVE_SQL, {"user_id": user_id, "archive_id": archive_id}, "one")
        if arch is None:
            hot = yield Sql(PROMOTED_FROM_SQL, {"user_id": user_id, "archive_id": str(archive_id)}, "one")
            if hot is not None:
                return RestoreOutcome(user_id, hot["id"], archive_id, False)
            other = yield Sql(IS_MEMORY_ID_SQL, {"id": archive_id, "u": user_id}, "one")
            if other is not None and other["found"]:
                raise NotFoundError(f"archive_id={archive_id}: {AN_ORIGINAL_ID} (user_id={user_id!r})")
            raise NotFoundError(f"no archived memory id={archive_id} for user_id={user_id!r}")
    else:
        assert original_id is not None  # restore_flow gives exactly one of the two
        arch = yield Sql(
            LOCK_ARCHIVE_BY_ORIGINAL_SQL, {"user_id": user_id, "original_id": original_id}, "one"
        )
        if arch is None:
            hot = yield Sql(HOT_BY_ID_SQL, {"user_id": user_id, "id": original_id}, "one")
            if hot is not None:
                return RestoreOutcome(user_id, original_id, None, False)
            other = yield Sql(ORIGINAL_OF_ARCHIVE_SQL, {"id": original_id, "u": user_id}, "one")
            if other is not None:
                raise NotFoundError(
                    f"original_id={original_id}: {AN_ARCHIVE_ID.format(other['original_id'])} (user_id={user_id!r})"
                )
            raise NotFoundError(f"no archived memory original_id={original_id} for user_id={user_id!r}")
    if read is None or not read.unchanged(arch, (yield Sql(SHAPE_SQL, {}, "one"))):
        return None
    yield from restore_rows_plan(
        arch, read.doc, event_type="restored", actor=actor, now=now, vector=read.vector
    )
    return RestoreOutcome(user_id, arch["original_id"], arch["id"], True)


def record_access_plan(user_id: str, ids: Sequence[uuid.UUID], *, now: datetime) -> Plan[int]:
    """Count a use of hot memories (by id) and archived ones (by archive id or original id). A use of
    an archived memory a live hot memory links to also counts toward re-promotion (module docstring)."""
    user_id = validation.user(user_id)
    now = validation.timestamp("now", now)
    ids = [validation.uuid_value("ids", i) for i in ids]
    if not ids:
        return 0
    params = {"user_id": user_id, "ids": ids, "now": now}
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")  # memory_lib.core.locks: before the row locks
    hot = yield Sql(ACCESS_HOT_SQL, params, "rowcount")
    archived = yield Sql(ACCESS_ARCHIVED_SQL, params, "rowcount")
    if archived:
        yield Sql(LINK_USES_SQL, params, "rowcount")
    return int(hot) + int(archived)


def _read(query: str, params: dict[str, Any]) -> Plan[list[Row]]:
    return (yield Sql(query, params))


# --------------------------------------------------------------------------- nightly sweep


@dataclass
class SweepReport:
    as_of: datetime
    due: int = 0
    promoted: list[uuid.UUID] = field(default_factory=list)  # archive ids promoted
    skipped: int = 0  # no longer due when locked (promoted or restored meanwhile)
    failed: dict[uuid.UUID, str] = field(default_factory=dict)  # archive id -> error


def sweep_promotions(
    conn: Conn,
    object_store: ObjectStore,
    config: PromotionConfig,
    *,
    as_of: datetime,
    actor: str,
    limit: int = 10_000,
    embedder: Embedder | None = None,
) -> SweepReport:
    """Promote every archived memory expanded `expansions_to_promote` times within the window ending
    at `as_of`. One transaction per promotion; a failure is reported and the sweep goes on. `embedder`
    (the active space's) re-embeds a backup from before a re-embedding flip; without it such a promotion
    fails, reported, and is retried by the next sweep."""
    as_of = validation.timestamp("as_of", as_of)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    max_rows = validation.row_limit("limit", limit, maximum=1_000_000)  # None: no limit (LIMIT NULL)
    report = SweepReport(as_of)
    params = {
        "since": as_of - timedelta(days=config.window_days),
        "now": as_of,
        "needed": config.expansions_to_promote,
        "limit": max_rows,
    }
    due = run_plan(conn, _read(DUE_FOR_PROMOTION_SQL, params))
    report.due = len(due)
    for row in due:
        archive_id = row["archive_id"]
        try:
            flow = promote_flow(row["user_id"], archive_id, config=config, actor=actor, now=as_of)
            if drive(conn, flow, object_store=object_store, embedder=embedder):
                report.promoted.append(archive_id)
            else:
                report.skipped += 1
        except MemoryArchiveError as exc:  # integrity or storage: keep it archived, report it
            report.failed[archive_id] = f"{type(exc).__name__}: {exc}"
            log.error("promotion of archive %s failed: %s", archive_id, exc)
    return report
