"""Re-embedding migrations: a new embedder, model and/or dimension, without
downtime. Dual write, backfill, atomic flip, flip back, drop.

Design, and why:
- A second set of columns beside each vector (`embedding_next`, `summary_bits_next`, their model and dim
  columns, see VECTOR_GROUPS) sized for the target, on every table holding vectors of the embedding
  space: memories, archived_memories (bits, written from the summary text), memory_digests, memory_facts,
  and archival_attempts (the archive run's checkpoint of summary embeddings). `start` adds them (catalog
  only, instant) and records the migration in `embedding_migrations` (sql/017).
- The flip swaps column NAMES in one transaction (embedding -> embedding_prev, embedding_next ->
  embedding, ...), with the settings row (embedding_model, embedding_dim). Every reader and writer keeps
  using `embedding` and never needs to know a migration exists; an old reader cannot mix spaces because
  the space check (search.checked_shape_plan) reads the settings after taking ACCESS SHARE locks on the
  vector tables (search.LOCK_VECTOR_TABLES): it waits for a flip in progress and then sees the flip's
  settings and columns together (LOCK takes no snapshot, so a REPEATABLE READ search's snapshot is taken
  after the lock: the documented idiom). A flip back is the same swap the other way.
- The secondary columns (`_next` while running, `_prev` once flipped) are kept valid by two rules:
  (1) a BEFORE UPDATE trigger per table (`<table>_reembed_guard`) clears a row's secondary vector when
  its active vector changes without the secondary being written in the same statement, so a secondary
  vector never describes old content; (2) every row whose secondary model column is NULL is "pending"
  and the backfill (`backfill_batch`) fills it. Dual write (`fill_plan`, run by the clients after a
  write) is an optimization: rows written without it are picked up by the backfill, so correctness
  never depends on a client knowing about the migration. While flipped the secondary is the OLD space,
  still backfilled and dual-written with the source embedder: that is what makes a flip back lossless.
- The HNSW index of a secondary vector column is built CONCURRENTLY by `ensure_indexes` (the flip
  calls it before locking), not during the backfill. Measured (8k hot rows, hashing 384 -> 256-d, 2
  shared cores): backfill 25 s + build 5 s with the index built after, against 78 s for the backfill
  with the index present from the start (each UPDATE then also inserts into the new graph).
- The flip refuses (ReembeddingError naming each table's uncovered row count) unless coverage is full,
  and refuses while an archival run holds summary embeddings of the old space in open checkpoints.
- Migrations are rendered with the embedding dim ({{EMBEDDING_DIM}}): after a flip to another dim, the
  recorded checksums are re-rendered for it (db.rerender_migration_checksums), so `migrate` keeps working.

Costs: the backfill updates every row once (new row versions: an archival run in progress re-backs up a
memory the backfill touched, which is correct but costs a PUT; a non-HOT update also re-inserts the row
into the table's existing indexes, the old HNSW graph included: ~300 rows/s measured on 2 cores with a
cheap embedder, the UPDATE taking ~80% of it), the flip scans each table once under an ACCESS EXCLUSIVE
lock (coverage count and SET NOT NULL; 0.15 s for 20k rows), and `drop_old` is catalog only (the dropped
columns' bytes are reclaimed as rows are rewritten, or by VACUUM FULL / pg_repack).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import psycopg

from ..core import validation
from ..core.config import EmbeddingConfig, Settings
from ..core.errors import EmbeddingMismatchError, InvalidInputError, MemoryArchiveError
from ..core.plans import Call, Flow, Plan, RunPlan, Sql, drive, drive_async, query_vector, run_plan_async
from ..core.rows import AsyncConn, Conn, Row
from ..llm.embedding import (
    LOCAL_MODEL_DIM,
    LOCAL_MODEL_NAME,
    Embedder,
    HashingEmbedder,
    LocalEmbedder,
    embedder_from_settings,
)
from ..storage import partitioning
from ..storage.db import rerender_migration_checksums

__all__ = [
    "KINDS",
    "Migration",
    "ReembeddingError",
    "abort",
    "active_migration",
    "backfill_batch",
    "coverage",
    "drop_old",
    "embedder_for",
    "ensure_indexes",
    "fill_flow",
    "flip",
    "flip_back",
    "start",
]

Kind = Literal["hot", "archived", "digests", "facts"]
KINDS: tuple[Kind, ...] = ("hot", "archived", "digests", "facts")
HNSW_MAX_VECTOR_DIM = 2000  # pgvector's HNSW limit for `vector` columns


class ReembeddingError(MemoryArchiveError):
    """A re-embedding step that cannot run in the current state (the message says why and what to do)."""


@dataclass(frozen=True)
class _Col:
    name: str
    type: str  # {dim} is the migration's dimension
    not_null: bool


@dataclass(frozen=True)
class _Group:
    """One table's vector and the columns that travel with it."""

    table: str
    kind: Kind | None  # None: not backfilled (archival checkpoints are refused at flip instead)
    vector: str  # the column whose change invalidates the secondary (the guard trigger)
    model: str  # NULL in the secondary = pending
    cols: tuple[_Col, ...]
    text: str = "NULL"  # SQL giving the text to embed
    needs_vector: str = "true"  # rows that get a vector (archive stubs only get the model)
    index: str | None = None  # the HNSW index method/opclass of the vector column


