"""get, list, update and history of one user's memories across the hot and archived tiers (plans run by
both clients; `delete` is memory_lib.lifecycle.forget's forget of one memory).

Invariants: every statement filters on the caller's user_id, so another user's id reads as "not found";
an id may be a memory id (hot, or the original id of an archived memory) or an archive row's id.
`list` pages newest first by (created_at, id) with an opaque keyset cursor: a page never repeats or
skips a memory that existed when the first page was read, whatever is added meanwhile.
`update` keeps the write path's rules: new text is a new version that supersedes the old one (the old
stays as history, a 'superseded' and a 'created' event are written, the embedding is the new text's);
a change of fields only (tags, importance, ...) updates the row in place with an 'updated' event.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.errors import InvalidInputError, MemoryArchiveError, NotFoundError
from ..core.locks import USER_LOCK_SQL
from ..core.models import sha256_hex, validate_memory
from ..core.plans import Plan, Snapshot, Sql
from ..core.validation import normalize_tags
from ..storage.events import EventType, event
from ..storage.space import checked_shape_plan
from .write_path import (
    BIND_MODEL_SQL,
    SUPERSEDE_SQL,
    PreparedMemory,
    insert,
    lexical_change,
    prepare_memory,
    touch,
)

Tier = Literal["hot", "archived"]
TIERS: tuple[Tier, ...] = ("hot", "archived")
CATEGORIES = ("core", "episodic", "semantic", "procedural")
DEFAULT_PAGE = 50


@dataclass(frozen=True)
class MemoryRecord:
    """One memory as stored. Hot: `content` is its text. Archived: `content` is None (the original is
    in the backup: client.expand) and `summary` its summary; `archive_id` names the archive row.

    The supersede chain both ways: `superseded_by` is the memory that replaced this one, `supersedes`
    (get only; None in list pages) the one this memory replaced, hot or archived (the most recently
    updated when several were), so a reader can walk from any version to the next and the previous."""

    id: uuid.UUID
    user_id: str
    tier: Tier
    content: str | None
    summary: str | None
    category: str
    domain: str | None
    tags: tuple[str, ...]
    metadata: dict[str, Any]
    importance: float
    pinned: bool
    access_count: int
    last_accessed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    superseded_by: uuid.UUID | None
    archive_id: uuid.UUID | None
    archived_at: datetime | None
    embedding_model: str
    # Hot: the TTL the memory was written with (0: pinned) and when the nightly run archives it for
    # that (None: never by TTL). Archived: None, and `archive_reason` says why it was archived
    # (`ttl_expired` for an expired one).
    ttl_days: int | None = None
    expires_at: datetime | None = None
    archive_reason: str | None = None
    supersedes: uuid.UUID | None = None


@dataclass(frozen=True)
class MemoryPage:
    items: list[MemoryRecord]
    next_cursor: str | None  # pass to list(cursor=...) for the next page; None: this was the last


@dataclass(frozen=True)
class MemoryEvent:
    """One audit event (memory_events): redacted events keep ids and sha256 only."""

    id: int
    memory_id: uuid.UUID
    event_type: str
    actor: str
    occurred_at: datetime
    details: dict[str, Any]


@dataclass(frozen=True)
class UpdateResult:
    memory_id: uuid.UUID  # the live memory holding the updated text now
    outcome: Literal["updated", "superseded", "unchanged"]
    previous_id: uuid.UUID | None = None  # the superseded version, when the text changed
    changed: tuple[str, ...] = ()  # the fields that changed


_HOT_COLUMNS = """'hot' AS tier, m.id, m.user_id, m.content, NULL::text AS summary, m.category, m.domain,
    m.metadata, m.importance_score, m.pinned, m.access_count, m.last_accessed_at, m.created_at, m.updated_at,
    m.superseded_by, NULL::uuid AS archive_id, NULL::timestamptz AS archived_at, m.embedding_model,
    m.ttl_days, m.expires_at, NULL::text AS archive_reason"""
_ARCHIVED_COLUMNS = """'archived' AS tier, a.original_id AS id, a.user_id, NULL::text AS content, a.summary,
    a.original_category AS category, a.original_domain AS domain, a.metadata, a.importance_score,
    false AS pinned, a.access_count, a.last_accessed_at, a.original_created_at AS created_at,
    a.original_updated_at AS updated_at, a.original_superseded_by AS superseded_by, a.id AS archive_id,
    a.archived_at, a.original_embedding_model AS embedding_model, NULL::integer AS ttl_days,
    NULL::timestamptz AS expires_at, a.archive_reason"""
# `supersedes`: the memory (hot, or an archived original) this one replaced, by reverse lookup of
# superseded_by, so it is the chain as it stands (a version made live again no longer counts).
GET_SQL = f"""
    SELECT g.*, (
        SELECT s.id FROM (
            SELECT p.id, p.updated_at FROM memories p WHERE p.user_id = %(user_id)s AND p.superseded_by = g.id
            UNION ALL
            SELECT pa.original_id, pa.original_updated_at FROM archived_memories pa
            WHERE pa.user_id = %(user_id)s AND pa.original_superseded_by = g.id
        ) s ORDER BY s.updated_at DESC, s.id LIMIT 1) AS supersedes
    FROM (
        SELECT {_HOT_COLUMNS} FROM memories m WHERE m.user_id = %(user_id)s AND m.id = %(id)s
        UNION ALL
        SELECT {_ARCHIVED_COLUMNS} FROM archived_memories a
        WHERE a.user_id = %(user_id)s AND (a.original_id = %(id)s OR a.id = %(id)s)
        LIMIT 1
    ) g"""
HISTORY_SQL = """
    WITH target AS (
        SELECT %(id)s::uuid AS memory_id
        UNION SELECT original_id FROM archived_memories WHERE user_id = %(user_id)s AND id = %(id)s
        UNION SELECT memory_id FROM memory_events WHERE user_id = %(user_id)s AND details ->> 'archive_id' = %(id)s::text
    )
    SELECT e.id, e.memory_id, e.event_type, e.actor, e.occurred_at, e.details FROM memory_events e
    WHERE e.user_id = %(user_id)s AND e.memory_id IN (SELECT memory_id FROM target)
    ORDER BY e.id"""  # append order: occurred_at may be a caller's `now`, ids are the log's own order


def _record(row: dict[str, Any]) -> MemoryRecord:
    meta = dict(row["metadata"] or {})
    tags = meta.pop("tags", []) if row["tier"] == "hot" else meta.get("tags", [])
    if row["tier"] == "archived":
        meta = {}  # an archive row's metadata is batch provenance, not the memory's (kept in its backup)
    return MemoryRecord(
        id=row["id"],
        user_id=row["user_id"],
        tier=row["tier"],
        content=row["content"],
        summary=row["summary"],
        category=row["category"],
        domain=row["domain"],
        tags=tuple(tags if isinstance(tags, list) else ()),
        metadata=meta,
        importance=float(row["importance_score"]),
        pinned=row["pinned"],
        access_count=row["access_count"],
        last_accessed_at=row["last_accessed_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        superseded_by=row["superseded_by"],
        archive_id=row["archive_id"],
        archived_at=row["archived_at"],
        embedding_model=row["embedding_model"],
        ttl_days=row["ttl_days"],
        expires_at=row["expires_at"],
        archive_reason=row["archive_reason"],
        supersedes=row.get("supersedes"),
    )


# --------------------------------------------------------------------------- get, history


def get_plan(user_id: object, memory_id: object) -> Plan[MemoryRecord | None]:
    user, mid = validation.user(user_id), validation.uuid_value("memory_id", memory_id)
    row = yield Sql(GET_SQL, {"user_id": user, "id": mid}, "one")
    return None if row is None else _record(row)


def history_plan(user_id: object, memory_id: object) -> Plan[list[MemoryEvent]]:
    """Every audit event of the memory in the order the log appended them: created, superseded, archived, expanded, restored,
    promoted, updated, redacted, forgotten. [] when the user has no such memory."""
    user, mid = validation.user(user_id), validation.uuid_value("memory_id", memory_id)
    rows = yield Sql(HISTORY_SQL, {"user_id": user, "id": mid}, "all")
    return [
        MemoryEvent(r["id"], r["memory_id"], r["event_type"], r["actor"], r["occurred_at"], r["details"])
        for r in rows
    ]


# --------------------------------------------------------------------------- list


@dataclass(frozen=True)
class ListQuery:
    user_id: str
    tier: Tier | None
    categories: tuple[str, ...] | None
    created_after: datetime | None
    created_before: datetime | None
    include_superseded: bool
    limit: int
    after: tuple[datetime, uuid.UUID] | None
    tags: tuple[str, ...] = ()  # every one required (normalized as the write path stores them)


def list_query(
    user_id: object,
    *,
    tier: object = None,
    category: object = None,
    created_after: object = None,
    created_before: object = None,
    include_superseded: object = False,
    limit: object = DEFAULT_PAGE,
    cursor: object = None,
    tags: object = None,
) -> ListQuery:
    """Every argument checked (InvalidInputError names it) before anything is read."""
    user = validation.user(user_id)
    chosen_tier = None if tier is None else validation.choice("tier", tier, TIERS)
    categories = None
    if category is not None:
        values = [category] if isinstance(category, str) else category
        if not isinstance(values, (list, tuple)) or not values:
            raise InvalidInputError("category", category, "must be a category or a non-empty list of them")
        categories = tuple(validation.choice("category", c, CATEGORIES) for c in values)
    after = validation.optional_timestamp("created_after", created_after)
    before = validation.optional_timestamp("created_before", created_before)
    if after is not None and before is not None and after >= before:
        raise InvalidInputError("created_after", after, f"must be before created_before={before.isoformat()}")
    n = validation.row_limit("limit", limit)
    if n is None or n < 1:
        raise InvalidInputError("limit", limit, "must be an integer in 1..1000")
    return ListQuery(
        user,
        chosen_tier,
        categories,
        after,
        before,
        validation.boolean("include_superseded", include_superseded),
        n,
        decode_cursor(cursor),
        normalize_tags(validation.tag_list("tags", tags)),
    )


def encode_cursor(created_at: datetime, memory_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{memory_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: object) -> tuple[datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    bad = InvalidInputError("cursor", cursor, "is not a cursor returned by list()")
    if not isinstance(cursor, str) or len(cursor) > 200:
        raise bad
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, mid = text.partition("|")
        when = datetime.fromisoformat(stamp)
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, uuid.UUID(mid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None


def _branch(
    columns: str, table: str, alias: str, created: str, idcol: str, superseded: str, cat: str, q: ListQuery
) -> str:
    where = [f"{alias}.user_id = %(user_id)s"]
    if not q.include_superseded:
        where.append(f"{alias}.{superseded} IS NULL")
    if q.categories is not None:
        where.append(f"{alias}.{cat} = ANY(%(categories)s)")
    # An archive row keeps its memory's tags (trigger archived_memories_keep_tags): both GIN-indexed.
    if q.tags:
        where.append(f"{alias}.metadata -> 'tags' @> %(tags)s")
    if q.created_after is not None:
        where.append(f"{alias}.{created} >= %(created_after)s")
    if q.created_before is not None:
        where.append(f"{alias}.{created} < %(created_before)s")
    if q.after is not None:
        where.append(f"({alias}.{created}, {alias}.{idcol}) < (%(c_at)s, %(c_id)s)")
    return (
        f"(SELECT {columns} FROM {table} {alias} WHERE {' AND '.join(where)} "
        f"ORDER BY {alias}.{created} DESC, {alias}.{idcol} DESC LIMIT %(n)s)"
    )


def list_plan(q: ListQuery) -> Plan[MemoryPage]:
    branches = []
    if q.tier in (None, "hot"):
        branches.append(
            _branch(_HOT_COLUMNS, "memories", "m", "created_at", "id", "superseded_by", "category", q)
        )
    if q.tier in (None, "archived"):
        branches.append(
            _branch(
                _ARCHIVED_COLUMNS,
                "archived_memories",
                "a",
                "original_created_at",
                "original_id",
                "original_superseded_by",
                "original_category",
                q,
            )
        )
    sql = (
        f"SELECT * FROM ({' UNION ALL '.join(branches)}) t ORDER BY t.created_at DESC, t.id DESC LIMIT %(n)s"
    )
    params = {
        "user_id": q.user_id,
        "categories": list(q.categories or ()),
        "tags": Jsonb(list(q.tags)),
        "created_after": q.created_after,
        "created_before": q.created_before,
        "n": q.limit + 1,
        "c_at": q.after[0] if q.after else None,
        "c_id": q.after[1] if q.after else None,
    }
    yield Snapshot()
    rows = yield Sql(sql, params, "all")
    items = [_record(r) for r in rows[: q.limit]]
    more = len(rows) > q.limit
    return MemoryPage(items, encode_cursor(items[-1].created_at, items[-1].id) if more else None)


# --------------------------------------------------------------------------- update

UNSET: Any = object()  # "not given": None is a value (domain=None clears it)
UPDATE_FIELDS = ("content", "category", "domain", "importance", "tags", "metadata", "pinned")
_LOCKED_SQL = "SELECT * FROM memories WHERE user_id = %(user_id)s AND id = %(id)s FOR UPDATE"
_ARCHIVED_SQL = (
    "SELECT id FROM archived_memories WHERE user_id = %(user_id)s AND (original_id = %(id)s OR id = %(id)s)"
)
_LIVE_DUPLICATE_SQL = """
    SELECT id FROM memories WHERE user_id = %(user_id)s AND superseded_by IS NULL AND id <> %(id)s
      AND (dedupe_key = %(key)s OR (dedupe_key IS NULL AND content_sha256 = %(sha)s)) LIMIT 1"""
_IN_PLACE_SQL = """
    UPDATE memories SET category = %(category)s, domain = %(domain)s, importance_score = %(importance_score)s,
           metadata = %(metadata)s, pinned = %(pinned)s, updated_at = greatest(updated_at, %(now)s)
    WHERE user_id = %(user_id)s AND id = %(id)s"""


def current_plan(user_id: str, memory_id: uuid.UUID) -> Plan[dict[str, Any]]:
    """The live hot row to update: NotFoundError, or InvalidInputError naming `id` when it is archived or
    superseded (update the live version, or restore the archived one first)."""
    row = yield Sql(_LOCKED_SQL, {"user_id": user_id, "id": memory_id}, "one")
    if row is None:
        archived = yield Sql(_ARCHIVED_SQL, {"user_id": user_id, "id": memory_id}, "one")
        if archived is not None:
            raise InvalidInputError(
                "memory_id", memory_id, "is archived: restore it first (client.restore), then update"
            )
        raise NotFoundError(f"no memory {memory_id} for user_id={user_id!r}")
    if row["superseded_by"] is not None:
        raise InvalidInputError(
            "memory_id", memory_id, f"is superseded by {row['superseded_by']}: update the live memory"
        )
    return row


def merged_fields(row: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """prepare_memory's arguments: the row's values overridden by the given changes."""
    meta = dict(row["metadata"] or {})
    tags = meta.pop("tags", None)
    given = {k: v for k, v in changes.items() if v is not UNSET}
    return {
        "content": given.get("content", row["content"]),
        "category": given.get("category", row["category"]),
        "domain": given.get("domain", row["domain"]),
        "importance": given.get("importance", row["importance_score"]),
        "tags": given.get("tags", tags),
        "metadata": given.get("metadata", meta),
        "pinned": given.get("pinned", row["pinned"]),
        "entity_links": row["entity_links"],
    }


def update_plan(
    memory: PreparedMemory,
    memory_id: uuid.UUID,
    seen: dict[str, Any],
    embedding: np.ndarray | None,
    *,
    embedding_model: str,
    actor: str,
    now: datetime,
) -> Plan[UpdateResult]:
    """Apply a prepared update to the row `seen` (read before embedding): it must be unchanged under the
    user's write lock, or MemoryArchiveError asks to retry (a concurrent update won)."""
    user = memory.user_id
    yield Sql(USER_LOCK_SQL, {"user_id": user}, "one")
    row = yield from current_plan(user, memory_id)
    if row["updated_at"] != seen["updated_at"] or row["content_sha256"] != seen["content_sha256"]:
        raise MemoryArchiveError(
            f"memory {memory_id} changed while it was being updated: read it again and retry"
        )
    f = memory.fields
    changed = tuple(
        name
        for name, old, new in (
            ("category", row["category"], f["category"]),
            ("domain", row["domain"], f["domain"]),
            ("importance", row["importance_score"], f["importance_score"]),
            ("pinned", row["pinned"], f["pinned"]),
            ("metadata", row["metadata"], f["metadata"]),
        )
        if old != new
    )
    if memory.content == row["content"]:
        if not changed:
            return UpdateResult(memory_id, "unchanged")
        yield Sql(
            _IN_PLACE_SQL, {**f, "metadata": Jsonb(f["metadata"]), "id": memory_id, "now": now}, "rowcount"
        )
        yield event(
            memory_id, user, EventType.UPDATED, actor, now, {"reason": "update", "fields": list(changed)}
        )
        return UpdateResult(memory_id, "updated", None, changed)
    if embedding is None:
        raise InvalidInputError("content", memory.content, "changed text needs its embedding")
    change = lexical_change(row["content"], memory.content)
    duplicate = yield Sql(
        _LIVE_DUPLICATE_SQL,
        {"user_id": user, "id": memory_id, "key": memory.dedupe_key, "sha": sha256_hex(memory.content)},
        "one",
    )
    if duplicate is not None:  # the new text is another live memory already: that one is the new version
        new_id = duplicate["id"]
        yield from touch(memory, [new_id], now)
    else:
        shape = yield from checked_shape_plan(int(np.asarray(embedding).size), embedding_model)
        valid = validate_memory(
            f | {"embedding": embedding, "embedding_model": embedding_model},
            dim=int(shape["dim"]),
            embedding_model=shape["model"] or embedding_model,
        )
        if shape["model"] is None:  # as write_path._start: bound once
            yield Sql(BIND_MODEL_SQL, {"model": embedding_model}, "rowcount")
        new_id = valid.id
        # Supersede first: the new version may share the old one's dedupe key (a change of case only),
        # and only one live memory may hold a key.
        yield Sql(
            SUPERSEDE_SQL, {"user_id": user, "old_id": memory_id, "new_id": new_id, "now": now}, "rowcount"
        )
        yield from insert(valid, memory, actor, now, pinned=valid.pinned, supersedes=memory_id)
    if duplicate is not None:
        yield Sql(
            SUPERSEDE_SQL, {"user_id": user, "old_id": memory_id, "new_id": new_id, "now": now}, "rowcount"
        )
    yield event(
        memory_id,
        user,
        EventType.SUPERSEDED,
        actor,
        now,
        {
            "superseded_by": str(new_id),
            "reason": "update",
            "removed": list(change.removed),
            "added": list(change.added),
        },
    )
    return UpdateResult(new_id, "superseded", memory_id, ("content", *changed))


def check_update_args(changes: dict[str, Any]) -> None:
    if all(v is UNSET for v in changes.values()):
        raise InvalidInputError("update", None, f"nothing to change: pass one of {', '.join(UPDATE_FIELDS)}")


def prepare_update(
    row: dict[str, Any], changes: dict[str, Any], *, allow_secrets: object, secret_policy: Any
) -> PreparedMemory:
    """The updated memory validated like an add (write_path.prepare_memory). Unchanged text is not
    re-checked for secrets: it was stored already (perhaps with allow_secrets)."""
    merged = merged_fields(row, changes)
    new_text = changes["content"] is not UNSET
    return prepare_memory(
        row["user_id"],
        merged["content"],
        category=merged["category"],
        domain=merged["domain"],
        importance=merged["importance"],
        tags=merged["tags"],
        metadata=merged["metadata"],
        pinned=merged["pinned"],
        entity_links=merged["entity_links"],
        allow_secrets=allow_secrets if new_text else True,
        secret_policy=secret_policy,
    )
