"""Forget (right to erasure): one memory, or every memory of a user, removed from every tier and backup.

Order, so that a run killed at any point is completed by running it again (same user, same memory):

1. A `forget_requests` row is recorded (committed) after the user's archival backups in flight have
   finished (the backup lock, memory_lib.core.locks): from then on no backup step puts anything of the
   memories it covers (`forgetting`), and whatever one put before is recorded or listed. Then its
   manifest: the memory ids it covers and the backup object keys that can hold their bytes, recorded
   by a row or not: the keys their rows name, the lone backups named by their ids, and the packs found
   by listing the user's pack folder in every version (memory_lib.storage.packs). For one memory, a
   pack there that no row records is read to see whether it holds the memory; for a whole user, every
   pack there is taken, and a pack written before owner tags that no row records is read to see whose
   it is. An unfinished request of the same scope is resumed, not doubled; a user or memory that a
   finished request forgot, with nothing of theirs written since, is `already_forgotten`.
2. Objects: every version and delete marker of each key is deleted (memory_lib.storage.object_versions), and the
   dry run's scratch copies of those memories. Status 'objects_deleted'.
3. Rows, in one transaction under the user's write lock (memory_lib.core.locks): the memories are
   deleted from every table of `erased_tables()`; their audit events are redacted through the database's
   one controlled path (`redact_memory_events`, migration 014: the append-only trigger allows nothing
   else); a 'forgotten' tombstone per memory is appended (ids, content sha256, backup sha256, actor, time;
   no content). Memories the user added since step 1 are included. Status 'rows_deleted'.
4. Objects again (a backup written by an archival run racing step 2 is caught; for a whole user, every
   pack in the user's folder is listed again), then status 'done'.

Scope of one memory: the memory and the earlier versions it superseded (they hold its older text); the
versions that superseded it stay. `delete(user, id)` on the clients is this forget of one memory.

`erased_tables()` and `retained_tables()` are the hook for new tables: a test asserts that every table
of the schema with a `user_id` column is in one of them, and `remaining()` (the Dagster check) counts
the user's rows in every such table not retained, whether listed or not.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from psycopg.types.json import Jsonb

from ..consolidation.monthly import drop_from_consolidation_plan
from ..core import validation
from ..core.errors import InvalidInputError, NotFoundError
from ..core.locks import USER_LOCK_SQL, WAIT_FOR_BACKUPS_SQL
from ..core.plans import Call, Flow, Plan, RunPlan, Snapshot, Sql, drive, drive_async, run_plan
from ..core.rows import AsyncConn, Conn, Row
from ..storage import packs
from ..storage.events import EventType, events
from ..storage.object_versions import ObjectVersion, list_folders, list_versions, purge, read_version
from ..storage.objectstore import ObjectStore

# Deleted by forget, in this order (memory_retention references memories): table -> its memory id column.
_ERASED: dict[str, str] = {
    "memory_retention": "memory_id",
    "archival_attempts": "memory_id",
    "archive_link_uses": "original_id",
    "archived_memories": "original_id",
    "memories": "id",
}
# Erased by forget after the archive rows: the user's backup objects no archive row names any more
# (all of them, for the whole user; a pack rewritten without a forgotten memory, for one).
_OBJECTS: dict[str, str] = {"backup_objects": "forget: the user's backup objects no archive row names"}
_OBJECTS_SQL = """
    DELETE FROM backup_objects o WHERE o.user_id = %(user_id)s
       AND NOT EXISTS (SELECT 1 FROM archived_memories a WHERE a.user_id = o.user_id AND a.backup_object = o.id)"""
# Kept, without content: table -> why.
_RETAINED: dict[str, str] = {
    "memory_events": "the audit log: the user's events redacted (ids and sha256 only) and a tombstone each",
    "forget_requests": "the erasure log: which user and memory ids were forgotten, when and by whom",
    "llm_usage": "the LLM cost ledger: ids, models and token counts (what was paid for), no content",
}


# Derived from memories, erased by consolidation's own forget hook (table -> how).
_CONSOLIDATED: dict[str, str] = {
    table: "memory_lib.consolidation.monthly.drop_from_consolidation_plan"
    for table in ("memory_digests", "memory_facts", "key_moments", "consolidation_builds")
}


# Aggregates of the memories' words, kept exact by sql/020's triggers as memories are deleted: a
# lexeme's count falls with each forgotten memory and its row goes at zero (table -> how).
_STATISTICS: dict[str, str] = {
    table: "term_stats_apply (sql/020: the triggers on memories and archived_memories)"
    for table in ("user_term_stats", "user_corpus_stats")
}


def erased_tables() -> dict[str, str]:
    """Every table forget deletes a user's rows from (table -> its memory id column, or the hook that
    erases it). Add new ones here."""
    return _ERASED | _OBJECTS | _CONSOLIDATED | _STATISTICS


def retained_tables() -> dict[str, str]:
    """Tables with a user_id that forget keeps, content-free (table -> reason)."""
    return dict(_RETAINED)


@dataclass(frozen=True)
class ForgetResult:
    request_id: uuid.UUID
    user_id: str
    memory_id: uuid.UUID | None  # None: the whole user
    memory_ids: tuple[uuid.UUID, ...]  # every memory (and superseded version) this call forgot
    object_versions_deleted: int
    rows_deleted: dict[str, int]
    resumed: bool = False  # an unfinished earlier request was completed
    already_forgotten: bool = False  # nothing was left to do: a finished request (request_id) covered it


# --------------------------------------------------------------------------- SQL

_OPEN_SQL = """
    SELECT * FROM forget_requests
    WHERE user_id = %(user_id)s AND memory_id IS NOT DISTINCT FROM %(memory_id)s AND status <> 'done'
    FOR UPDATE"""
_DONE_FOR_MEMORY_SQL = """
    SELECT * FROM forget_requests
    WHERE user_id = %(user_id)s AND status = 'done' AND memory_ids @> ARRAY[%(id)s::uuid]
    ORDER BY completed_at DESC LIMIT 1"""
_OPEN_COVERING_SQL = """
    SELECT memory_id FROM forget_requests
    WHERE user_id = %(user_id)s AND status <> 'done' AND memory_id IS NOT NULL
      AND (memory_id = %(id)s OR memory_ids @> ARRAY[%(id)s::uuid])
    LIMIT 1"""
# An id names a memory: its hot id or original id, or an archive row's id.
_RESOLVE_SQL = """
    SELECT id AS memory_id FROM memories WHERE user_id = %(user_id)s AND id = %(id)s
    UNION SELECT original_id FROM archived_memories WHERE user_id = %(user_id)s AND (id = %(id)s OR original_id = %(id)s)
    UNION SELECT memory_id FROM archival_attempts WHERE user_id = %(user_id)s AND memory_id = %(id)s
    LIMIT 1"""
# The memory and every earlier version it superseded, in either tier.
_CHAIN_SQL = """
    WITH RECURSIVE versions AS (
        SELECT id, superseded_by FROM memories WHERE user_id = %(user_id)s
        UNION ALL
        SELECT original_id, original_superseded_by FROM archived_memories WHERE user_id = %(user_id)s
    ), chain(id) AS (
        SELECT %(id)s::uuid
        UNION
        SELECT v.id FROM versions v JOIN chain c ON v.superseded_by = c.id
    )
    SELECT id FROM chain"""
_USER_IDS_SQL = """
    SELECT id FROM memories WHERE user_id = %(user_id)s
    UNION SELECT original_id FROM archived_memories WHERE user_id = %(user_id)s
    UNION SELECT memory_id FROM archival_attempts WHERE user_id = %(user_id)s
    UNION SELECT memory_id FROM memory_retention WHERE user_id = %(user_id)s
    UNION (SELECT memory_id FROM memory_events WHERE user_id = %(user_id)s
           GROUP BY memory_id HAVING NOT bool_or(event_type = 'forgotten'))"""
_DONE_FOR_USER_SQL = """
    SELECT * FROM forget_requests WHERE user_id = %(user_id)s AND status = 'done'
    ORDER BY completed_at DESC LIMIT 1"""
# Open requests of these users: what the archival backup step must not put (see `forgetting`).
_FORGETTING_SQL = """
    SELECT user_id, memory_id, memory_ids FROM forget_requests
    WHERE user_id = ANY(%(users)s) AND status <> 'done'"""
# The archive rows' refs by a join on (user_id, id), not packs.ref_sql's correlated subquery: the
# statement then stays on the user's shard on distributed Postgres.
_REFS_SQL = """
    SELECT backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) AS ref
          FROM archived_memories a LEFT JOIN backup_objects o ON o.user_id = a.user_id AND o.id = a.backup_object
          WHERE a.user_id = %(user_id)s AND a.original_id = ANY(%(ids)s)
    UNION SELECT backup_ref FROM archival_attempts
          WHERE user_id = %(user_id)s AND memory_id = ANY(%(ids)s) AND backup_ref IS NOT NULL
    UNION SELECT details ->> 'storage_ref' FROM memory_events
          WHERE user_id = %(user_id)s AND memory_id = ANY(%(ids)s) AND details ? 'storage_ref'"""
_INSERT_SQL = """
    INSERT INTO forget_requests (user_id, memory_id, actor, memory_ids, object_keys, requested_at, updated_at)
    VALUES (%(user_id)s, %(memory_id)s, %(actor)s, %(ids)s, %(keys)s, %(now)s, %(now)s) RETURNING *"""
_STATUS_SQL = """
    UPDATE forget_requests SET status = %(status)s, updated_at = %(at)s,
           object_versions_deleted = object_versions_deleted + %(versions)s
    WHERE user_id = %(user_id)s AND id = %(id)s RETURNING *"""
_DONE_SQL = """
    UPDATE forget_requests SET status = 'done', updated_at = %(at)s, completed_at = %(at)s,
           object_versions_deleted = object_versions_deleted + %(versions)s
    WHERE user_id = %(user_id)s AND id = %(id)s AND status = 'rows_deleted' RETURNING *"""
_TOMBSTONE_SQL = """
    WITH facts AS (
        SELECT id AS memory_id, content_sha256, NULL::text AS backup_sha256, 'hot' AS tier
        FROM memories WHERE user_id = %(user_id)s AND id = ANY(%(ids)s)
        UNION ALL
        SELECT original_id, NULL, encode(backup_digest, 'hex'), 'archived'
        FROM archived_memories WHERE user_id = %(user_id)s AND original_id = ANY(%(ids)s)
    ), targets AS (SELECT unnest(%(ids)s::uuid[]) AS memory_id)
    SELECT t.memory_id, max(f.content_sha256) AS content_sha256, max(f.backup_sha256) AS backup_sha256,
           coalesce(array_agg(f.tier) FILTER (WHERE f.tier IS NOT NULL), '{}') AS tiers
    FROM targets t LEFT JOIN facts f USING (memory_id)
    WHERE NOT EXISTS (SELECT 1 FROM memory_events e WHERE e.user_id = %(user_id)s
                      AND e.memory_id = t.memory_id AND e.event_type = 'forgotten')
    GROUP BY t.memory_id"""
# The tombstone's time is the database clock, like the redaction's: an erasure is recorded when it
# happened, whatever `now` a caller passes (that one is the request's requested_at).
# The database clock read first and passed to the UPDATEs: distributed Postgres refuses a VOLATILE
# function (clock_timestamp()) in an UPDATE of a distributed table.
_CLOCK_SQL = "SELECT clock_timestamp() AS at"


def _clock() -> Plan[datetime]:
    row = yield Sql(_CLOCK_SQL, {}, "one")
    return row["at"]


# --------------------------------------------------------------------------- steps

# A forget is a flow (memory_lib.core.plans): RunPlan steps (a database Plan run in one transaction) and
# Call steps (a blocking object-store function). run_forget / run_forget_async execute them; tests may
# drive them.
Steps = Flow[ForgetResult]


def forget_steps(
    store: ObjectStore | None,
    user_id: object,
    memory_id: object = None,
    *,
    actor: object,
    now: datetime | None = None,
) -> Steps:
    """The steps of forgetting `memory_id` of `user_id` (None: every memory of the user)."""
    user = validation.user(user_id)
    target = validation.optional_uuid("memory_id", memory_id)
    who = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    when = validation.timestamp("now", now or datetime.now(UTC))
    if store is None:
        raise InvalidInputError("object_store", None, "forget deletes backup objects: pass an object store")

    def keys_for(ids: Iterable[uuid.UUID], refs: Iterable[str]) -> list[str]:
        keys = {store.key_for(i) for i in ids}
        for ref in refs:
            # A ref of another store or bucket is not reachable from here (it stays named in the events).
            with contextlib.suppress(InvalidInputError):
                keys.add(store.key_from_ref(ref))
        return sorted(keys)

    # The request first, once the user's backups in flight are done (memory_lib.core.locks): from its
    # commit no archival backup puts these memories, and the listing below sees what one put before.
    opened = yield RunPlan(_open_plan(user, target, who, when, keys_for))
    if isinstance(opened, ForgetResult):
        return opened
    resumed = opened[1]
    # Packs no row may record (a run killed between put and checkpoint): listed, and read when the
    # listing cannot tell whose they are or which memories they hold.
    mine, untagged = yield Call(lambda: _listed_packs(store, user, untagged=target is None))
    unrecorded = yield RunPlan(_unrecorded_plan(store, user, mine, untagged))
    to_read = (
        unrecorded if target is not None else [k for k in unrecorded if packs.owner_of(store, k) is None]
    )
    members = yield Call(lambda: _pack_members(store, to_read))
    found = (set(mine) if target is None else set()) | {
        k for k, held in members.items() if any(u == user for u, _ in held)
    }

    def with_found(ids: Iterable[uuid.UUID], refs: Iterable[str]) -> list[str]:
        wanted = set(ids)
        extra = (
            found
            if target is None
            else {k for k in found if any(u == user and i in wanted for u, i in members[k])}
        )
        return sorted(set(keys_for(wanted, refs)) | extra)

    # The manifest, with what the listing found (the open request is resumed: ids and keys merged).
    opened = yield RunPlan(_open_plan(user, target, who, when, with_found))
    if isinstance(opened, ForgetResult):  # a concurrent forget finished it meanwhile
        return opened
    request = opened[0]
    versions = 0
    if request["status"] == "pending":
        # A pack also holding memories not forgotten is rewritten without these first (memory_lib.storage.packs).
        keep = yield RunPlan(_pack_neighbours_plan(store, request))
        if keep:
            moved = yield Call(lambda: {k: packs.rewrite_without(store, k, rows) for k, rows in keep.items()})
            yield RunPlan(_moved_plan(request["user_id"], keep, moved))
        versions += yield Call(lambda: purge_objects(store, request["object_keys"], request["memory_ids"]))
        request = yield RunPlan(_status_plan(request["user_id"], request["id"], "objects_deleted", versions))
    if request["status"] == "objects_deleted":
        request = yield RunPlan(_rows_plan(request, who, when, with_found))
    again = [] if target is not None else (yield Call(lambda: _listed_packs(store, user, untagged=False)))[0]
    swept = yield Call(lambda: purge_objects(store, [*request["object_keys"], *again], request["memory_ids"]))
    done = yield RunPlan(_done_plan(request["user_id"], request["id"], swept))
    return ForgetResult(
        done["id"],
        user,
        done["memory_id"],
        tuple(done["memory_ids"]),
        done["object_versions_deleted"],
        dict(done["rows_deleted"]),
        resumed=resumed,
    )


def forgetting(conn: Conn, user_ids: Iterable[str]) -> Callable[[str, uuid.UUID], bool]:
    """Whether an open (unfinished) forget request of these users covers a (user_id, memory id): the
    archival backup step asks under the users' backup locks (memory_lib.core.locks) and puts nothing
    it covers, so no backup is written after forget has listed the user's objects."""
    rows = conn.execute(_FORGETTING_SQL, {"users": sorted(set(user_ids))}).fetchall()
    whole = {r["user_id"] for r in rows if r["memory_id"] is None}
    some = {(r["user_id"], i) for r in rows if r["memory_id"] is not None for i in r["memory_ids"]}
    return lambda user, memory_id: user in whole or (user, memory_id) in some