VECTOR_GROUPS: tuple[_Group, ...] = (
    _Group(
        "memories",
        "hot",
        "embedding",
        "embedding_model",
        (
            _Col("embedding", "vector({dim})", True),
            _Col("embedding_model", "text", True),
            _Col("embedding_dim", "integer", True),
        ),
        text="content",
        index="hnsw ({col} vector_cosine_ops) WITH (m = 16, ef_construction = 64)",
    ),
    _Group(
        "archived_memories",
        "archived",
        "summary_bits",
        "summary_embedding_model",
        (
            _Col("summary_bits", "bit({dim})", False),
            _Col("summary_embedding", "halfvec({dim})", False),
            _Col("summary_embedding_model", "text", True),
        ),
        text="summary",
        needs_vector="summary_bits IS NOT NULL",
        index="hnsw ({col} bit_hamming_ops) WITH (m = 16, ef_construction = 64)",
    ),
    _Group(
        "memory_digests",
        "digests",
        "embedding",
        "embedding_model",
        (_Col("embedding", "vector({dim})", True), _Col("embedding_model", "text", True)),
        text="summary",
    ),
    _Group(
        "memory_facts",
        "facts",
        "embedding",
        "embedding_model",
        (_Col("embedding", "vector({dim})", True), _Col("embedding_model", "text", True)),
        text="subject || ' ' || predicate || ' ' || object",
    ),
    _Group(
        "archival_attempts",
        None,
        "summary_embedding",
        "summary_embedding_model",
        (_Col("summary_embedding", "halfvec({dim})", False), _Col("summary_embedding_model", "text", False)),
    ),
)
_BY_KIND = {g.kind: g for g in VECTOR_GROUPS if g.kind is not None}
_LOCK_ALL = "LOCK TABLE " + ", ".join(g.table for g in VECTOR_GROUPS) + " IN ACCESS EXCLUSIVE MODE"


def _lock_all(conn: Conn, timeout: str = "30s") -> None:
    """ACCESS EXCLUSIVE on every vector table, for this transaction. Waiting behind a long transaction
    would queue every search behind this lock: give up after `timeout` instead (retry later)."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
    conn.execute(_LOCK_ALL)


@dataclass(frozen=True)
class Migration:
    id: int
    source_model: str
    source_dim: int
    target_model: str
    target_dim: int
    state: str
    started_at: datetime
    flipped_at: datetime | None
    flips: int

    @property
    def open(self) -> bool:
        return self.state in ("running", "flipped")

    @property
    def suffix(self) -> str:
        """The secondary columns' suffix: `_next` (target) while running, `_prev` (source) once flipped."""
        return "_next" if self.state == "running" else "_prev"

    @property
    def secondary(self) -> tuple[str, int]:
        """(model, dim) the secondary columns hold: the target while running, the source once flipped."""
        if self.state == "running":
            return self.target_model, self.target_dim
        return self.source_model, self.source_dim

    @property
    def active(self) -> tuple[str, int]:
        if self.state == "flipped":
            return self.target_model, self.target_dim
        return self.source_model, self.source_dim

    def dim_of(self, suffix: str) -> int:
        return self.target_dim if suffix == "_next" else self.source_dim


_MIGRATION_SQL = """SELECT id, source_model, source_dim, target_model, target_dim, state, started_at, flipped_at,
                           flips FROM embedding_migrations"""


