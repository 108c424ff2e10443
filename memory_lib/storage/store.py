"""Writing and reading hot memories, with validation and audit events."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.errors import EmbeddingMismatchError, InvalidInputError, NotFoundError, embedding_mismatch_reason
from ..core.models import NewMemory, sha256_hex, validate_memory
from ..core.rows import Conn, Row
from ..core.statuses import EventType
from . import events
from .db import stored_embedding_dim
from .space import LOCK_VECTOR_TABLES

MEMORY_COLUMNS = (
    "id, user_id, content, content_sha256, embedding, embedding_model, embedding_dim, entity_links, "
    "metadata, domain, category, importance_score, access_count, last_accessed_at, created_at, "
    "updated_at, pinned, superseded_by, dedupe_key"
)
_COPY_COLUMNS = [c.strip() for c in MEMORY_COLUMNS.split(",")]
_COPY_TYPES = [
    "uuid",
    "text",
    "text",
    "text",
    "vector",
    "text",
    "int4",
    "uuid[]",
    "jsonb",
    "text",
    "text",
    "float8",
    "int4",
    "timestamptz",
    "timestamptz",
    "timestamptz",
    "bool",
    "uuid",
    "text",
]


@dataclass(frozen=True)
class StoreShape:
    """What every embedding in this database must look like."""

    dim: int
    embedding_model: str | None


# The 'created' event of each memory a bulk store wrote (its category in the details).
_CREATED_EVENTS_SQL = events.insert_select(
    "SELECT id AS memory_id, user_id, jsonb_build_object('category', category) AS details"
    " FROM memories WHERE user_id = ANY(%(users)s) AND id = ANY(%(ids)s)"
)


def store_shape(conn: Conn) -> StoreShape:
    row = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_model'").fetchone()
    return StoreShape(stored_embedding_dim(conn), row["value"] if row else None)


def bind_embedding_model(conn: Conn, model: str) -> StoreShape:
    """Record the embedding model on first use; afterwards a different model is refused."""
    conn.execute(
        "INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_model', %s) ON CONFLICT DO NOTHING",
        (model,),
    )
    shape = store_shape(conn)
    if shape.embedding_model != model:
        raise EmbeddingMismatchError(
            "embedding_model",
            model,
            embedding_mismatch_reason(shape.embedding_model, shape.dim, model, shape.dim),
        )
    return shape


def insert_memories(
    conn: Conn,
    memories: Iterable[NewMemory | dict[str, Any]],
    *,
    actor: str,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    """Validate every memory first, then write them all in one transaction with 'created' events.

    Any invalid memory (or actor, or now) raises InvalidInputError naming the field (a note on the
    error says which memory: "in memories[3]") before anything is written. So does an id given twice,
    or already a memory's (hot, or archived as original_id).
    """
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    now = validation.optional_timestamp("now", now) or datetime.now(UTC)
    if isinstance(memories, (str, bytes, Mapping, NewMemory)) or not isinstance(memories, Iterable):
        raise InvalidInputError("memories", memories, "must be a sequence of NewMemory or mappings")
    items = list(memories)
    if not items:
        return []
    shape = store_shape(conn)
    first = items[0]
    first_model = (
        first.embedding_model
        if isinstance(first, NewMemory)
        else (first.get("embedding_model") if isinstance(first, Mapping) else None)
    )
    expected_model = shape.embedding_model or first_model
    valid = [_validate_at(i, m, shape, expected_model) for i, m in enumerate(items)]
    positions = _unique_ids(valid)
    with conn.transaction():
        # The space checked above must still be the active one (a re-embedding flip may have committed
        # since): lock the vector tables, then read it again (search.LOCK_VECTOR_TABLES).
        conn.execute(LOCK_VECTOR_TABLES.query)
        current = store_shape(conn)
        if current != shape and shape.embedding_model is not None:
            raise EmbeddingMismatchError(
                "embedding_model",
                valid[0].embedding_model,
                embedding_mismatch_reason(
                    current.embedding_model, current.dim, valid[0].embedding_model, shape.dim
                ),
            )
        ids = [m.id for m in valid]
        _refuse_taken_ids(conn, ids, positions)
        bind_embedding_model(conn, valid[0].embedding_model)
        try:
            with (
                conn.cursor() as cur,
                cur.copy(
                    f"COPY memories ({', '.join(_COPY_COLUMNS)}) FROM STDIN WITH (FORMAT BINARY)"
                ) as copy,
            ):
                copy.set_types(_COPY_TYPES)
                for m in valid:
                    copy.write_row(_copy_row(m, shape.dim, now))
        except (psycopg.errors.UniqueViolation, psycopg.errors.InternalError) as exc:
            # a concurrent insert of the same id committed first
            if not _violates_memories_key(exc):
                raise
            raise _taken_id_error(exc, positions) from None
        conn.execute(
            _CREATED_EVENTS_SQL,
            events.event_params(EventType.CREATED, actor, None)
            | {"users": sorted({m.user_id for m in valid}), "ids": ids},
        )
    return ids


def _validate_at(index: int, memory: object, shape: StoreShape, model: str | None) -> NewMemory:
    try:
        return validate_memory(memory, dim=shape.dim, embedding_model=model)  # type: ignore[arg-type]
    except InvalidInputError as exc:
        exc.add_note(f"in memories[{index}]")
        raise


def _unique_ids(valid: Sequence[NewMemory]) -> dict[uuid.UUID, int]:
    """id -> its position in `memories`; one id twice in a call is refused."""
    positions: dict[uuid.UUID, int] = {}
    for i, m in enumerate(valid):
        if m.id in positions:
            error = InvalidInputError(
                "id", m.id, f"memories[{i}] has the same id as memories[{positions[m.id]}]"
            )
            error.add_note(f"in memories[{i}]")
            raise error
        positions[m.id] = i
    return positions


def _refuse_taken_ids(conn: Conn, ids: list[uuid.UUID], positions: Mapping[uuid.UUID, int]) -> None:
    """An id is one memory's, hot or archived (archived_memories.original_id), for good."""
    row = conn.execute(
        """SELECT id, 'a hot memory' AS tier FROM memories WHERE id = ANY(%(ids)s)
           UNION ALL SELECT original_id, 'an archived memory' FROM archived_memories WHERE original_id = ANY(%(ids)s)
           LIMIT 1""",
        {"ids": ids},
    ).fetchone()
    if row is not None:
        i = positions[row["id"]]
        error = InvalidInputError(
            "id", row["id"], f"memories[{i}] has the id of {row['tier']} already stored"
        )
        error.add_note(f"in memories[{i}]")
        raise error