def run_forget(conn: Conn, steps: Steps) -> ForgetResult:
    return drive(conn, steps)


async def run_forget_async(conn: AsyncConn, steps: Steps) -> ForgetResult:
    return await drive_async(conn, steps)


def forget_memory(
    conn: Conn,
    store: ObjectStore | None,
    user_id: str,
    memory_id: uuid.UUID,
    *,
    actor: str,
    now: datetime | None = None,
) -> ForgetResult:
    """Forget one memory (and the versions it superseded) of `user_id`; NotFoundError if it never existed."""
    if memory_id is None:
        raise InvalidInputError("memory_id", None, "is required (forget_user forgets every memory)")
    return run_forget(conn, forget_steps(store, user_id, memory_id, actor=actor, now=now))


def forget_user(
    conn: Conn,
    store: ObjectStore | None,
    user_id: str,
    *,
    actor: str,
    now: datetime | None = None,
) -> ForgetResult:
    """Forget every memory of `user_id` in every tier, table and object version. Idempotent."""
    return run_forget(conn, forget_steps(store, user_id, None, actor=actor, now=now))


@dataclass(frozen=True)
class ForgetItem:
    """One memory a forget would erase: `tier` is hot, archived, or other (only its attempts, retention
    or audit events are left); `text` its content (hot) or summary (archived)."""

    memory_id: uuid.UUID
    tier: str
    archive_id: uuid.UUID | None
    text: str | None
    created_at: datetime | None