def active_migration(conn: Conn, *, for_update: bool = False) -> Migration | None:
    """The open (running or flipped) migration, or None."""
    row = conn.execute(
        f"{_MIGRATION_SQL} WHERE state IN ('running', 'flipped'){' FOR UPDATE' if for_update else ''}"
    ).fetchone()
    return None if row is None else Migration(**row)


def _latest(conn: Conn) -> Migration | None:
    row = conn.execute(f"{_MIGRATION_SQL} ORDER BY id DESC LIMIT 1").fetchone()
    return None if row is None else Migration(**row)


# --------------------------------------------------------------------------- embedders by name


@functools.lru_cache(maxsize=8)
def _cached_embedder(model: str, dim: int, embedding: EmbeddingConfig) -> Embedder:
    if model == LOCAL_MODEL_NAME:
        return LocalEmbedder(model)
    if model == HashingEmbedder(dim).model:
        return HashingEmbedder(dim)
    # Any other name is an OpenAI(-compatible) model: the key and base URL of the configured embedding.
    cfg = embedding.model_copy(update={"provider": "openai", "openai_model": model, "dim": dim})
    return embedder_from_settings(cfg)


def embedder_for(model: str, dim: int, embedding: EmbeddingConfig | None = None) -> Embedder:
    """The embedder a recorded (model, dim) names: the packaged local model, the hashing embedder of that
    dim, or else an OpenAI model with the base URL of `embedding` (the caller's settings; None: the
    environment's, for an entry point that has no settings object) and OPENAI_API_KEY. Cached per
    process and configuration."""
    return _cached_embedder(model, dim, Settings.from_env().embedding if embedding is None else embedding)


def _check_embedder(embedder: Embedder, model: str, dim: int, what: str) -> None:
    if embedder.model != model or embedder.dim != dim:
        raise EmbeddingMismatchError(
            "embedder",
            f"{embedder.model} ({embedder.dim}-d)",
            f"the {what} columns hold {model!r} ({dim}-d) vectors",
        )


# --------------------------------------------------------------------------- start / abort


def _guard_sql(g: _Group, suffix: str) -> str:
    clear = " ".join(f"NEW.{c.name}{suffix} := NULL;" for c in g.cols)
    return f"""
        CREATE OR REPLACE FUNCTION {g.table}_reembed_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            -- A secondary vector is valid only for the content its active twin was made from.
            IF NEW.{g.vector} IS DISTINCT FROM OLD.{g.vector}
               AND NEW.{g.vector}{suffix} IS NOT DISTINCT FROM OLD.{g.vector}{suffix} THEN
                {clear}
            END IF;
            RETURN NEW;
        END $fn$;
        DROP TRIGGER IF EXISTS {g.table}_reembed_guard ON {g.table};
        CREATE TRIGGER {g.table}_reembed_guard BEFORE UPDATE ON {g.table}
            FOR EACH ROW EXECUTE FUNCTION {g.table}_reembed_guard();"""


def _drop_guards_sql() -> str:
    return "".join(
        f"DROP TRIGGER IF EXISTS {g.table}_reembed_guard ON {g.table}; "
        f"DROP FUNCTION IF EXISTS {g.table}_reembed_guard();"
        for g in VECTOR_GROUPS
    )


