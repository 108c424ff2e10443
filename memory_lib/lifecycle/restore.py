"""Restore: archived memories back to the hot tier, exactly as they were — one, a user's, or all.

One memory (restore_archive, the client) is restored in its own transaction after its backup is
verified against the recorded sha256; the statements are promotion.restore_flow's, shared with
re-promotion and the async client. Many (restore_archives) go by groups: each group's backups verified
one by one, then its verified members moved in three multi-row statements (promotion.restore_many_rows_plan,
the same code); a group whose statements fail is retried one memory at a time.

Every restore follows the same two rules (promotion.restore_many_rows_plan): the memory stays hot until
the archival criteria, counted from the restore, select it again (a restore is a use and a new start:
memories.restored_at, memory_lib.lifecycle.eligibility); and its backup object is kept, recorded by the
'restored' audit event, so the orphan sweep does not count it and forget deletes it.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from ..core import validation
from ..core.errors import InvalidInputError, MemoryArchiveError, NotFoundError
from ..core.locks import USER_LOCK_SQL
from ..core.plans import Plan, Sql, drive, run_plan
from ..core.rows import Conn, Row
from ..llm.embedding import Embedder
from ..storage import packs
from ..storage.objectstore import ObjectStore
from ..storage.space import SHAPE_SQL
from .pause import set_pause
from .promotion import (
    AN_ARCHIVE_ID,
    AN_ORIGINAL_ID,
    IS_MEMORY_ID_SQL,
    JOINED_FROM,
    JOINED_ROW,
    ORIGINAL_OF_ARCHIVE_SQL,
    restore_flow,
    restore_many_rows_plan,
    verified_backup,
)


@dataclass(frozen=True)
class RestoreResult:
    original_id: uuid.UUID
    user_id: str
    restored: bool  # False when it was already hot (idempotent re-run)


def restore_archive(
    conn: Conn,
    object_store: ObjectStore,
    *,
    user_id: str,
    original_id: uuid.UUID | None = None,
    archive_id: uuid.UUID | None = None,
    actor: str,
    now: datetime | None = None,
    embedder: Embedder | None = None,
) -> RestoreResult:
    """Bring one archived memory back to `memories` exactly as it was, in one transaction.

    The backup is verified against the sha256 recorded at archival before anything is written.
    Restoring a memory that is already hot is a no-op. Every archived column comes back as it was;
    `restored_at` is `now`, so the memory stays hot until the archival criteria, counted from `now`,
    select it again. The backup object is kept: it is the record of what was archived, recorded as
    such by the 'restored' event (the orphan sweep skips it, forget deletes it). A backup whose vector
    is of another embedding space than the active one (archived before a re-embedding flip) needs
    `embedder`, the active space's: the text is re-embedded, the backup left as it is. (The statements
    are promotion.restore_flow's, shared with re-promotion and the async client.)
    """
    flow = restore_flow(
        user_id, archive_id=archive_id, original_id=original_id, actor=actor, now=now or datetime.now(UTC)
    )
    outcome = drive(conn, flow, object_store=object_store, embedder=embedder)
    return RestoreResult(outcome.memory_id, outcome.user_id, outcome.restored)


def archived_ids(
    conn: Conn, *, user_id: str | None = None, limit: int | None = None
) -> list[tuple[str, uuid.UUID]]:
    """(user_id, original_id) of archived memories, oldest archive first. `limit`: an integer >= 0 (None: all)."""
    user_id = None if user_id is None else validation.user(user_id)
    limit = validation.row_limit("limit", limit, maximum=2**63 - 1)
    rows = conn.execute(
        """SELECT user_id, original_id FROM archived_memories
           WHERE (%(u)s::text IS NULL OR user_id = %(u)s) ORDER BY archived_at, original_id LIMIT %(n)s""",
        {"u": user_id, "n": limit},
    ).fetchall()
    return [(r["user_id"], r["original_id"]) for r in rows]


@dataclass
class RestoreReport:
    requested: int = 0
    restored: int = 0
    already_hot: int = 0
    not_found: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    paused_archival: bool = False  # this restore paused archival before it started


class _Prefetch:
    """The backups of the next memories to restore, read in a bounded thread pool while the earlier
    ones are restored (one transaction each, as before).

    A read is served only for the ref and sha256 the restore plan asks for, each checked against its
    sha256 (a pack is read once for all of its members in the chunk: memory_lib.storage.packs): nothing
    unverified is restored. A failed read raises in its memory's restore, as a direct read would.
    Anything else goes to the store itself.
    """

    def __init__(self, store: ObjectStore, workers: int):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="restore-read")
        self._reads: dict[tuple[str, str], tuple[Future[list[bytes | BaseException]], int]] = {}
        self._of: dict[uuid.UUID, tuple[str, str]] = {}  # original_id -> the read loaded for it

    def load(self, rows: Iterable[Row]) -> None:
        by_key: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            wanted = (r["storage_ref"], r["backup_sha256"])
            self._of[r["original_id"]] = wanted
            if wanted not in self._reads:
                by_key.setdefault(self.store.key_from_ref(r["storage_ref"]), []).append(wanted)
        for group in by_key.values():
            group = list(dict.fromkeys(group))
            future = self._pool.submit(packs.read_members, self.store, group, workers=1)
            for i, wanted in enumerate(group):
                self._reads[wanted] = (future, i)

    def settle(self, original_ids: Iterable[uuid.UUID]) -> None:
        """Wait until the reads loaded for these memories are done (they stay to be served): a group
        takes its locks only then (memory_lib.core.locks)."""
        futures = [
            found[0]
            for oid in original_ids
            if (wanted := self._of.pop(oid, None)) is not None and (found := self._reads.get(wanted))
        ]
        wait(futures)

    def read_ref(self, ref: str, sha256: str) -> bytes:
        found = self._reads.pop((ref, sha256), None)
        if found is None:
            return self.store.read_ref(ref, sha256)
        got = found[0].result()[found[1]]
        if isinstance(got, BaseException):
            raise got
        return got

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._reads.clear()
        self._of.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def restore_archives(
    conn: Conn,
    store: ObjectStore,
    *,
    actor: str,
    all_archives: bool = False,
    user_id: str | None = None,
    original_ids: Sequence[uuid.UUID | str] | None = None,
    chunk_size: int = 500,
    progress: Callable[[RestoreReport], None] | None = None,
    pause_archival: bool | None = None,
    read_workers: int = 8,
    embedder: Embedder | None = None,
    commit_every: int = 50,
) -> RestoreReport:
    """Restore archived memories to `memories`: all, one user's, or the listed original ids.

    Every memory restored stays hot until the archival criteria, counted from its restore, select it
    again (restore_archive), paused or not. Restoring everything also pauses archival first (unless
    `pause_archival=False`): the nights then archive nothing at all, the memories never archived
    included, until the pause is cleared when the rollback is done.

    The memories go by groups of at most `commit_every` memories of one user, one transaction per
    group (a group never spans a chunk or a user: cross-user work goes per user, so on distributed
    Postgres no statement locks rows on several shards). In a group, the user's write lock is taken
    and the archive rows locked in id order (memory_lib.core.locks); each backup is verified against its row's recorded sha256 like
    restore_archive's, and a memory whose backup fails is reported and left archived; the verified
    ones are moved together by three multi-row statements (promotion.restore_many_rows_plan: one
    trigger firing and one round trip per statement for the group instead of per memory). When
    those statements fail, the group's savepoint is rolled back and each of its memories is retried
    alone in its own savepoint (restore_archive): one memory's failure never loses or blocks the
    others, and is reported under its original_id. A crash loses only the open group's work, which
    stays archived. A memory already hot is counted, not touched. Interrupted, a re-run restores
    what is still archived: idempotent and resumable. The backups of each chunk are read ahead by
    `read_workers` threads (at most `chunk_size` objects held at once). `embedder`: the active
    space's, for backups archived before a re-embedding flip (restore_archive).
    """
    if isinstance(commit_every, bool) or not isinstance(commit_every, int) or commit_every < 1:
        raise InvalidInputError("commit_every", commit_every, "must be a positive integer")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidInputError("chunk_size", chunk_size, "must be a positive integer")
    # Checked once here: a group writes it into its audit events without restore_flow's check.
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    prefetch = _Prefetch(store, read_workers)
    try:
        return _restore_archives(
            conn,
            prefetch,
            actor=actor,
            all_archives=all_archives,
            user_id=user_id,
            original_ids=original_ids,
            chunk_size=chunk_size,
            progress=progress,
            pause_archival=pause_archival,
            embedder=embedder,
            commit_every=commit_every,
        )
    finally:
        prefetch.close()


# A group's locks and rows (_lock_group_plan): a group is one user's (restore_archives), so each statement
# is filtered by its user and, on distributed Postgres, routes to that user's shard (no row locks across
# shards). The user's write lock (core.locks), then the rows: a row of another user with the same
# original_id is not read.
LOCK_GROUP_SQL = f"""
    SELECT {JOINED_ROW} FROM {JOINED_FROM}
    WHERE a.user_id = %(user_id)s AND a.original_id = ANY(%(ids)s)
    ORDER BY a.id FOR UPDATE OF a"""
HOT_GROUP_SQL = "SELECT m.user_id, m.id FROM memories m WHERE m.user_id = %(user_id)s AND m.id = ANY(%(ids)s)"


# Archive rows with their backups, for the unlocked reads that choose what to restore.
_ROWS = f"SELECT {JOINED_ROW} FROM {JOINED_FROM}"


def _user_groups(
    members: Sequence[tuple[str, uuid.UUID]], size: int
) -> Iterator[list[tuple[str, uuid.UUID]]]:
    """`members` (sorted by user) cut into groups of at most `size` members of one user each."""
    for _, same in itertools.groupby(members, key=lambda m: m[0]):
        mine = list(same)
        for i in range(0, len(mine), size):
            yield mine[i : i + size]


@dataclass
class _Locked:
    archived: dict[tuple[str, uuid.UUID], Row]  # (user_id, original_id) -> its locked archive row
    hot: set[tuple[str, uuid.UUID]]  # members not archived but hot: already restored
    shape: Row


def _lock_group_plan(members: Sequence[tuple[str, uuid.UUID]]) -> Plan[_Locked]:
    """Lock a group (members of one user): the user's write lock, then its archive rows in id order
    (memory_lib.core.locks); read which of the others are hot."""
    users = {u for u, _ in members}
    if len(users) != 1:
        raise InvalidInputError("group", sorted(users), "a restore group holds the memories of one user")
    user_id = users.pop()
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")
    pairs = {"user_id": user_id, "ids": [o for _, o in members]}
    rows = yield Sql(LOCK_GROUP_SQL, pairs, "all")
    archived = {(r["user_id"], r["original_id"]): r for r in rows}
    hot: set[tuple[str, uuid.UUID]] = set()
    if len(archived) < len(members):
        hot = {(r["user_id"], r["id"]) for r in (yield Sql(HOT_GROUP_SQL, pairs, "all"))}
    shape = yield Sql(SHAPE_SQL, {}, "one")
    return _Locked(archived, hot, shape)


def _restore_group(
    conn: Conn,
    store: _Prefetch,
    members: list[tuple[str, uuid.UUID]],
    *,
    actor: str,
    embedder: Embedder | None,
    report: RestoreReport,
) -> None:
    """Restore a group in the open transaction (restore_archives). Its outcome is counted only once
    its statements succeeded; when they fail, each member is restored alone instead."""
    counts: dict[str, int] = {"restored": 0, "already_hot": 0, "not_found": 0, "failed": 0}
    notes: list[str] = []
    try:
        with conn.transaction():  # a savepoint: a failure below leaves the group's memories archived
            locked = run_plan(conn, _lock_group_plan(members))
            items = []
            for uid, oid in members:
                arch = locked.archived.get((uid, oid))
                if arch is None:
                    if (uid, oid) in locked.hot:
                        counts["already_hot"] += 1
                    else:
                        counts["not_found"] += 1
                        notes.append(_named(oid, f"no archived memory original_id={oid} for user_id={uid!r}"))
                    continue
                try:
                    data = store.read_ref(arch["storage_ref"], arch["backup_sha256"])
                    items.append((arch, verified_backup(arch, data, locked.shape)))
                except MemoryArchiveError as exc:  # this backup only: reported, the memory stays archived
                    counts["failed"] += 1
                    notes.append(_named(oid, f"{type(exc).__name__}: {exc}"))
            run_plan(
                conn,
                restore_many_rows_plan(items, event_type="restored", actor=actor, now=datetime.now(UTC)),
                embedder=embedder,
            )
            counts["restored"] = len(items)
    except (MemoryArchiveError, psycopg.Error):
        # Which member failed is not known: each alone, in its own savepoint, reports its own error.
        for uid, oid in members:
            _restore_one(conn, store, uid, oid, actor=actor, embedder=embedder, report=report)
        return
    report.requested += len(members)
    for name, n in counts.items():
        setattr(report, name, getattr(report, name) + n)
    for note in notes:
        _note(report, note)


def _restore_one(
    conn: Conn,
    store: _Prefetch,
    uid: str,
    oid: uuid.UUID,
    *,
    actor: str,
    embedder: Embedder | None,
    report: RestoreReport,
) -> None:
    report.requested += 1
    try:
        result = restore_archive(conn, store, user_id=uid, original_id=oid, actor=actor, embedder=embedder)
    except NotFoundError as exc:
        report.not_found += 1
        _note(report, _named(oid, str(exc)))
    except (MemoryArchiveError, psycopg.Error) as exc:
        report.failed += 1
        _note(report, _named(oid, f"{type(exc).__name__}: {exc}"))
    else:
        if result.restored:
            report.restored += 1
        else:
            report.already_hot += 1


def _restore_archives(
    conn: Conn,
    store: _Prefetch,
    *,
    actor: str,
    all_archives: bool,
    user_id: str | None,
    original_ids: Sequence[uuid.UUID | str] | None,
    chunk_size: int,
    progress: Callable[[RestoreReport], None] | None,
    pause_archival: bool | None,
    embedder: Embedder | None,
    commit_every: int,
) -> RestoreReport:
    ids = _check_selection(all_archives, user_id, original_ids)
    report = RestoreReport()
    if all_archives if pause_archival is None else pause_archival:
        set_pause(
            conn,
            reason="bulk restore (rollback) in progress: archival waits until the pause is cleared",
            actor=actor,
            details={"restore": "all" if all_archives else "selection"},
        )
        report.paused_archival = True
    started = time.monotonic()

    def restore(members: list[tuple[str, uuid.UUID]]) -> None:
        """A chunk's members, in user order, by groups of at most `commit_every` of one user: one
        transaction each, under its user's write lock (memory_lib.core.locks), whose statements stay
        on that user's rows (one shard on distributed Postgres). An exception that escapes rolls the
        open group back: its memories stay archived."""
        for group in _user_groups(members, commit_every):
            store.settle(oid for _, oid in group)  # its backups read before it locks (core/locks.py)
            with conn.transaction():
                _restore_group(conn, store, group, actor=actor, embedder=embedder, report=report)

    if ids is not None:
        archives = {
            r["original_id"]: r
            for r in conn.execute(
                f"""SELECT a.original_id, a.user_id, a.storage_ref, a.backup_sha256
                    FROM ({_ROWS}) a
                    WHERE a.original_id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR a.user_id = %(u)s)""",
                {"ids": ids, "u": user_id},
            ).fetchall()
        }
        owners = {oid: r["user_id"] for oid, r in archives.items()}
        hot = {
            r["id"]: r["user_id"]
            for r in conn.execute(
                """SELECT id, user_id FROM memories
                   WHERE id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR user_id = %(u)s)""",
                {"ids": ids, "u": user_id},
            ).fetchall()
        }
        ids = sorted(ids, key=lambda o: (owners.get(o) or hot.get(o) or "", o))
        for start in range(0, len(ids), chunk_size):
            chunk = ids[start : start + chunk_size]
            store.load(archives[o] for o in chunk if o in archives)
            members: list[tuple[str, uuid.UUID]] = []
            for oid in chunk:
                owner = owners.get(oid) or hot.get(oid)
                if owner is None:
                    report.requested += 1
                    report.not_found += 1
                    _note(report, _not_found(conn, oid, user_id))
                else:
                    members.append((owner, oid))
            restore(members)  # committed: what progress reports is durable
            if progress and len(chunk) == chunk_size:
                progress(report)
    else:
        cursor: tuple[datetime, uuid.UUID] | None = None
        while True:
            page = conn.execute(
                f"""SELECT a.user_id, a.original_id, a.archived_at, a.storage_ref, a.backup_sha256
                    FROM ({_ROWS}) a
                    WHERE (%(u)s::text IS NULL OR a.user_id = %(u)s)
                      AND (%(c_at)s::timestamptz IS NULL OR (a.archived_at, a.original_id) > (%(c_at)s, %(c_id)s))
                    ORDER BY a.archived_at, a.original_id LIMIT %(n)s""",
                {
                    "u": user_id,
                    "c_at": cursor[0] if cursor else None,
                    "c_id": cursor[1] if cursor else None,
                    "n": chunk_size,
                },
            ).fetchall()
            if not page:
                break
            store.load(page)
            restore(sorted((r["user_id"], r["original_id"]) for r in page))
            cursor = (page[-1]["archived_at"], page[-1]["original_id"])
            if progress:
                progress(report)
    report.seconds = time.monotonic() - started
    return report


def _check_selection(
    all_archives: bool, user_id: str | None, original_ids: Sequence[uuid.UUID | str] | None
) -> list[uuid.UUID] | None:
    if user_id is not None and (not isinstance(user_id, str) or not user_id.strip()):
        raise InvalidInputError("user_id", user_id, "must be a non-empty string")
    if all_archives and (user_id is not None or original_ids):
        raise InvalidInputError(
            "all", all_archives, "restore all, or select by user_id/original_ids, not both"
        )
    if not all_archives and user_id is None and not original_ids:
        raise InvalidInputError("selection", None, "choose all=true, a user_id, or a list of original_ids")
    if not original_ids:
        return None
    ids: list[uuid.UUID] = []
    for i, value in enumerate(original_ids):
        try:
            ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise InvalidInputError(f"original_ids[{i}]", value, "is not a UUID") from None
    return list(dict.fromkeys(ids))


ARCHIVES_BY_ID_SQL = """
    SELECT id, original_id FROM archived_memories
    WHERE id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR user_id = %(u)s)"""


def _for_user(user_id: str | None) -> str:
    return f" for user_id={user_id!r}" if user_id else ""


def _not_found(conn: Conn, oid: uuid.UUID, user_id: str | None) -> str:
    """Why `oid`, given as an original_id, names no memory; an archive id is named as one, with its original."""
    row = conn.execute(ORIGINAL_OF_ARCHIVE_SQL, {"id": oid, "u": user_id}).fetchone()
    if row is not None:
        return _named(oid, AN_ARCHIVE_ID.format(row["original_id"]))
    return _named(oid, "no archived or hot memory" + _for_user(user_id))


def originals_of_archives(
    conn: Conn, archive_ids: Sequence[uuid.UUID | str], *, user_id: str | None = None
) -> tuple[list[uuid.UUID], list[str]]:
    """The original_ids of archived memories given by archive id (archived_memories.id, what search and
    expand return), for restore_archives(original_ids=...); and a report line for each archive id that
    names no archived memory (of `user_id` when given), saying what it is instead."""
    ids = list(
        dict.fromkeys(validation.uuid_value(f"archive_ids[{i}]", a) for i, a in enumerate(archive_ids))
    )
    user = None if user_id is None else validation.user(user_id)
    found = {r["id"]: r["original_id"] for r in conn.execute(ARCHIVES_BY_ID_SQL, {"ids": ids, "u": user})}
    unknown: list[str] = []
    for aid in ids:
        if aid in found:
            continue
        is_memory = conn.execute(IS_MEMORY_ID_SQL, {"id": aid, "u": user}).fetchone()
        if is_memory is not None and is_memory["found"]:
            why = AN_ORIGINAL_ID
        else:
            why = (
                "no archived memory has this archive id" + _for_user(user) + " (restored, or never archived)"
            )
        unknown.append(f"archive_id={aid}: {why}")
    return [found[a] for a in ids if a in found], unknown


def _named(oid: uuid.UUID, message: str) -> str:
    """A report line names the field and the value: original_id=<uuid>."""
    name = f"original_id={oid}"
    return message if name in message else f"{name}: {message}"


def _note(report: RestoreReport, message: str) -> None:
    if len(report.errors) < 20:
        report.errors.append(message[:300])