@dataclass(frozen=True)
class ForgetPreview:
    """What forget of `memory_id` (None: the whole user) would erase now, read without writing: the
    memories in its scope and the backup refs their rows name (forget also lists the user's packs)."""

    user_id: str
    memory_id: uuid.UUID | None  # the memory the given id names (an archive id resolves to its memory)
    items: tuple[ForgetItem, ...]
    backup_refs: tuple[str, ...]
    already_forgotten: bool = False


def preview_plan(user_id: object, memory_id: object = None) -> Plan[ForgetPreview]:
    """forget's scope (`_RESOLVE_SQL`, then the chain or the user's ids), read in one snapshot: the dry run
    of a forget. NotFoundError for a memory id the user never had."""
    user = validation.user(user_id)
    target = validation.optional_uuid("memory_id", memory_id)
    yield Snapshot()
    if target is not None:
        found = yield Sql(_RESOLVE_SQL, {"user_id": user, "id": target}, "one")
        if found is None:
            done = yield Sql(_DONE_FOR_MEMORY_SQL, {"user_id": user, "id": target}, "one")
            if done is None:
                raise NotFoundError(f"no memory {target} for user_id={user!r}")
            return ForgetPreview(user, target, (), (), already_forgotten=True)
        target = found["memory_id"]
    ids = yield from _scope_ids(user, target)
    if not ids:
        done = yield Sql(_DONE_FOR_USER_SQL, {"user_id": user}, "one")
        return ForgetPreview(user, target, (), (), already_forgotten=done is not None)
    params = {"user_id": user, "ids": ids}
    hot = yield Sql(
        "SELECT id, content, created_at FROM memories WHERE user_id = %(user_id)s AND id = ANY(%(ids)s)",
        params,
        "all",
    )
    archived = yield Sql(
        """SELECT original_id, id, summary, original_created_at FROM archived_memories
           WHERE user_id = %(user_id)s AND original_id = ANY(%(ids)s)""",
        params,
        "all",
    )
    refs = yield Sql(_REFS_SQL, params, "all")
    items = {i: ForgetItem(i, "other", None, None, None) for i in ids}
    items |= {r["id"]: ForgetItem(r["id"], "hot", None, r["content"], r["created_at"]) for r in hot}
    for r in archived:
        items[r["original_id"]] = ForgetItem(
            r["original_id"], "archived", r["id"], r["summary"], r["original_created_at"]
        )
    oldest = datetime.min.replace(tzinfo=UTC)
    ordered = sorted(items.values(), key=lambda i: (i.created_at or oldest, i.memory_id))
    return ForgetPreview(user, target, tuple(ordered), tuple(sorted({r["ref"] for r in refs if r["ref"]})))