def start(conn: Conn, target_model: str, target_dim: int, *, actor: str) -> Migration:
    """Start re-embedding into (target_model, target_dim): record it and add the `_next` columns.

    Refused when a migration is open, when the target is the active space, or when no embedding model
    is recorded yet (an empty database just changes its settings). Catalog-only DDL: instant."""
    target_model = validation.text("target_model", target_model, max_chars=validation.MAX_LABEL_CHARS)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    if (
        isinstance(target_dim, bool)
        or not isinstance(target_dim, int)
        or not 1 <= target_dim <= HNSW_MAX_VECTOR_DIM
    ):
        raise InvalidInputError(
            "target_dim", target_dim, f"must be an integer from 1 to {HNSW_MAX_VECTOR_DIM} (HNSW)"
        )
    if target_model == LOCAL_MODEL_NAME and target_dim != LOCAL_MODEL_DIM:
        raise InvalidInputError(
            "target_dim", target_dim, f"{LOCAL_MODEL_NAME} makes {LOCAL_MODEL_DIM}-d vectors"
        )
    if target_model.startswith("hashing-lexical-") and target_model != HashingEmbedder(target_dim).model:
        raise InvalidInputError(
            "target_model",
            target_model,
            f"the {target_dim}-d hashing embedder is {HashingEmbedder(target_dim).model!r}",
        )
    with conn.transaction():
        _lock_all(conn)
        settings = {
            r["key"]: r["value"]
            for r in conn.execute(
                "SELECT key, value FROM memory_archive_settings WHERE key IN ('embedding_model', 'embedding_dim')"
            )
        }
        if "embedding_model" not in settings:
            raise ReembeddingError(
                "no embedding model is recorded in this database yet: nothing to re-embed (set the new embedder)"
            )
        source_model, source_dim = settings["embedding_model"], int(settings["embedding_dim"])
        if (source_model, source_dim) == (target_model, target_dim):
            raise InvalidInputError(
                "target_model", target_model, f"is already the active space ({source_dim}-d)"
            )
        open_ = active_migration(conn)
        if open_ is not None:
            raise ReembeddingError(
                f"re-embedding {open_.id} ({open_.source_model} -> {open_.target_model}) is {open_.state}: "
                "finish it (drop_old) or abort it first"
            )
        row = conn.execute(
            """INSERT INTO embedding_migrations (source_model, source_dim, target_model, target_dim, started_by)
               VALUES (%s, %s, %s, %s, %s) RETURNING id""",
            (source_model, source_dim, target_model, target_dim, actor),
        ).fetchone()
        assert row is not None  # INSERT ... RETURNING returns the inserted row
        mid = row["id"]
        for g in VECTOR_GROUPS:
            adds = ", ".join(f"ADD COLUMN {c.name}_next {c.type.format(dim=target_dim)}" for c in g.cols)
            conn.execute(f"ALTER TABLE {g.table} {adds}")
        conn.execute(
            f"ALTER TABLE memories ADD CONSTRAINT memories_embedding_dim_m{mid}_check "
            f"CHECK (embedding_dim_next = {target_dim})"
        )
        # 007's rule for the write-only halfvec: never kept at rest (the bits are).
        conn.execute(
            f"ALTER TABLE archived_memories ADD CONSTRAINT archived_summary_embedding_m{mid}_not_kept "
            "CHECK (summary_embedding_next IS NULL)"
        )
        for g in VECTOR_GROUPS:
            if g.kind is not None:
                conn.execute(_guard_sql(g, "_next"))
        migration = active_migration(conn)
    assert migration is not None
    return migration


def abort(conn: Conn, *, actor: str) -> Migration:
    """Give up a running (not flipped) migration: drop the `_next` columns; the active space is untouched."""
    return _close(conn, actor, state="running", what="abort", suffix="_next", final="aborted")


def _close(conn: Conn, actor: str, *, state: str, what: str, suffix: str, final: str) -> Migration:
    """End the open migration (abort, drop_old): drop the `suffix` columns, record `final`, one transaction."""
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    with conn.transaction():
        _lock_all(conn)
        m = _require(conn, state, what)
        _drop_secondary(conn, suffix)
        conn.execute(
            """UPDATE embedding_migrations SET state = %s, finished_at = now(), finished_by = %s
               WHERE id = %s""",
            (final, actor, m.id),
        )
    return _by_id(conn, m.id)


def _in_state(m: Migration | None, state: str, what: str, *, missing: str) -> Migration:
    if m is None:
        raise ReembeddingError(missing)
    if m.state != state:
        raise ReembeddingError(f"re-embedding {m.id} is {m.state}: {what} needs it {state}")
    return m


def _require(conn: Conn, state: str, what: str) -> Migration:
    return _in_state(
        active_migration(conn, for_update=True),
        state,
        what,
        missing=f"no re-embedding is open: nothing to {what}",
    )


def _by_id(conn: Conn, mid: int) -> Migration:
    row = conn.execute(f"{_MIGRATION_SQL} WHERE id = %s", (mid,)).fetchone()
    assert row is not None  # `mid` was just read; migrations are never deleted
    return Migration(**row)


def _drop_secondary(conn: Conn, suffix: str) -> None:
    conn.execute(_drop_guards_sql())
    for g in VECTOR_GROUPS:
        drops = ", ".join(f"DROP COLUMN {c.name}{suffix}" for c in g.cols)
        conn.execute(f"ALTER TABLE {g.table} {drops}")


# --------------------------------------------------------------------------- backfill and dual write


def _bucket_filter(bucket: int | None, buckets: int | None) -> str:
    if bucket is None:
        return ""
    return "AND (hashtext(id::text) & 2147483647) %% %(buckets)s = %(bucket)s"


