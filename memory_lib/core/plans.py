"""The plan runtime: work on Postgres written once, run by a sync or an async driver.

Two levels, each a generator that yields requests and receives their results:

* A *plan* yields operations (`Snapshot`, `Sql`, `GetVerified`, `EmbedText`). `run_plan` executes one on
  a psycopg Connection, `run_plan_async` on an AsyncConnection, each inside one transaction (a savepoint
  inside a caller's transaction).
* A *flow* yields steps and returns a value. `RunPlan(plan)`: that plan run in its own transaction on the
  driver's connection, or on one taken from the driver's connection source for that plan alone, so a
  pool's connection is not held across blocking calls; its result sent back. `Call(fn)`: a blocking call,
  no database (an embedder, an LLM, the object store); `fn()`'s result sent back. `GetVerified` and
  `EmbedText`: as in a plan, but run with no transaction open, so no lock is held across them. `drive`
  runs a flow synchronously, `drive_async` on asyncio, where each `Call` runs in a thread
  (asyncio.to_thread, which carries the current span along). Search with its escalation, forget and
  every client method are flows.

The invariant: the SQL text, the control flow and the checks live once, in the plans and flows; a driver
only executes what is yielded and never decides anything, so the sync and async clients return the same
results by construction (psycopg 3 drives its own protocol the same way). A step that fails is raised in
its flow where it yielded and the flow is closed at once, so a span the flow opened
(memory_lib.observability.trace) records the error and ends before the caller's do.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from psycopg import AsyncRawCursor, IsolationLevel, RawCursor
from psycopg import errors as psycopg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from .errors import EmbeddingMismatchError, InvalidInputError, embedding_mismatch_reason
from .rows import AsyncConn, Conn

if TYPE_CHECKING:
    from ..llm.embedding import Embedder
    from ..storage.objectstore import ObjectStore

T = TypeVar("T")

# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class Sql:
    """One statement. fetch: 'all' rows, 'one' row (or None), or 'rowcount'. Statements separated by
    `;` (no parameters: simple protocol) are one round trip; rows are those of the first that returns rows."""

    query: str
    params: Mapping[str, Any]
    fetch: Literal["all", "one", "rowcount"] = "all"


@dataclass(frozen=True, slots=True)
class GetVerified:
    """Read a backup object by its storage ref; a sha256 mismatch raises IntegrityError."""

    storage_ref: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """First op of a read-only plan: one snapshot for all its statements (REPEATABLE READ).

    Applied only when run_plan opens the transaction, sent with its BEGIN, and on an autocommit
    connection with the plan's next statement when that one has no parameters (one round trip); inside
    a caller's transaction the caller's isolation level stands (SET TRANSACTION must come before any
    query). Returns None."""


@dataclass(frozen=True, slots=True)
class EmbedText:
    """Embed one text with the runner's embedder, which must be `model` (`dim`-d): the active space's.
    Restoring a memory whose backup holds a vector of another space (a re-embedding flipped since it
    was archived) re-embeds its text this way. Returns a float32 vector; no embedder: InvalidInputError."""

    text: str
    model: str
    dim: int


Op = Sql | GetVerified | Snapshot | EmbedText
Plan = Generator[Op, Any, T]


def _store(object_store: ObjectStore | None) -> ObjectStore:
    if object_store is None:
        raise InvalidInputError("object_store", None, "this operation reads backups: pass an object store")
    return object_store


_IDLE = TransactionStatus.IDLE
_SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def _embed(embedder: Embedder | None, op: EmbedText) -> np.ndarray:
    if embedder is None:
        raise InvalidInputError(
            "embedder",
            None,
            f"this operation re-embeds a text into {op.model!r} ({op.dim}-d): pass that embedder",
        )
    if embedder.model != op.model or embedder.dim != op.dim:
        raise EmbeddingMismatchError(
            "embedder.model",
            embedder.model,
            embedding_mismatch_reason(op.model, op.dim, embedder.model, embedder.dim),
        )
    return query_vector(embedder.embed([op.text])[0], op.dim)


def _stale_prepared(exc: BaseException) -> bool:
    """A statement psycopg prepared (after 5 runs) whose result columns changed since: DDL such as a
    re-embedding's start/flip/drop (memory_lib.lifecycle.reembedding). Postgres refuses it on every later run."""
    return isinstance(
        exc, psycopg_errors.FeatureNotSupported
    ) and "cached plan must not change result type" in str(exc)