def preview(conn: Conn, user_id: str, memory_id: uuid.UUID | None = None) -> ForgetPreview:
    """What forget_memory (memory_id given) or forget_user would erase now; writes nothing."""
    return run_plan(conn, preview_plan(user_id, memory_id))


# --------------------------------------------------------------------------- plans


def _open_plan(
    user: str,
    target: uuid.UUID | None,
    actor: str,
    now: datetime,
    keys_for: Callable[[Iterable[uuid.UUID], Iterable[str]], list[str]],
) -> Plan[tuple[Row, bool] | ForgetResult]:
    # The backup lock before the user's write lock (memory_lib.core.locks): wait for the user's
    # archival backups in flight; the request this transaction records stops the later ones.
    yield Sql(WAIT_FOR_BACKUPS_SQL, {"user_id": user}, "one")
    yield Sql(USER_LOCK_SQL, {"user_id": user}, "one")
    if target is not None:
        # An unfinished request covering it first: its rows may already be gone.
        found = yield Sql(_OPEN_COVERING_SQL, {"user_id": user, "id": target}, "one")
        if found is None:
            found = yield Sql(_RESOLVE_SQL, {"user_id": user, "id": target}, "one")
        if found is None:
            done = yield Sql(_DONE_FOR_MEMORY_SQL, {"user_id": user, "id": target}, "one")
            if done is None:
                raise NotFoundError(f"no memory {target} for user_id={user!r}")
            return ForgetResult(done["id"], user, target, (), 0, {}, already_forgotten=True)
        target = found["memory_id"]
    request = yield Sql(_OPEN_SQL, {"user_id": user, "memory_id": target}, "one")
    ids = yield from _scope_ids(user, target)
    if request is None and target is None and not ids:
        # Nothing of the user is left (a forgotten memory's redacted events and tombstone do not count).
        done = yield Sql(_DONE_FOR_USER_SQL, {"user_id": user}, "one")
        if done is not None:
            return ForgetResult(done["id"], user, None, (), 0, {}, already_forgotten=True)
    if request is not None:
        ids = sorted(set(ids) | set(request["memory_ids"]))
    refs = yield Sql(_REFS_SQL, {"user_id": user, "ids": ids}, "all")
    keys = keys_for(ids, [r["ref"] for r in refs])
    if request is not None:
        keys = sorted(set(keys) | set(request["object_keys"]))
        request = yield Sql(
            """UPDATE forget_requests SET memory_ids = %(ids)s, object_keys = %(keys)s
               WHERE user_id = %(user_id)s AND id = %(id)s RETURNING *""",
            {"ids": ids, "keys": keys, "user_id": user, "id": request["id"]},
            "one",
        )
        return request, True
    request = yield Sql(
        _INSERT_SQL,
        {"user_id": user, "memory_id": target, "actor": actor, "ids": ids, "keys": keys, "now": now},
        "one",
    )
    return request, False