# The key of memories, of a partition when the table is partitioned by user (memories_p003_pkey), or of
# a Citus shard (memories_pkey_102034).
_MEMORIES_KEY = re.compile(r"memories(_p\d{3})?_pkey(_\d+)?")
_UNIQUE_MESSAGE = re.compile(r'duplicate key value violates unique constraint "([^"]+)"')


def _violates_memories_key(exc: psycopg.Error) -> bool:
    """A unique violation of memories' key. Citus relays a worker's COPY error as an internal error
    (SQLSTATE XX000) with the worker's message, so the constraint is read from the message there."""
    name = exc.diag.constraint_name
    if name is None and isinstance(exc, psycopg.errors.InternalError):
        found = _UNIQUE_MESSAGE.match(exc.diag.message_primary or "")
        name = found.group(1) if found else None
    return _MEMORIES_KEY.fullmatch(name or "") is not None


def _taken_id_error(exc: psycopg.Error, positions: Mapping[uuid.UUID, int]) -> InvalidInputError:
    detail = exc.diag.message_detail or str(exc)
    found = re.search(r"\(id(?:, user_id)?\)=\(([0-9a-f-]{36})[,)]", detail)
    taken = uuid.UUID(found.group(1)) if found else None
    at = positions.get(taken) if taken is not None else None
    where = f"memories[{at}]" if at is not None else "a memory of this call"
    error = InvalidInputError("id", taken, f"{where} has the id of a hot memory stored meanwhile")
    if at is not None:
        error.add_note(f"in memories[{at}]")
    return error