def _vector_text(v: np.ndarray) -> str:
    # repr of the float64 of each float32 round-trips exactly.
    return "[" + ",".join(repr(float(x)) for x in v) + "]"


def _write_sql(g: _Group, suffix: str, dim: int) -> str:
    if g.kind == "hot":
        sets = (
            f"embedding{suffix} = v.vec::vector({dim}), embedding_model{suffix} = %(model)s, "
            f"embedding_dim{suffix} = {dim}"
        )
    elif g.kind == "archived":
        # 007's representation: one bit per dimension (the sign); a stub gets no bits, only the model.
        sets = (
            f"summary_bits{suffix} = binary_quantize(v.vec::vector({dim}))::bit({dim}), "
            f"summary_embedding_model{suffix} = %(model)s"
        )
    else:
        sets = f"embedding{suffix} = v.vec::vector({dim}), embedding_model{suffix} = %(model)s"
    # Embedded outside the transaction (memory_lib.core.locks): a row is written only if still pending
    # and its text and stub state still the ones embedded, else it stays pending for the next batch.
    return f"""UPDATE {g.table} t SET {sets}
               FROM unnest(%(ids)s::uuid[], %(vecs)s::text[], %(texts)s::text[], %(needs)s::boolean[])
                    AS v(vid, vec, vtext, vneeds)
               WHERE t.id = v.vid AND t.{g.model}{suffix} IS NULL
                 AND ({g.text}) IS NOT DISTINCT FROM v.vtext AND ({g.needs_vector}) = v.vneeds"""


# FOR SHARE: a flip (FOR UPDATE of this row, then the tables) waits for a batch holding it, or the batch
# sees the flip and stops: the column names a batch uses are the ones of the state it read.
_STATE_READ_SQL = "SELECT state FROM embedding_migrations WHERE id = %(id)s"
_STATE_SQL = _STATE_READ_SQL + " FOR SHARE"


def _check_state(m: Migration, row: Row | None) -> None:
    if row is None or row["state"] != m.state:
        raise ReembeddingError(
            f"re-embedding {m.id} changed state ({m.state} -> {row and row['state']}): retry"
        )


def _pending_sql(g: _Group, suffix: str, where: str) -> str:
    # No row lock: the rows are embedded after this transaction ends (memory_lib.core.locks), and the
    # write re-checks them (_write_sql). Two workers on the same rows may both embed them; one writes.
    return f"""SELECT id, {g.text} AS text, {g.needs_vector} AS needs_vector FROM {g.table}
               WHERE {g.model}{suffix} IS NULL {where}
               ORDER BY id LIMIT %(limit)s"""


def _pending_plan(m: Migration, g: _Group, where: str, params: dict[str, Any], limit: int) -> Plan[list[Row]]:
    _check_state(m, (yield Sql(_STATE_READ_SQL, {"id": m.id}, "one")))
    return (yield Sql(_pending_sql(g, m.suffix, where), params | {"limit": limit}))


def _embed_rows(embedder: Embedder, m: Migration, rows: Sequence[Row]) -> list[str | None]:
    """The secondary vector (as text) of each row that gets one, None for the others (archive stubs)."""
    model, dim = m.secondary
    _check_embedder(embedder, model, dim, f"{m.suffix} (re-embedding {m.id})")
    todo = [r for r in rows if r["needs_vector"]]
    vectors = embedder.embed([r["text"] for r in todo]) if todo else np.zeros((0, dim), np.float32)
    by_id: dict[uuid.UUID, str | None] = {r["id"]: None for r in rows}
    for r, v in zip(todo, vectors, strict=True):
        by_id[r["id"]] = _vector_text(query_vector(v, dim))
    return [by_id[r["id"]] for r in rows]


def _write_plan(m: Migration, g: _Group, rows: Sequence[Row], vecs: Sequence[str | None]) -> Plan[int]:
    """Write the embedded rows still as they were read (_write_sql), under the migration row's share
    lock (_STATE_SQL): a flip waits for it, or it sees the flip and writes nothing."""
    _check_state(m, (yield Sql(_STATE_SQL, {"id": m.id}, "one")))
    params = {
        "ids": [r["id"] for r in rows],
        "vecs": list(vecs),
        "texts": [r["text"] for r in rows],
        "needs": [bool(r["needs_vector"]) for r in rows],
        "model": m.secondary[0],
    }
    return (yield Sql(_write_sql(g, m.suffix, m.secondary[1]), params, "rowcount"))