_BEGIN_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def _can_begin(op: Op) -> bool:
    """Whether a read-only plan's BEGIN can travel with its first statement `op`: one without parameters
    (simple protocol: several statements in one round trip) whose rows are what the plan reads."""
    return isinstance(op, Sql) and not op.params and op.fetch != "rowcount"


def _with_begin(op: Op) -> Sql:
    assert isinstance(op, Sql)
    return Sql(f"{_BEGIN_SNAPSHOT};\n{op.query}", op.params, op.fetch)


@contextmanager
def _begun(conn: Conn) -> Iterator[None]:
    """The transaction a plan's first statement begins (an autocommit connection, so psycopg sends no
    BEGIN of its own): committed when the plan ends, rolled back when it fails."""
    try:
        yield
    except BaseException:
        if conn.info.transaction_status != _IDLE and not conn.closed:
            with suppress(psycopg_errors.Error):  # the plan's error is the one to raise
                conn.rollback()
        raise
    conn.commit()


@asynccontextmanager
async def _begun_async(conn: AsyncConn) -> AsyncIterator[None]:
    """_begun on an async connection."""
    try:
        yield
    except BaseException:
        if conn.info.transaction_status != _IDLE and not conn.closed:
            with suppress(psycopg_errors.Error):
                await conn.rollback()
        raise
    await conn.commit()


@contextmanager
def _snapshot_begin(conn: Conn) -> Iterator[None]:
    """The transaction opened inside this block begins REPEATABLE READ, READ ONLY: the Snapshot goes with
    BEGIN, one round trip instead of two. The connection's own settings are restored after it (unless
    the transaction could not end: a broken connection)."""
    before = conn.isolation_level, conn.read_only
    conn.isolation_level, conn.read_only = IsolationLevel.REPEATABLE_READ, True
    try:
        yield
    finally:
        if conn.info.transaction_status == _IDLE:
            conn.isolation_level, conn.read_only = before


@asynccontextmanager
async def _snapshot_begin_async(conn: AsyncConn) -> AsyncIterator[None]:
    """_snapshot_begin on an async connection."""
    before = conn.isolation_level, conn.read_only
    await conn.set_isolation_level(IsolationLevel.REPEATABLE_READ)
    await conn.set_read_only(True)
    try:
        yield
    finally:
        if conn.info.transaction_status == _IDLE:
            await conn.set_isolation_level(before[0])
            await conn.set_read_only(before[1])


def _rows_result(cur: Any) -> None:
    """Move to the first result that returns rows: a multi-statement Sql (simple protocol, no
    parameters) may set and lock before the SELECT whose row it returns."""
    while cur.description is None and cur.nextset():
        pass


# psycopg turns `%(name)s` into `$n` by parsing the query on every execution when it is longer than 4 KiB
# (it caches the parse of shorter ones only): ~0.4 ms for a 12 KB search statement, each time. A long
# statement is parsed once here instead (`_native`) and runs on a RawCursor, which sends `$n` as is.
_NATIVE_MIN_LENGTH = 4096
_PLACEHOLDER = re.compile(r"%(?:\(([^)]*)\))?(.)", re.DOTALL)


@functools.lru_cache(maxsize=256)  # the plans' statements: a fixed set
def _native_form(query: str) -> tuple[str, tuple[str, ...]] | None:
    """`query` with each `%(name)s` as `$n` (a name used twice: one parameter) and `%%` as `%`, with the
    names in parameter order; None when it has any other placeholder (psycopg parses those)."""
    order: dict[str, int] = {}
    out: list[str] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(query):
        name, kind = m.group(1), m.group(2)
        if name is None and kind == "%":
            out.append(query[pos : m.start()] + "%")
        elif name is not None and kind == "s":
            n = order.setdefault(name, len(order) + 1)
            out.append(f"{query[pos : m.start()]}${n}")
        else:
            return None
        pos = m.end()
    out.append(query[pos:])
    return "".join(out), tuple(order)


def _native(op: Sql) -> tuple[str, list[Any]] | None:
    """A long statement with named parameters as (native query, values), or None to run it as given."""
    if not op.params or len(op.query) <= _NATIVE_MIN_LENGTH:
        return None
    form = _native_form(op.query)
    if form is None:
        return None
    query, names = form
    return query, [op.params[n] for n in names]  # a missing name: KeyError, as psycopg's own


