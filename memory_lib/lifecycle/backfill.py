"""Filling a re-embedding's secondary columns: the backfill (batches of pending rows, per bucket) and
the clients' dual write of the rows they just wrote. Rows are read unlocked, embedded with no
transaction open, and written only if still as read (memory_lib.core.locks); the design is in
memory_lib.lifecycle.reembedding."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import psycopg

from ..core.config import EmbeddingConfig
from ..core.errors import InvalidInputError
from ..core.plans import Call, Flow, Plan, RunPlan, Sql, drive, drive_async, query_vector, run_plan_async
from ..core.rows import AsyncConn, Conn, Row
from ..llm.embedding import Embedder
from .vector_groups import (
    MIGRATION_SQL,
    Group,
    Kind,
    Migration,
    ReembeddingError,
    active_migration,
    check_embedder,
    embedder_for,
    group_of,
)

# --------------------------------------------------------------------------- backfill and dual write


def bucket_filter(bucket: int | None, buckets: int | None) -> str:
    if bucket is None:
        return ""
    return "AND (hashtext(id::text) & 2147483647) %% %(buckets)s = %(bucket)s"


def vector_text(v: np.ndarray) -> str:
    # repr of the float64 of each float32 round-trips exactly.
    return "[" + ",".join(repr(float(x)) for x in v) + "]"


def _write_sql(g: Group, suffix: str, dim: int, *, one_user: bool = False) -> str:
    """`one_user`: the rows are one user's (%(user_id)s), filtered so, so the UPDATE stays on its shard."""
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
                 AND ({g.text}) IS NOT DISTINCT FROM v.vtext AND ({g.needs_vector}) = v.vneeds
                 {"AND t.user_id = %(user_id)s" if one_user else ""}"""


# FOR SHARE: a flip (FOR UPDATE of this row, then the tables) waits for a batch holding it, or the batch
# sees the flip and stops: the column names a batch uses are the ones of the state it read.
STATE_READ_SQL = "SELECT state FROM embedding_migrations WHERE id = %(id)s"
STATE_SQL = STATE_READ_SQL + " FOR SHARE"


def check_state(m: Migration, row: Row | None) -> None:
    if row is None or row["state"] != m.state:
        raise ReembeddingError(
            f"re-embedding {m.id} changed state ({m.state} -> {row and row['state']}): retry"
        )


def _pending_sql(g: Group, suffix: str, where: str) -> str:
    # No row lock: the rows are embedded after this transaction ends (memory_lib.core.locks), and the
    # write re-checks them (_write_sql). Two workers on the same rows may both embed them; one writes.
    return f"""SELECT id, {g.text} AS text, {g.needs_vector} AS needs_vector FROM {g.table}
               WHERE {g.model}{suffix} IS NULL {where}
               ORDER BY id LIMIT %(limit)s"""


def _pending_plan(m: Migration, g: Group, where: str, params: dict[str, Any], limit: int) -> Plan[list[Row]]:
    check_state(m, (yield Sql(STATE_READ_SQL, {"id": m.id}, "one")))
    return (yield Sql(_pending_sql(g, m.suffix, where), params | {"limit": limit}))


def _embed_rows(embedder: Embedder, m: Migration, rows: Sequence[Row]) -> list[str | None]:
    """The secondary vector (as text) of each row that gets one, None for the others (archive stubs)."""
    model, dim = m.secondary
    check_embedder(embedder, model, dim, f"{m.suffix} (re-embedding {m.id})")
    todo = [r for r in rows if r["needs_vector"]]
    vectors = embedder.embed([r["text"] for r in todo]) if todo else np.zeros((0, dim), np.float32)
    by_id: dict[uuid.UUID, str | None] = {r["id"]: None for r in rows}
    for r, v in zip(todo, vectors, strict=True):
        by_id[r["id"]] = vector_text(query_vector(v, dim))
    return [by_id[r["id"]] for r in rows]


def _write_plan(
    m: Migration, g: Group, rows: Sequence[Row], vecs: Sequence[str | None], user_id: str | None = None
) -> Plan[int]:
    """Write the embedded rows still as they were read (_write_sql), under the migration row's share
    lock (STATE_SQL): a flip waits for it, or it sees the flip and writes nothing."""
    check_state(m, (yield Sql(STATE_SQL, {"id": m.id}, "one")))
    params = {
        "ids": [r["id"] for r in rows],
        "vecs": list(vecs),
        "texts": [r["text"] for r in rows],
        "needs": [bool(r["needs_vector"]) for r in rows],
        "model": m.secondary[0],
        "user_id": user_id,
    }
    sql = _write_sql(g, m.suffix, m.secondary[1], one_user=user_id is not None)
    return (yield Sql(sql, params, "rowcount"))


def _fill_flow(
    m: Migration, g: Group, embedder: Embedder, where: str, params: dict[str, Any], limit: int
) -> Flow[int]:
    """Read up to `limit` pending rows, embed them with no transaction open, write them in one UPDATE
    that skips any row changed meanwhile. A crash loses only the embedding work of this batch."""
    rows = yield RunPlan(_pending_plan(m, g, where, params, limit))
    if not rows:
        return 0
    vecs = yield Call(functools.partial(_embed_rows, embedder, m, rows))
    return (yield RunPlan(_write_plan(m, g, rows, vecs, params.get("user_id"))))


def fill_flow(
    migration: Migration,
    kind: Kind,
    ids: Sequence[uuid.UUID],
    embedder: Embedder,
    *,
    user_id: str | None = None,
) -> Flow[int]:
    """Dual write as a flow (both clients drive it): fill the secondary columns of just-written rows
    `ids` (of `user_id`, when given: the statements then stay on that user's shard) that are still
    pending, embedded by `embedder` (the secondary space's). The same statements as a backfill batch,
    for a few rows."""
    where = "AND id = ANY(%(ids)s)" + ("" if user_id is None else " AND user_id = %(user_id)s")
    return _fill_flow(
        migration, group_of(kind), embedder, where, {"ids": list(ids), "user_id": user_id}, len(ids)
    )


def _fill(
    conn: Conn,
    g: Group,
    m: Migration,
    embedder: Embedder,
    where: str,
    params: dict[str, Any],
    limit: int,
) -> int:
    check_embedder(embedder, *m.secondary, f"{m.suffix} (re-embedding {m.id})")
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
    g = group_of(kind)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError("limit", limit, "must be a positive integer")
    if bucket is not None and (buckets is None or not 0 <= bucket < buckets):
        raise InvalidInputError("bucket", bucket, f"must be in [0, buckets={buckets})")
    m = active_migration(conn)
    if m is None:
        return 0
    return _fill(
        conn, g, m, embedder, bucket_filter(bucket, buckets), {"bucket": bucket, "buckets": buckets}, limit
    )


def pending(conn: Conn, kind: Kind, *, bucket: int | None = None, buckets: int | None = None) -> int:
    """Rows of `kind` (in `bucket`) whose secondary columns are not filled yet; 0 without a migration."""
    g = group_of(kind)
    m = active_migration(conn)
    if m is None:
        return 0
    row = conn.execute(
        f"SELECT count(*) AS n FROM {g.table} WHERE {g.model}{m.suffix} IS NULL {bucket_filter(bucket, buckets)}",
        {"bucket": bucket, "buckets": buckets},
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return row["n"]


# --------------------------------------------------------------------------- the clients' dual write


class DualWriter:
    """What a client needs to dual-write: the open migration (read from the database at most every
    `ttl` seconds) and the secondary space's embedder. A stale answer is harmless: rows it misses stay
    pending for the backfill, and a secondary of the wrong space is refused (check_embedder)."""

    def __init__(
        self,
        ttl: float = 10.0,
        make_embedder: Callable[[str, int], Embedder] | None = None,
        *,
        embedding: EmbeddingConfig,
    ):
        """`embedding`: the client's embedding settings, whose key and base URL an OpenAI secondary uses
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

    def fill(self, conn: Conn, kind: Kind, ids: Sequence[uuid.UUID], *, user_id: str | None = None) -> int:
        m = self.migration(conn)
        if m is None or not ids:
            return 0
        try:
            return drive(conn, fill_flow(m, kind, ids, self._make(*m.secondary), user_id=user_id))
        except ReembeddingError:
            self._at = -float("inf")  # the migration moved on (flipped, finished): ask again next time
            return 0

    async def fill_async(
        self, conn: AsyncConn, kind: Kind, ids: Sequence[uuid.UUID], *, user_id: str | None = None
    ) -> int:
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
            return await drive_async(conn, fill_flow(m, kind, ids, embedder, user_id=user_id))
        except ReembeddingError:
            self._at = -float("inf")
            return 0


def _active_plan() -> Plan[Migration | None]:
    row = yield Sql(f"{MIGRATION_SQL} WHERE state IN ('running', 'flipped')", {}, "one")
    return None if row is None else Migration(**row)