def _fill_flow(
    m: Migration, g: _Group, embedder: Embedder, where: str, params: dict[str, Any], limit: int
) -> Flow[int]:
    """Read up to `limit` pending rows, embed them with no transaction open, write them in one UPDATE
    that skips any row changed meanwhile. A crash loses only the embedding work of this batch."""
    rows = yield RunPlan(_pending_plan(m, g, where, params, limit))
    if not rows:
        return 0
    vecs = yield Call(functools.partial(_embed_rows, embedder, m, rows))
    return (yield RunPlan(_write_plan(m, g, rows, vecs)))


def fill_flow(migration: Migration, kind: Kind, ids: Sequence[uuid.UUID], embedder: Embedder) -> Flow[int]:
    """Dual write as a flow (both clients drive it): fill the secondary columns of just-written rows
    `ids` that are still pending, embedded by `embedder` (the secondary space's). The same statements
    as a backfill batch, for a few rows."""
    return _fill_flow(
        migration, _group(kind), embedder, "AND id = ANY(%(ids)s)", {"ids": list(ids)}, len(ids)
    )


def _fill(
    conn: Conn,
    g: _Group,
    m: Migration,
    embedder: Embedder,
    where: str,
    params: dict[str, Any],
    limit: int,
) -> int:
    _check_embedder(embedder, *m.secondary, f"{m.suffix} (re-embedding {m.id})")
    return drive(conn, _fill_flow(m, g, embedder, where, params, limit))


def backfill_batch(
    conn: Conn,
    embedder: Embedder,
    kind: Kind,
    limit: int = 256,
    *,
    bucket: int | None = None,
    buckets: int | None = None,
) -> int:
    """Fill the secondary columns of up to `limit` pending rows of `kind` (in `bucket` of `buckets` by a
    stable hash of the id, when given); returns how many. 0: nothing left (in that bucket). Idempotent
    and crash-safe: a row is pending until its write commits; concurrent workers skip locked rows.
    `embedder` must be the secondary space's (the target while running, the source once flipped)."""
    g = _group(kind)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError("limit", limit, "must be a positive integer")
    if bucket is not None and (buckets is None or not 0 <= bucket < buckets):
        raise InvalidInputError("bucket", bucket, f"must be in [0, buckets={buckets})")
    m = active_migration(conn)
    if m is None:
        return 0
    return _fill(
        conn, g, m, embedder, _bucket_filter(bucket, buckets), {"bucket": bucket, "buckets": buckets}, limit
    )


def _group(kind: object) -> _Group:
    if kind not in _BY_KIND:
        raise InvalidInputError("kind", kind, f"must be one of {list(KINDS)}")
    return _BY_KIND[kind]