_DEALLOCATE = "DEALLOCATE ALL"  # psycopg forgets its prepared statements too when it sees this succeed


def run_plan(
    conn: Conn,
    plan: Plan[T],
    *,
    object_store: ObjectStore | None = None,
    embedder: Embedder | None = None,
) -> T:
    """Execute `plan` on a sync connection in one transaction (a savepoint if one is open). A prepared
    statement made stale by DDL fails this run and is deallocated, so the next run works."""
    try:
        return _run_plan(conn, plan, object_store=object_store, embedder=embedder)
    except Exception as exc:
        if _stale_prepared(exc) and conn.info.transaction_status == _IDLE:
            conn.execute(_DEALLOCATE)
        raise


def _run_plan(conn: Conn, plan: Plan[T], *, object_store: ObjectStore | None, embedder: Embedder | None) -> T:
    outermost = conn.info.transaction_status == _IDLE
    try:
        with ExitStack() as stack:
            try:  # StopIteration must not reach the transaction block: it would roll back
                op = next(plan)
                if outermost and isinstance(op, Snapshot):
                    op = plan.send(None)
                    if conn.autocommit and _can_begin(op):
                        stack.enter_context(_begun(conn))
                        op = _with_begin(op)
                    else:
                        stack.enter_context(_snapshot_begin(conn))
                        stack.enter_context(conn.transaction())
                else:
                    stack.enter_context(conn.transaction())
                cur = stack.enter_context(conn.cursor(row_factory=dict_row))
                raw: RawCursor[dict[str, Any]] | None = None
                while True:
                    if isinstance(op, Snapshot):  # not first: fails as SET TRANSACTION after a query does
                        if outermost:
                            cur.execute(_SNAPSHOT_SQL)
                        result: Any = None
                    elif isinstance(op, Sql):
                        native = _native(op)
                        if native is None:
                            c: Any = cur
                            c.execute(op.query, op.params)
                        else:
                            if raw is None:
                                raw = stack.enter_context(RawCursor(conn, row_factory=dict_row))
                            c = raw
                            c.execute(*native)
                        if op.fetch == "rowcount":
                            result = c.rowcount
                        else:
                            _rows_result(c)
                            result = c.fetchall() if op.fetch == "all" else c.fetchone()
                    elif isinstance(op, EmbedText):
                        result = _embed(embedder, op)
                    else:
                        result = _store(object_store).read_ref(op.storage_ref, op.sha256)
                    op = plan.send(result)
            except StopIteration as stop:
                value: T = stop.value
    finally:
        plan.close()
    return value


async def run_plan_async(
    conn: AsyncConn,
    plan: Plan[T],
    *,
    object_store: ObjectStore | None = None,
    embedder: Embedder | None = None,
) -> T:
    """Execute `plan` on an async connection in one transaction; object reads run in a thread. A stale
    prepared statement is deallocated after failing once, as in run_plan."""
    try:
        return await _run_plan_async(conn, plan, object_store=object_store, embedder=embedder)
    except Exception as exc:
        if _stale_prepared(exc) and conn.info.transaction_status == _IDLE:
            await conn.execute(_DEALLOCATE)
        raise


async def _run_plan_async(
    conn: AsyncConn,
    plan: Plan[T],
    *,
    object_store: ObjectStore | None,
    embedder: Embedder | None,
) -> T:
    outermost = conn.info.transaction_status == _IDLE
    try:
        async with AsyncExitStack() as stack:
            try:
                op = next(plan)
                if outermost and isinstance(op, Snapshot):
                    op = plan.send(None)
                    if conn.autocommit and _can_begin(op):
                        await stack.enter_async_context(_begun_async(conn))
                        op = _with_begin(op)
                    else:
                        await stack.enter_async_context(_snapshot_begin_async(conn))
                        await stack.enter_async_context(conn.transaction())
                else:
                    await stack.enter_async_context(conn.transaction())
                cur = await stack.enter_async_context(conn.cursor(row_factory=dict_row))
                raw: AsyncRawCursor[dict[str, Any]] | None = None
                while True:
                    result: Any
                    if isinstance(op, Snapshot):  # not first: fails as SET TRANSACTION after a query does
                        if outermost:
                            await cur.execute(_SNAPSHOT_SQL)
                        result = None
                    elif isinstance(op, Sql):
                        native = _native(op)
                        if native is None:
                            c: Any = cur
                            await c.execute(op.query, op.params)
                        else:
                            if raw is None:
                                raw = await stack.enter_async_context(
                                    AsyncRawCursor(conn, row_factory=dict_row)
                                )
                            c = raw
                            await c.execute(*native)
                        if op.fetch == "rowcount":
                            result = c.rowcount
                        else:
                            _rows_result(c)
                            result = await c.fetchall() if op.fetch == "all" else await c.fetchone()
                    elif isinstance(op, EmbedText):
                        result = await asyncio.to_thread(_embed, embedder, op)
                    else:
                        result = await asyncio.to_thread(
                            _store(object_store).read_ref, op.storage_ref, op.sha256
                        )
                    op = plan.send(result)
            except StopIteration as stop:
                value: T = stop.value
    finally:
        plan.close()
    return value