def _scope_ids(user: str, target: uuid.UUID | None) -> Plan[list[uuid.UUID]]:
    if target is None:
        rows = yield Sql(_USER_IDS_SQL, {"user_id": user}, "all")
    else:
        rows = yield Sql(_CHAIN_SQL, {"user_id": user, "id": target}, "all")
    return sorted(r["id"] for r in rows)


def _pack_neighbours_plan(store: ObjectStore, request: Row) -> Plan[dict[str, list[Row]]]:
    """pack key -> the archive rows of memories NOT forgotten whose backup is a member of that pack.
    In-flight archival attempts backed up into such a pack go back to be backed up again."""
    keys = {k for k in request["object_keys"] if packs.is_pack_key(k)}
    if not keys:
        return {}
    user, ids = request["user_id"], request["memory_ids"]
    yield Sql(
        """UPDATE archival_attempts SET status = 'embedded', updated_at = now()
           WHERE user_id = %(user_id)s AND backup_key = ANY(%(keys)s) AND status = 'backed_up'
             AND NOT (memory_id = ANY(%(ids)s))""",
        {"user_id": user, "keys": sorted(keys), "ids": ids},
        "rowcount",
    )
    rows = yield Sql(
        """SELECT a.original_id, backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) AS storage_ref,
                  encode(a.backup_digest, 'hex') AS backup_sha256
           FROM backup_objects o JOIN archived_memories a ON a.user_id = o.user_id AND a.backup_object = o.id
           WHERE o.user_id = %(user_id)s AND o.ref = ANY(%(refs)s) AND NOT (a.original_id = ANY(%(ids)s))""",
        {"user_id": user, "ids": ids, "refs": [store.ref_for(k) for k in sorted(keys)]},
        "all",
    )
    out: dict[str, list[Row]] = {}
    for r in rows:
        key = store.key_from_ref(r["storage_ref"])
        if key in keys:
            out.setdefault(key, []).append(r)
    return out