def pending(conn: Conn, kind: Kind, *, bucket: int | None = None, buckets: int | None = None) -> int:
    """Rows of `kind` (in `bucket`) whose secondary columns are not filled yet; 0 without a migration."""
    g = _group(kind)
    m = active_migration(conn)
    if m is None:
        return 0
    row = conn.execute(
        f"SELECT count(*) AS n FROM {g.table} WHERE {g.model}{m.suffix} IS NULL {_bucket_filter(bucket, buckets)}",
        {"bucket": bucket, "buckets": buckets},
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return row["n"]


def coverage(conn: Conn) -> dict[str, int]:
    """Pending (uncovered) rows per table of the open migration's secondary columns; {} without one."""
    m = active_migration(conn)
    if m is None:
        return {}
    return {_BY_KIND[k].table: pending(conn, k) for k in KINDS}


# --------------------------------------------------------------------------- indexes


def _index_name(g: _Group, m: Migration) -> str:
    return f"{g.table}_{g.vector}_m{m.id}_hnsw"


def ensure_indexes(conn: Conn) -> list[str]:
    """Build the HNSW index of each secondary vector column that lacks one, CONCURRENTLY (reads and writes
    go on). Idempotent; an invalid index left by an interrupted build is dropped and rebuilt. Needs an
    autocommit connection. Returns the indexes built."""
    m = active_migration(conn)
    if m is None:
        return []
    built = []
    for g in VECTOR_GROUPS:
        if g.index is None:
            continue
        col = f"{g.vector}{m.suffix}"
        have = conn.execute(
            """SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = %s::regclass AND a.attname = %s""",
            (g.table, col),
        ).fetchall()
        if any(r["indisvalid"] for r in have):
            continue
        parts = partitioning.partitions_of(conn, g.table)
        for r in have:  # a partitioned index cannot be dropped concurrently (its partitions' go with it)
            conn.execute(f'DROP INDEX {"" if parts else "CONCURRENTLY "}IF EXISTS "{r["relname"]}"')
        name = _index_name(g, m)
        if name in {r["relname"] for r in have} or m.suffix == "_prev":
            name = f"{name}_{m.flips}"
        partitioning.create_index(
            conn,
            f"CREATE INDEX {name} ON {g.table} USING {g.index.format(col=col)}",
            partitions=parts,
            concurrently=True,
        )
        built.append(name)
    return built


# --------------------------------------------------------------------------- flip


def _quantize_sql(dim: int) -> str:
    """007's trigger for the dimension now active (its UPDATE OF column list binds to the column itself)."""
    return f"""
        DROP TRIGGER IF EXISTS archived_memories_quantize ON archived_memories;
        CREATE OR REPLACE FUNCTION archived_memories_quantize() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            IF NEW.summary_embedding IS NOT NULL THEN
                NEW.summary_bits := binary_quantize(NEW.summary_embedding)::bit({dim});
                NEW.summary_embedding := NULL;
            END IF;
            RETURN NEW;
        END $fn$;
        CREATE TRIGGER archived_memories_quantize BEFORE INSERT OR UPDATE OF summary_embedding ON archived_memories
            FOR EACH ROW EXECUTE FUNCTION archived_memories_quantize();
        ALTER TABLE archived_memories DROP CONSTRAINT IF EXISTS archived_stub_without_vector,
            ADD CONSTRAINT archived_stub_without_vector CHECK ((stubbed_at IS NULL) = (summary_bits IS NOT NULL));"""


def _swap(conn: Conn, m: Migration, *, to_state: str, actor: str, lock_timeout: str) -> Migration:
    """Make the secondary space active, in one transaction; the active space becomes the secondary."""
    incoming, outgoing = m.suffix, ("_prev" if m.state == "running" else "_next")
    new_model, new_dim = m.secondary
    _lock_all(conn, lock_timeout)
    uncovered = {k: v for k, v in coverage(conn).items() if v}
    if uncovered:
        detail = ", ".join(f"{t}: {n}" for t, n in uncovered.items())
        raise ReembeddingError(
            f"cannot flip to {new_model!r} ({new_dim}-d): rows without a {incoming} vector ({detail}); "
            "run the backfill (the reembedding asset) first"
        )
    held = conn.execute(
        """SELECT count(*) AS n, array_agg(DISTINCT batch_key) AS batches FROM archival_attempts
           WHERE summary_embedding IS NOT NULL AND status NOT IN ('archived', 'released')"""
    ).fetchone()
    assert held is not None  # an aggregate without GROUP BY returns one row
    if held["n"]:
        raise ReembeddingError(
            f"cannot flip: {held['n']} open archival checkpoints hold summary embeddings of the active space "
            f"(batches {held['batches']}): let the archival run finish, then flip"
        )
    for g in VECTOR_GROUPS:
        for c in g.cols:
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name} TO {c.name}__swap")
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name}{incoming} TO {c.name}")
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name}__swap TO {c.name}{outgoing}")
        nulls = [
            f"ALTER COLUMN {c.name} SET NOT NULL, ALTER COLUMN {c.name}{outgoing} DROP NOT NULL"
            for c in g.cols
            if c.not_null
        ]
        if nulls:
            conn.execute(f"ALTER TABLE {g.table} {', '.join(nulls)}")
    conn.execute(_quantize_sql(new_dim))
    for g in VECTOR_GROUPS:
        if g.kind is not None:
            conn.execute(_guard_sql(g, outgoing))
    rerender_migration_checksums(conn, new_dim)  # reads the settings' dim: before they change
    for key, value in (("embedding_model", new_model), ("embedding_dim", str(new_dim))):
        conn.execute(
            """INSERT INTO memory_archive_settings (key, value) VALUES (%s, %s)
               ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value""",
            (key, value),
        )
    conn.execute(
        """UPDATE embedding_migrations SET state = %s, flipped_at = now(), flipped_by = %s, flips = flips + 1
           WHERE id = %s""",
        (to_state, actor, m.id),
    )
    return _by_id(conn, m.id)