def _copy_row(m: NewMemory, dim: int, now: datetime) -> tuple[Any, ...]:
    created = m.created_at or now
    return (
        m.id,
        m.user_id,
        m.content,
        sha256_hex(m.content),
        m.embedding,
        m.embedding_model,
        dim,
        m.entity_links,
        Jsonb(m.metadata),
        m.domain,
        m.category,
        m.importance_score,
        m.access_count,
        m.last_accessed_at,
        created,
        created,
        m.pinned,
        None,
        None,
    )


def get_memory(conn: Conn, user_id: str, memory_id: uuid.UUID) -> Row:
    user_id = validation.user(user_id)
    memory_id = validation.uuid_value("memory_id", memory_id)
    row = conn.execute(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE user_id = %s AND id = %s", (user_id, memory_id)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no hot memory id={memory_id} for user_id={user_id!r}")
    return row


# The row version: any UPDATE gives the row a new xmin (archive.backup_still_matches relies on it).
ROW_XMIN = "xmin::text::bigint AS row_xmin"


def fetch_memories(
    conn: Conn, ids: Sequence[uuid.UUID], *, users: Iterable[str] | None = None, with_xmin: bool = False
) -> dict[uuid.UUID, Row]:
    """Hot rows by id (of these users, when given), in binary (vectors as float32 bytes, not text to
    parse); `with_xmin` adds `row_xmin`, the row version. The pipeline names the users: the read then
    stays on their shards (docs/how-to/distributed-postgres.md)."""
    cols = f"{MEMORY_COLUMNS}, {ROW_XMIN}" if with_xmin else MEMORY_COLUMNS
    params: tuple[Any, ...]
    if users is None:
        sql, params = f"SELECT {cols} FROM memories WHERE id = ANY(%s)", (list(ids),)
    else:
        sql = f"SELECT {cols} FROM memories WHERE user_id = ANY(%s) AND id = ANY(%s)"
        params = (sorted(set(users)), list(ids))
    rows = conn.execute(sql, params, binary=True).fetchall()
    return {r["id"]: r for r in rows}


@dataclass(frozen=True)
class TierStats:
    hot: int
    archived: int
    hot_bytes: int
    archived_bytes: int

    @property
    def total(self) -> int:
        return self.hot + self.archived


def _table_bytes_sql(table: str) -> str:
    """SQL for a tier table's bytes on disk: its partitions' (a partitioned table has no storage of its
    own), or, for a plain table, which has no partition tree, its own."""
    return (
        f"(SELECT coalesce(sum(pg_total_relation_size(relid)), pg_total_relation_size('{table}'))::bigint"
        f" FROM pg_partition_tree('{table}'))"
    )


def tier_stats(conn: Conn, user_id: str | None = None) -> TierStats:
    """Row counts per tier and each table's bytes on disk (heap + TOAST + indexes), summed over its
    partitions when the tiers are partitioned (a partitioned table has no storage of its own)."""
    if user_id is not None:
        user_id = validation.user(user_id)
    where = "WHERE user_id = %(u)s" if user_id else ""
    row = conn.execute(
        f"""SELECT (SELECT count(*) FROM memories {where}) AS hot,
                   (SELECT count(*) FROM archived_memories {where}) AS archived,
                   {_table_bytes_sql("memories")} AS hot_bytes,
                   {_table_bytes_sql("archived_memories")} AS archived_bytes""",
        {"u": user_id},
    ).fetchone()
    assert row is not None  # a SELECT without FROM returns exactly one row
    return TierStats(**row)
