"""Restore: archived memories back to the hot tier, exactly as they were — one, a user's, or all.

Each memory is restored in its own transaction after its backup is verified against the recorded
sha256; the statements are promotion.restore_plan's, shared with re-promotion and the async client.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from ..core import validation
from ..core.errors import InvalidInputError, MemoryArchiveError, NotFoundError
from ..core.plans import run_plan
from ..core.rows import Conn, Row
from ..llm.embedding import Embedder
from ..storage import packs
from ..storage.objectstore import ObjectStore
from .pause import set_pause
from .promotion import restore_plan


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
    Restoring a memory that is already hot is a no-op. The backup object is kept: it is the record
    of what was archived, and the next archival overwrites it. A backup whose vector is of another
    embedding space than the active one (archived before a re-embedding flip) needs `embedder`, the
    active space's: the text is re-embedded, the backup left as it is. (The statements are
    promotion.restore_plan's, shared with re-promotion and the async client.)
    """
    plan = restore_plan(
        user_id, archive_id=archive_id, original_id=original_id, actor=actor, now=now or datetime.now(UTC)
    )
    outcome = run_plan(conn, plan, object_store=object_store, embedder=embedder)
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

    def load(self, rows: Iterable[Row]) -> None:
        by_key: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            wanted = (r["storage_ref"], r["backup_sha256"])
            if wanted not in self._reads:
                by_key.setdefault(self.store.key_from_ref(r["storage_ref"]), []).append(wanted)
        for group in by_key.values():
            group = list(dict.fromkeys(group))
            future = self._pool.submit(packs.read_members, self.store, group, workers=1)
            for i, wanted in enumerate(group):
                self._reads[wanted] = (future, i)

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

    Restoring everything pauses archival first (unless `pause_archival=False`): otherwise the next
    night would archive again what was just restored. Clear the pause when the rollback is done.

    Each memory is restored in its own savepoint after its backup is verified against the recorded
    sha256 (archive.restore_archive), and every `commit_every` of them are committed together (one
    WAL flush for the group instead of one per memory; 1.5x the restores/s in bench archival): a
    memory that fails rolls back alone, a crash loses only the open group's work, which stays
    archived. A memory already hot is counted, not touched. Interrupted, a re-run restores what is
    still archived: idempotent and resumable. The backups of each chunk are read ahead by
    `read_workers` threads (at most `chunk_size` objects held at once). `embedder`: the active
    space's, for backups archived before a re-embedding flip (restore_archive).
    """
    if isinstance(commit_every, bool) or not isinstance(commit_every, int) or commit_every < 1:
        raise InvalidInputError("commit_every", commit_every, "must be a positive integer")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidInputError("chunk_size", chunk_size, "must be a positive integer")
    prefetch = _Prefetch(store, read_workers)
    try:
        with _Group(conn, commit_every) as group:
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
                group=group,
            )
    finally:
        prefetch.close()


class _Group:
    """Restores committed together: a transaction opened before the first of a group and committed
    after its `size`-th (or at the end). Each restore inside is a savepoint (run_plan). An exception
    that escapes (not a memory's own failure) rolls the open group back: those memories stay archived."""

    def __init__(self, conn: Conn, size: int):
        self.conn, self.size, self.n = conn, size, 0
        self._tx: Any = None

    def __enter__(self) -> _Group:
        return self

    def before(self) -> None:
        if self._tx is None:
            self._tx = self.conn.transaction()
            self._tx.__enter__()

    def after(self) -> None:
        self.n += 1
        if self.n % self.size == 0:
            self.commit()

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None:
            tx.__exit__(None, None, None)

    def __exit__(self, *exc: Any) -> None:
        tx, self._tx = self._tx, None
        if tx is not None:
            tx.__exit__(*exc)


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
    group: _Group,
) -> RestoreReport:
    ids = _check_selection(all_archives, user_id, original_ids)
    report = RestoreReport()
    if all_archives if pause_archival is None else pause_archival:
        set_pause(
            conn,
            reason="bulk restore in progress: nights would re-archive what it restores",
            actor=actor,
            details={"restore": "all" if all_archives else "selection"},
        )
        report.paused_archival = True
    started = time.monotonic()

    def restore(uid: str, oid: uuid.UUID) -> None:
        report.requested += 1
        group.before()
        try:
            result = restore_archive(
                conn, store, user_id=uid, original_id=oid, actor=actor, embedder=embedder
            )
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
        group.after()  # not on an exception that escapes: the group's __exit__ rolls it back

    if ids is not None:
        archives = {
            r["original_id"]: r
            for r in conn.execute(
                """SELECT original_id, user_id, storage_ref, backup_sha256 FROM archived_memories
                   WHERE original_id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR user_id = %(u)s)""",
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
        # In user order: a group's transaction takes its users' write locks ascending (memory_lib.core.locks).
        ids = sorted(ids, key=lambda o: (owners.get(o) or hot.get(o) or "", o))
        for i, oid in enumerate(ids):
            if i % chunk_size == 0:
                store.load(archives[o] for o in ids[i : i + chunk_size] if o in archives)
            owner = owners.get(oid) or hot.get(oid)
            if owner is None:
                report.requested += 1
                report.not_found += 1
                _note(
                    report,
                    _named(
                        oid, "no archived or hot memory" + (f" for user_id={user_id!r}" if user_id else "")
                    ),
                )
            else:
                restore(owner, oid)
            if progress and (i + 1) % chunk_size == 0:
                group.commit()  # what progress reports is durable
                progress(report)
    else:
        cursor: tuple[datetime, uuid.UUID] | None = None
        while True:
            page = conn.execute(
                """SELECT user_id, original_id, archived_at, storage_ref, backup_sha256 FROM archived_memories
                   WHERE (%(u)s::text IS NULL OR user_id = %(u)s)
                     AND (%(c_at)s::timestamptz IS NULL OR (archived_at, original_id) > (%(c_at)s, %(c_id)s))
                   ORDER BY archived_at, original_id LIMIT %(n)s""",
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
            # A group never spans pages, and within a page goes in user order: its transaction takes
            # the users' write locks ascending (memory_lib.core.locks).
            for r in sorted(page, key=lambda r: (r["user_id"], r["original_id"])):
                restore(r["user_id"], r["original_id"])
            cursor = (page[-1]["archived_at"], page[-1]["original_id"])
            group.commit()
            if progress:
                progress(report)
    group.commit()
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


def _named(oid: uuid.UUID, message: str) -> str:
    """A report line names the field and the value: original_id=<uuid>."""
    name = f"original_id={oid}"
    return message if name in message else f"{name}: {message}"


def _note(report: RestoreReport, message: str) -> None:
    if len(report.errors) < 20:
        report.errors.append(message[:300])