def flip(conn: Conn, *, actor: str, lock_timeout: str = "30s") -> Migration:
    """Make the target space active: searches and writes use the new vectors from the commit on. Refused
    unless every row has its `_next` vector. Builds the missing indexes first (CONCURRENTLY)."""
    return _flip(conn, "running", "flipped", "flip", actor=actor, lock_timeout=lock_timeout)


def flip_back(conn: Conn, *, actor: str, lock_timeout: str = "30s") -> Migration:
    """Make the source space active again (the migration is `running` again). Refused unless every row
    has its `_prev` vector (writes made while flipped are dual-written or backfilled into it)."""
    return _flip(conn, "flipped", "running", "flip back", actor=actor, lock_timeout=lock_timeout)


def _flip(
    conn: Conn, from_state: str, to_state: str, what: str, *, actor: str, lock_timeout: str
) -> Migration:
    """flip and flip_back: the indexes built (CONCURRENTLY, outside a transaction), then the swap."""
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    _require_outside(conn, from_state, what)
    ensure_indexes(conn)
    with conn.transaction():
        return _swap(
            conn, _require(conn, from_state, what), to_state=to_state, actor=actor, lock_timeout=lock_timeout
        )


def _require_outside(conn: Conn, state: str, what: str) -> None:
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ReembeddingError(f"{what} builds indexes CONCURRENTLY: call it outside a transaction")
    _in_state(active_migration(conn), state, what, missing=f"no {state} re-embedding: nothing to {what}")


def drop_old(conn: Conn, *, actor: str) -> Migration:
    """After a flip, on request: drop the `_prev` columns (and their indexes, triggers); `finished`.
    From here a flip back is impossible."""
    return _close(conn, actor, state="flipped", what="drop the old vectors", suffix="_prev", final="finished")


# --------------------------------------------------------------------------- the clients' dual write


class DualWriter:
    """What a client needs to dual-write: the open migration (read from the database at most every
    `ttl` seconds) and the secondary space's embedder. A stale answer is harmless: rows it misses stay
    pending for the backfill, and a secondary of the wrong space is refused (_check_embedder)."""

    def __init__(
        self,
        ttl: float = 10.0,
        make_embedder: Callable[[str, int], Embedder] | None = None,
        *,
        embedding: EmbeddingConfig | None = None,
    ):
        """`embedding`: the client's embedding settings, whose base URL an OpenAI secondary uses
        (embedder_for); `make_embedder` replaces embedder_for altogether."""
        self.ttl = ttl
        self._make: Callable[[str, int], Embedder] = make_embedder or functools.partial(
            embedder_for, embedding=embedding
        )
        self._at = -float("inf")
        self._migration: Migration | None = None

    def migration(self, conn: Conn) -> Migration | None:
        if time.monotonic() - self._at > self.ttl:
            try:
                self._migration = active_migration(conn)
            except psycopg.errors.UndefinedTable:  # a schema before 017: no migration can be open
                self._migration = None
            self._at = time.monotonic()
        return self._migration

    def fill(self, conn: Conn, kind: Kind, ids: Sequence[uuid.UUID]) -> int:
        m = self.migration(conn)
        if m is None or not ids:
            return 0
        try:
            return drive(conn, fill_flow(m, kind, ids, self._make(*m.secondary)))
        except ReembeddingError:
            self._at = -float("inf")  # the migration moved on (flipped, finished): ask again next time
            return 0

    async def fill_async(self, conn: AsyncConn, kind: Kind, ids: Sequence[uuid.UUID]) -> int:
        """`fill` for the async client (embedding and the embedder's first load run in a thread)."""
        if time.monotonic() - self._at > self.ttl:
            try:
                self._migration = await run_plan_async(conn, _active_plan())
            except psycopg.errors.UndefinedTable:
                self._migration = None
            self._at = time.monotonic()
        m = self._migration
        if m is None or not ids:
            return 0
        embedder = await asyncio.to_thread(self._make, *m.secondary)
        try:
            return await drive_async(conn, fill_flow(m, kind, ids, embedder))
        except ReembeddingError:
            self._at = -float("inf")
            return 0


def _active_plan() -> Plan[Migration | None]:
    row = yield Sql(f"{_MIGRATION_SQL} WHERE state IN ('running', 'flipped')", {}, "one")
    return None if row is None else Migration(**row)