def _moved_plan(
    user: str, keep: dict[str, list[Row]], moved: dict[str, dict[uuid.UUID, packs.StoredMember]]
) -> Plan[int]:
    """Point each kept member's archive row at its place in the rewritten pack (only rows still
    pointing at the old one: a re-run changes nothing twice)."""
    n = 0
    for key, rows in keep.items():
        refs = [moved[key][r["original_id"]].ref for r in rows]
        yield Sql(packs.RECORD_OBJECTS_SQL, {"users": [user] * len(refs), "refs": refs}, "rowcount")
        for r in rows:
            new = moved[key][r["original_id"]]
            n += yield Sql(
                f"""UPDATE archived_memories a
                    SET backup_object = {packs.object_of_sql("a.user_id", "%(new)s")},
                        backup_offset = backup_member_offset(%(new)s), backup_version_id = %(version)s
                    WHERE a.user_id = %(user_id)s AND a.original_id = %(id)s AND {packs.ref_sql("a")} = %(old)s""",
                {
                    "new": new.ref,
                    "version": new.object.version_id,
                    "user_id": user,
                    "id": r["original_id"],
                    "old": r["storage_ref"],
                },
                "rowcount",
            )
    return n


def _status_plan(user_id: str, request_id: uuid.UUID, status: str, versions: int) -> Plan[Row]:
    at = yield from _clock()
    row = yield Sql(
        _STATUS_SQL,
        {"user_id": user_id, "id": request_id, "status": status, "versions": versions, "at": at},
        "one",
    )
    return row