# --------------------------------------------------------------------------- flows


@dataclass(frozen=True, slots=True)
class RunPlan:
    """Run `plan` in its own transaction on the driver's connection; its return value is sent back."""

    plan: Plan[Any]


@dataclass(frozen=True, slots=True)
class Call:
    """A blocking call outside the database (an embedder, an LLM, the object store); `fn()` is sent back.
    The async driver runs it in a thread."""

    fn: Callable[[], Any]


# GetVerified and EmbedText are steps too: the driver runs them with its object store and embedder,
# outside any transaction, so a flow reads a backup or embeds a text before it locks (core/locks.py).
Step = RunPlan | Call | GetVerified | EmbedText
Flow = Generator[Step, Any, T]
# A connection, or what lends one per plan (a client's pool: its `connection` context manager).
ConnSource = Conn | Callable[[], AbstractContextManager[Conn]]
AsyncConnSource = AsyncConn | Callable[[], AbstractAsyncContextManager[AsyncConn]]


def drive(
    conn: ConnSource,
    flow: Flow[T],
    *,
    object_store: ObjectStore | None = None,
    embedder: Embedder | None = None,
) -> T:
    """Run `flow` synchronously: each plan by run_plan on `conn` (or on a connection `conn()` lends for
    that plan), with this object store and embedder; each call in this thread. A failed step is raised
    in the flow, which is then closed (module docstring)."""
    try:
        step = next(flow)
        while True:
            try:
                if isinstance(step, RunPlan):
                    if callable(conn):
                        with conn() as lent:
                            value = run_plan(lent, step.plan, object_store=object_store, embedder=embedder)
                    else:
                        value = run_plan(conn, step.plan, object_store=object_store, embedder=embedder)
                elif isinstance(step, GetVerified):
                    value = _store(object_store).read_ref(step.storage_ref, step.sha256)
                elif isinstance(step, EmbedText):
                    value = _embed(embedder, step)
                else:
                    value = step.fn()
            except BaseException as exc:  # raised where the flow yielded: its spans record it
                step = flow.throw(exc)
            else:
                step = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        flow.close()


async def drive_async(
    conn: AsyncConnSource,
    flow: Flow[T],
    *,
    object_store: ObjectStore | None = None,
    embedder: Embedder | None = None,
) -> T:
    """`drive` on asyncio: each plan by run_plan_async, each (blocking) call in a thread."""
    try:
        step = next(flow)
        while True:
            try:
                if isinstance(step, RunPlan):
                    if callable(conn):
                        async with conn() as lent:
                            value = await run_plan_async(
                                lent, step.plan, object_store=object_store, embedder=embedder
                            )
                    else:
                        value = await run_plan_async(
                            conn, step.plan, object_store=object_store, embedder=embedder
                        )
                elif isinstance(step, GetVerified):
                    value = await asyncio.to_thread(
                        _store(object_store).read_ref, step.storage_ref, step.sha256
                    )
                elif isinstance(step, EmbedText):
                    value = await asyncio.to_thread(_embed, embedder, step)
                else:
                    value = await asyncio.to_thread(step.fn)
            except BaseException as exc:  # raised where the flow yielded: its spans record it
                step = flow.throw(exc)
            else:
                step = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        flow.close()


def query_vector(embedding: Any, dim: int) -> np.ndarray:
    vec = np.asarray(embedding, dtype=np.float32).reshape(-1)
    if vec.size != dim or not np.isfinite(vec).all() or not math.isfinite(float(np.linalg.norm(vec))):
        raise InvalidInputError("query embedding", f"shape={vec.shape}", f"must be {dim} finite floats")
    return vec