def _rows_plan(
    request: Row,
    actor: str,
    now: datetime,
    keys_for: Callable[[Iterable[uuid.UUID], Iterable[str]], list[str]],
) -> Plan[Row]:
    user, target = request["user_id"], request["memory_id"]
    yield Sql(USER_LOCK_SQL, {"user_id": user}, "one")
    current = yield Sql(
        "SELECT * FROM forget_requests WHERE user_id = %(user_id)s AND id = %(id)s FOR UPDATE",
        {"user_id": user, "id": request["id"]},
        "one",
    )
    if current["status"] != "objects_deleted":
        return current  # another run finished this step
    # Memories written since the request was recorded (or versions superseded since) are included.
    ids = sorted(set(current["memory_ids"]) | set((yield from _scope_ids(user, target))))
    refs = yield Sql(_REFS_SQL, {"user_id": user, "ids": ids}, "all")
    keys = sorted(set(current["object_keys"]) | set(keys_for(ids, [r["ref"] for r in refs])))
    facts = yield Sql(_TOMBSTONE_SQL, {"user_id": user, "ids": ids}, "all")
    counts: dict[str, int] = {}
    for table, column in _ERASED.items():
        counts[table] = yield Sql(
            f"DELETE FROM {table} WHERE user_id = %(user_id)s AND {column} = ANY(%(ids)s)",
            {"user_id": user, "ids": ids},
            "rowcount",
        )
    counts["backup_objects"] = yield Sql(_OBJECTS_SQL, {"user_id": user}, "rowcount")
    consolidated = yield from drop_from_consolidation_plan(user, ids, whole_user=target is None)
    counts |= {f"consolidation.{k}": v for k, v in consolidated.items()}
    redacted = yield Sql(
        "SELECT redact_memory_events(%(request)s, %(user_id)s, %(ids)s, %(actor)s) AS n",
        {"request": current["id"], "user_id": user, "ids": None if target is None else ids, "actor": actor},
        "one",
    )
    counts["memory_events_redacted"] = redacted["n"]
    scope = "user" if target is None else "memory"
    tombstones = [
        (
            f["memory_id"],
            user,
            {
                "forget_request": str(current["id"]),
                "scope": scope,
                "tiers": list(f["tiers"]),
                "content_sha256": f["content_sha256"],
                "backup_sha256": f["backup_sha256"],
            },
        )
        for f in facts
    ]
    # now=None: the database clock, whatever `now` the caller passed (the comment after _TOMBSTONE_SQL).
    counts["tombstones"] = yield events(EventType.FORGOTTEN, tombstones, actor=actor, now=None)
    row = yield Sql(
        """UPDATE forget_requests SET status = 'rows_deleted', memory_ids = %(ids)s, object_keys = %(keys)s,
                  rows_deleted = %(counts)s, updated_at = %(at)s
           WHERE user_id = %(user_id)s AND id = %(id)s RETURNING *""",
        {
            "ids": ids,
            "keys": keys,
            "counts": Jsonb(counts),
            "user_id": user,
            "id": current["id"],
            "at": (yield from _clock()),
        },
        "one",
    )
    return row


def _done_plan(user_id: str, request_id: uuid.UUID, versions: int) -> Plan[Row]:
    key = {"user_id": user_id, "id": request_id}
    at = yield from _clock()
    row = yield Sql(_DONE_SQL, key | {"versions": versions, "at": at}, "one")
    if row is None:  # finished by a concurrent run
        row = yield Sql(
            "SELECT * FROM forget_requests WHERE user_id = %(user_id)s AND id = %(id)s", key, "one"
        )
    return row


# --------------------------------------------------------------------------- objects


def _listed_packs(store: ObjectStore, user: str, *, untagged: bool = True) -> tuple[list[str], list[str]]:
    """(the keys in the user's pack folder, the keys of packs written before owner tags when
    `untagged`), in any version: a key whose current version is a delete marker still holds bytes.
    The user's folder is one listing; the packs before tags, one per folder of theirs."""
    mine = {v.key for v in list_versions(store, packs.owner_prefix(store, user)) if packs.is_pack_key(v.key)}
    old: set[str] = set()
    if untagged:
        for folder in list_folders(store, packs.packs_prefix(store)):
            if not folder.rstrip("/").rsplit("/", 1)[-1].startswith(packs.OWNER_MARK):
                old |= {v.key for v in list_versions(store, folder) if packs.is_pack_key(v.key)}
    return sorted(mine), sorted(old)


def _unrecorded_plan(store: ObjectStore, user: str, mine: list[str], untagged: list[str]) -> Plan[list[str]]:
    """The keys among `mine` that no row of the user records, and among `untagged` that no row at all
    records (a pack holds one user's memories: one recorded by a row is that row's user's)."""
    refs = {store.ref_for(k): k for k in [*mine, *untagged]}
    if not refs:
        return []
    rows = yield Sql(
        """SELECT backup_key AS key, NULL AS ref, user_id FROM archival_attempts WHERE backup_key = ANY(%(keys)s)
           UNION SELECT NULL, o.ref, o.user_id FROM backup_objects o
                 WHERE o.ref = ANY(%(refs)s) AND EXISTS
                       (SELECT 1 FROM archived_memories a WHERE a.user_id = o.user_id AND a.backup_object = o.id)""",
        {"keys": list(refs.values()), "refs": list(refs)},
        "all",
    )
    old = set(untagged)
    recorded = set()
    for r in rows:
        key = r["key"] or refs[r["ref"]]
        if key in old or r["user_id"] == user:
            recorded.add(key)
    return sorted(k for k in refs.values() if k not in recorded)


def _pack_members(store: ObjectStore, keys: Iterable[str]) -> dict[str, set[tuple[str, uuid.UUID]]]:
    """key -> (user_id, memory id) of every member of every stored version of these packs."""
    out: dict[str, set[tuple[str, uuid.UUID]]] = {}
    for key in keys:
        held: set[tuple[str, uuid.UUID]] = set()
        for v in list_versions(store, key):
            if v.key == key and not v.delete_marker:
                held |= _members_of(store, v)
        out[key] = held
    return out


def _members_of(store: ObjectStore, version: ObjectVersion) -> set[tuple[str, uuid.UUID]]:
    held = set()
    for line in read_version(store, version).splitlines():
        try:
            doc = orjson.loads(line)
            held.add((str(doc["user_id"]), uuid.UUID(str(doc["original_id"]))))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # not a backup document: nothing of a user's to find in it
    return held


def _scratch_prefix(store: ObjectStore) -> str:
    # memory_lib.archival.dry_run writes round-trip copies under <prefix>/dry-run/<token>/memories/<id>.json and
    # deletes them; on a versioned bucket their bytes stay as noncurrent versions.
    return f"{store.prefix}/dry-run/" if store.prefix else "dry-run/"


def _scratch_keys(store: ObjectStore, memory_ids: Iterable[uuid.UUID]) -> list[str]:
    names = {f"{i}.json" for i in memory_ids}
    found = {v.key for v in list_versions(store, _scratch_prefix(store))}
    return sorted(k for k in found if k.rsplit("/", 1)[-1] in names)


def purge_objects(store: ObjectStore, keys: Iterable[str], memory_ids: Iterable[uuid.UUID]) -> int:
    """Delete every version of `keys` and of the dry run's copies of `memory_ids`; returns versions deleted."""
    ids = list(memory_ids)
    return sum(purge(store, key) for key in [*keys, *_scratch_keys(store, ids)])


# --------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class Leftovers:
    """What of a user is still stored: rows per table, unredacted audit events, object versions."""

    user_id: str
    rows: dict[str, int] = field(default_factory=dict)
    unredacted_events: int = 0
    objects: tuple[str, ...] = ()  # "key@version" of every remaining version or delete marker
    uncovered_tables: tuple[str, ...] = ()  # tables with a user_id that forget does not know

    @property
    def clean(self) -> bool:
        return not (any(self.rows.values()) or self.unredacted_events or self.objects)


def user_id_tables(conn: Conn) -> list[str]:
    """Every table of the current schema with a user_id column; a partitioned table once, not its
    partitions (its rows are read and deleted through it)."""
    rows = conn.execute(
        """SELECT c.relname AS table_name FROM pg_class c
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'user_id' AND NOT a.attisdropped
           WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
             AND NOT c.relispartition
           ORDER BY 1"""
    ).fetchall()
    return [r["table_name"] for r in rows]


def remaining(conn: Conn, store: ObjectStore, user_id: str) -> Leftovers:
    """Everything of `user_id` still stored after forget_user: the user's rows in every table with a
    user_id (listed in erased_tables() or not) except the retained audit tables; audit events still
    carrying content; every version of every backup key the user's forget requests covered, and of the
    dry run's copies of those memories; and, from the bucket itself, every version of every pack in the
    user's folder and of every pack no row records that holds a memory of the user."""
    user = validation.user(user_id)
    tables = user_id_tables(conn)
    rows = {}
    for table in tables:
        if table in _RETAINED:
            continue
        rows[table] = _one(conn, f"SELECT count(*) AS n FROM {table} WHERE user_id = %s", user)["n"]
    unredacted = _one(
        conn,
        """SELECT count(*) AS n FROM memory_events WHERE user_id = %s
           AND event_type NOT IN ('forgotten', 'redacted') AND NOT details ? 'redacted'""",
        user,
    )["n"]
    manifest = _one(
        conn,
        """SELECT coalesce(array_agg(DISTINCT k), '{}') AS keys, coalesce(array_agg(DISTINCT i), '{}') AS ids
           FROM forget_requests r LEFT JOIN LATERAL unnest(r.object_keys) k ON true
           LEFT JOIN LATERAL unnest(r.memory_ids) i ON true WHERE r.user_id = %s""",
        user,
    )
    ids = [i for i in manifest["ids"] if i is not None]
    keys = {k for k in manifest["keys"] if k is not None} | {store.key_for(i) for i in ids}
    mine, untagged = _listed_packs(store, user)
    legacy = run_plan(conn, _unrecorded_plan(store, user, [], untagged))
    keys |= set(mine) | {
        k for k, held in _pack_members(store, legacy).items() if any(u == user for u, _ in held)
    }
    objects = []
    for key in sorted(keys):
        objects += [f"{v.key}@{v.version_id}" for v in list_versions(store, key) if v.key == key]
    objects += [f"{k}@*" for k in _scratch_keys(store, ids)]
    uncovered = tuple(t for t in tables if t not in erased_tables() and t not in _RETAINED)
    return Leftovers(user, rows, unredacted, tuple(objects), uncovered)


def _one(conn: Conn, query: str, user: str) -> Row:
    """The one row of an aggregate query over `user`'s rows (without GROUP BY it always has one)."""
    row = conn.execute(query, (user,)).fetchone()
    assert row is not None
    return row
