"""The library API agents use: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio).

Both take a connection or a pool, an Embedder and an ObjectStore, and run the same plans
(memory_lib.search, write_path, promotion), so they return the same results. Every method takes the
user_id first and never reads or writes another user's rows.

    with MemoryClient.from_settings() as memory:
        memory.add("u1", "Prefers a cortado in the morning", tags=["coffee"])
        hits = memory.search("u1", "what coffee does the user like?")

A single psycopg Connection serves one thread at a time; pass a pool (`connection_pool(url)`)
to share a client between threads or tasks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector, register_vector_async
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import stubs, validation
from .config import ContextBudget, Settings
from .context import (
    AssembledContext,
    ContextItem,
    TokenCounter,
    Turn,
    approx_token_count,
    assemble_context,
    check_assembly_options,
    check_max_tokens,
    prepare_items,
    prepare_turns,
)
from .db import check_schema
from .embedding import Embedder, embedder_from_settings
from .errors import InvalidInputError
from .objectstore import ObjectStore, object_store_from_settings
from .promotion import (
    Expansion,
    RestoreOutcome,
    expand_plan,
    record_access_plan,
    restore_plan,
)
from .search import (
    Phase2Mode,
    Plan,
    SearchFilters,
    SearchHit,
    SearchRequest,
    SearchResult,
    normalize_tags,
    query_vector,
    run_plan,
    run_plan_async,
    search_plan,
    utc_now,
)
from .validation import SearchParams
from .write_path import AddResult, add_plan, prepare_memory

__all__ = [
    "AddResult",
    "AsyncMemoryClient",
    "Expansion",
    "MemoryClient",
    "RestoreOutcome",
    "SearchFilters",
    "SearchHit",
    "SearchResult",
    "async_connection_pool",
    "connection_pool",
]

DEFAULT_ACTOR = "memory_lib.client"


def connection_pool(url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any) -> ConnectionPool:
    """A pool of connections configured like memory_lib.db.connect (autocommit, dict rows, pgvector).

    The schema is checked first: on a database that was never migrated the pool would otherwise retry
    registering the missing `vector` type until its timeout; this raises SchemaError at once instead.
    """
    check_schema(url)
    return ConnectionPool(
        url, min_size=min_size, max_size=max_size, open=True, configure=register_vector,
        kwargs={"autocommit": True, "row_factory": dict_row}, **kwargs,
    )  # fmt: skip


def async_connection_pool(
    url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any
) -> AsyncConnectionPool:
    """The async twin of `connection_pool`; open it with `await pool.open()` (or `async with`)."""
    return AsyncConnectionPool(
        url, min_size=min_size, max_size=max_size, open=False, configure=register_vector_async,
        kwargs={"autocommit": True, "row_factory": dict_row}, **kwargs,
    )  # fmt: skip


@dataclass(frozen=True)
class _Parts:
    """What both clients share: configuration and the pure steps around the plans."""

    embedder: Embedder
    object_store: ObjectStore | None
    settings: Settings
    actor: str
    token_counter: TokenCounter

    def embed_one(self, text: str) -> np.ndarray:
        return query_vector(self.embedder.embed([text])[0], self.embedder.dim)

    def search_params(self, filters: SearchFilters | None, **kwargs: Any) -> SearchParams:
        """Every search argument validated before the query is embedded (memory_lib.validation)."""
        params = validation.validated(SearchParams, kwargs)
        if filters is not None:
            if not isinstance(filters, SearchFilters):
                raise InvalidInputError("filters", filters, "must be a SearchFilters")
            validation.check_filters(filters)
        return params

    def search_request(
        self, params: SearchParams, filters: SearchFilters | None, embedding: np.ndarray
    ) -> SearchRequest:
        return SearchRequest(
            user_id=params.user_id, query=params.query, embedding=embedding, config=self.settings.retrieval,
            now=utc_now(params.now), text_query=params.text_query, filters=filters or SearchFilters(),
            tags=normalize_tags(params.tags), include_past=params.include_past, phase2=params.phase2,  # type: ignore[arg-type]
            limit=params.limit, archived_limit=params.archived_limit, embedding_model=self.embedder.model,
            embedder_kind=getattr(self.embedder, "kind", None),
        )  # fmt: skip

    def context_inputs(
        self,
        recent_turns: Sequence[Turn],
        summaries: Sequence[str | ContextItem],
        budget: ContextBudget | None,
        counter: TokenCounter | None,
        max_tokens: int | None,
    ) -> tuple[list[ContextItem], list[ContextItem]]:
        """Checked before searching: a search may record access, and must not when assembly would fail."""
        check_assembly_options(budget, counter)
        check_max_tokens(max_tokens)
        return prepare_turns(recent_turns), prepare_items(summaries, "summaries")

    def context(
        self,
        result: SearchResult,
        recent_turns: Sequence[ContextItem],
        summaries: Sequence[ContextItem],
        budget: ContextBudget | None,
        counter: TokenCounter | None,
        max_tokens: int | None,
    ) -> AssembledContext:
        return assemble_context(
            summaries=[*summaries, *result.archived], recent_turns=recent_turns, snippets=result.hot,
            budget=budget or self.settings.context, counter=counter or self.token_counter, max_tokens=max_tokens,
        )  # fmt: skip


def _parts(
    embedder: Embedder,
    object_store: ObjectStore | None,
    settings: Settings | None,
    actor: str,
    token_counter: TokenCounter | None,
) -> _Parts:
    if not actor or not isinstance(actor, str):
        raise InvalidInputError("actor", actor, "must be a non-empty string")
    validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    return _Parts(embedder, object_store, settings or Settings(), actor, token_counter or approx_token_count)


class MemoryClient:
    """Synchronous memory API over a psycopg Connection or ConnectionPool."""

    def __init__(
        self,
        conn: psycopg.Connection | ConnectionPool,
        *,
        embedder: Embedder,
        object_store: ObjectStore | None = None,
        settings: Settings | None = None,
        actor: str = DEFAULT_ACTOR,
        token_counter: TokenCounter | None = None,
    ):
        self._conn = conn
        self._parts = _parts(embedder, object_store, settings, actor, token_counter)
        self._owned: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> MemoryClient:
        """Open the configured database (migrated already: no DDL, no lock; SchemaError otherwise), its
        embedder and object store; close() releases them."""
        from .db import open_ready_database

        settings = settings or Settings.from_env()
        db = open_ready_database(settings)
        try:
            pool = connection_pool(db.url)
        except BaseException:
            db.close()
            raise
        client = cls(
            pool,
            embedder=kwargs.pop("embedder", None) or embedder_from_settings(settings.embedding),
            object_store=kwargs.pop("object_store", None) or object_store_from_settings(settings),
            settings=settings,
            **kwargs,
        )
        client._owned = [pool, db]
        return client

    def close(self) -> None:
        for owned in self._owned:
            owned.close()
        self._owned = []

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        if isinstance(self._conn, ConnectionPool):
            with self._conn.connection() as conn:
                yield conn
        else:
            yield self._conn

    def _run(self, plan: Plan[Any]) -> Any:
        with self._connection() as conn:
            return run_plan(conn, plan, object_store=self._parts.object_store)

    # -- write

    def add(
        self,
        user_id: str,
        content: str,
        *,
        category: str = "episodic",
        domain: str | None = None,
        importance: float = 0.5,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
        pinned: bool = False,
        entity_links: list[uuid.UUID] | None = None,
        allow_secrets: bool = False,
        now: datetime | None = None,
    ) -> AddResult:
        """Remember `content` for `user_id`: a new memory, the same one again, or an update that
        supersedes a near-duplicate (see memory_lib.write_path)."""
        memory = prepare_memory(
            user_id, content, category=category, domain=domain, importance=importance, tags=tags,
            metadata=metadata, pinned=pinned, entity_links=entity_links, allow_secrets=allow_secrets,
            secret_policy=self._parts.settings.secrets,
        )  # fmt: skip
        now = _now(now)
        embedding = self._parts.embed_one(memory.content)
        p = self._parts
        return self._run(add_plan(memory, embedding, embedding_model=p.embedder.model,
                                  config=p.settings.retrieval, actor=p.actor, now=now))  # fmt: skip

    # -- read

    def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int | None = None,
        archived_limit: int | None = None,
        filters: SearchFilters | None = None,
        tags: Sequence[str] | None = None,
        include_past: bool = False,
        phase2: Phase2Mode = "auto",
        text_query: str | None = None,
        record_access: bool = False,
        now: datetime | None = None,
    ) -> SearchResult:
        """Hot memories first, archived summaries when needed (see memory_lib.search). With
        record_access=True the hits count as used (access_count, last_accessed_at).

        Every argument is checked first (memory_lib.validation): `query` and `text_query` are at most
        MAX_QUERY_CHARS (4,000) characters; `now` is an aware datetime or an ISO 8601 string with an
        offset; limits are integers in 0..1000; flags are real booleans; `filters` is a SearchFilters
        whose values are re-checked (domains and tags must be storable text)."""
        params = self._parts.search_params(
            filters, user_id=user_id, query=query, limit=limit, archived_limit=archived_limit, tags=tags,
            include_past=include_past, phase2=phase2, text_query=text_query, record_access=record_access, now=now,
        )  # fmt: skip
        request = self._parts.search_request(params, filters, self._parts.embed_one(params.query))
        result = self._run(search_plan(request))
        if params.record_access and result.hits:
            self.record_access(user_id, [h.id for h in result.hits], now=request.now)
        return result

    def expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None = None) -> Expansion:
        """The verified original of an archived memory; re-promotes it on the Nth expansion in the window.
        A stub that stays archived gets its summary vector back (its summary re-embedded, memory_lib.stubs):
        after the expansion's commit, so a crash in between leaves a stub the next expansion restores."""
        p = self._parts
        when = _now(now)
        exp = self._run(expand_plan(*_archive_ref(user_id, archive_id), config=p.settings.promotion,
                                    actor=p.actor, now=when))  # fmt: skip
        if exp.promoted:
            return exp
        summary = self._run(stubs.stub_summary_plan(exp.user_id, exp.archive_id))
        if summary is None:
            return exp
        plan = stubs.restore_vector_plan(exp.user_id, exp.archive_id, p.embed_one(summary), model=p.embedder.model,
                                         actor=p.actor, now=when)  # fmt: skip
        return replace(exp, vector_restored=self._run(plan))

    def record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None = None
    ) -> int:
        """Count a use of these memories (hot ids, archive ids or hits); returns the rows updated."""
        return self._run(record_access_plan(validation.user(user_id), _ids(ids), now=_now(now)))

    def build_context(
        self,
        user_id: str,
        query: str,
        recent_turns: Sequence[Turn] = (),
        budget: ContextBudget | None = None,
        *,
        summaries: Sequence[str | ContextItem] = (),
        counter: TokenCounter | None = None,
        max_tokens: int | None = None,
        **search_kwargs: Any,
    ) -> AssembledContext:
        """Search, then pack summaries, recent turns and snippets within the token budget."""
        turns, items = self._parts.context_inputs(recent_turns, summaries, budget, counter, max_tokens)
        result = self.search(user_id, query, **search_kwargs)
        return self._parts.context(result, turns, items, budget, counter, max_tokens)

    def restore(
        self,
        user_id: str,
        *,
        archive_id: uuid.UUID | None = None,
        original_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> RestoreOutcome:
        """Bring an archived memory back to the hot tier now (idempotent)."""
        plan = restore_plan(validation.user(user_id), archive_id=archive_id, original_id=original_id,
                            actor=self._parts.actor, now=_now(now))  # fmt: skip
        return self._run(plan)


class AsyncMemoryClient:
    """The asyncio twin of MemoryClient over a psycopg AsyncConnection or AsyncConnectionPool.

    Embedding and object storage calls (blocking SDKs) run in worker threads.
    """

    def __init__(
        self,
        conn: psycopg.AsyncConnection | AsyncConnectionPool,
        *,
        embedder: Embedder,
        object_store: ObjectStore | None = None,
        settings: Settings | None = None,
        actor: str = DEFAULT_ACTOR,
        token_counter: TokenCounter | None = None,
    ):
        self._conn = conn
        self._parts = _parts(embedder, object_store, settings, actor, token_counter)
        self._owned_pool: AsyncConnectionPool | None = None
        self._owned_db: Any = None

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> AsyncMemoryClient:
        """A client over a new, opened pool to `url` (migrated already: SchemaError otherwise); close() closes it."""
        await asyncio.to_thread(check_schema, url)
        pool = async_connection_pool(url)
        await pool.open(wait=True)
        client = cls(pool, **kwargs)
        client._owned_pool = pool
        return client

    @classmethod
    async def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> AsyncMemoryClient:
        """Like MemoryClient.from_settings: the migrated database of `settings`, checked, never changed."""
        from .db import open_ready_database

        settings = settings or Settings.from_env()
        db = await asyncio.to_thread(open_ready_database, settings)
        try:
            client = await cls.connect(
                db.url,
                embedder=kwargs.pop("embedder", None) or embedder_from_settings(settings.embedding),
                object_store=kwargs.pop("object_store", None) or object_store_from_settings(settings),
                settings=settings,
                **kwargs,
            )
        except BaseException:
            db.close()
            raise
        client._owned_db = db
        return client

    async def close(self) -> None:
        if self._owned_pool is not None:
            await self._owned_pool.close()
            self._owned_pool = None
        if self._owned_db is not None:
            self._owned_db.close()
            self._owned_db = None

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if isinstance(self._conn, AsyncConnectionPool):
            async with self._conn.connection() as conn:
                yield conn
        else:
            yield self._conn

    async def _run(self, plan: Plan[Any]) -> Any:
        async with self._connection() as conn:
            return await run_plan_async(conn, plan, object_store=self._parts.object_store)

    async def _embed_one(self, text: str) -> np.ndarray:
        return await asyncio.to_thread(self._parts.embed_one, text)

    async def add(
        self,
        user_id: str,
        content: str,
        *,
        category: str = "episodic",
        domain: str | None = None,
        importance: float = 0.5,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
        pinned: bool = False,
        entity_links: list[uuid.UUID] | None = None,
        allow_secrets: bool = False,
        now: datetime | None = None,
    ) -> AddResult:
        memory = prepare_memory(
            user_id, content, category=category, domain=domain, importance=importance, tags=tags,
            metadata=metadata, pinned=pinned, entity_links=entity_links, allow_secrets=allow_secrets,
            secret_policy=self._parts.settings.secrets,
        )  # fmt: skip
        now = _now(now)
        embedding = await self._embed_one(memory.content)
        p = self._parts
        return await self._run(add_plan(memory, embedding, embedding_model=p.embedder.model,
                                        config=p.settings.retrieval, actor=p.actor, now=now))  # fmt: skip

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int | None = None,
        archived_limit: int | None = None,
        filters: SearchFilters | None = None,
        tags: Sequence[str] | None = None,
        include_past: bool = False,
        phase2: Phase2Mode = "auto",
        text_query: str | None = None,
        record_access: bool = False,
        now: datetime | None = None,
    ) -> SearchResult:
        params = self._parts.search_params(
            filters, user_id=user_id, query=query, limit=limit, archived_limit=archived_limit, tags=tags,
            include_past=include_past, phase2=phase2, text_query=text_query, record_access=record_access, now=now,
        )  # fmt: skip
        request = self._parts.search_request(params, filters, await self._embed_one(params.query))
        result = await self._run(search_plan(request))
        if params.record_access and result.hits:
            await self.record_access(user_id, [h.id for h in result.hits], now=request.now)
        return result

    async def expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None = None) -> Expansion:
        p = self._parts
        when = _now(now)
        exp = await self._run(expand_plan(*_archive_ref(user_id, archive_id), config=p.settings.promotion,
                                          actor=p.actor, now=when))  # fmt: skip
        if exp.promoted:
            return exp
        summary = await self._run(stubs.stub_summary_plan(exp.user_id, exp.archive_id))
        if summary is None:
            return exp
        plan = stubs.restore_vector_plan(exp.user_id, exp.archive_id, await self._embed_one(summary),
                                         model=p.embedder.model, actor=p.actor, now=when)  # fmt: skip
        return replace(exp, vector_restored=await self._run(plan))

    async def record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None = None
    ) -> int:
        return await self._run(record_access_plan(validation.user(user_id), _ids(ids), now=_now(now)))

    async def build_context(
        self,
        user_id: str,
        query: str,
        recent_turns: Sequence[Turn] = (),
        budget: ContextBudget | None = None,
        *,
        summaries: Sequence[str | ContextItem] = (),
        counter: TokenCounter | None = None,
        max_tokens: int | None = None,
        **search_kwargs: Any,
    ) -> AssembledContext:
        turns, items = self._parts.context_inputs(recent_turns, summaries, budget, counter, max_tokens)
        result = await self.search(user_id, query, **search_kwargs)
        return self._parts.context(result, turns, items, budget, counter, max_tokens)

    async def restore(
        self,
        user_id: str,
        *,
        archive_id: uuid.UUID | None = None,
        original_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> RestoreOutcome:
        plan = restore_plan(validation.user(user_id), archive_id=archive_id, original_id=original_id,
                            actor=self._parts.actor, now=_now(now))  # fmt: skip
        return await self._run(plan)


def _ids(ids: Sequence[uuid.UUID | SearchHit]) -> list[uuid.UUID]:
    if isinstance(ids, (str, uuid.UUID, SearchHit)):
        ids = [ids]  # type: ignore[list-item]
    if isinstance(ids, (bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidInputError("ids", ids, "must be a sequence of memory ids, archive ids or hits")
    return [i.id if isinstance(i, SearchHit) else validation.uuid_value("ids", i) for i in ids]


def _now(now: datetime | str | None) -> datetime:
    """`now` as aware UTC (an ISO 8601 string with an offset is accepted, see memory_lib.validation)."""
    return utc_now(validation.optional_timestamp("now", now))


def _archive_ref(user_id: object, archive_id: object) -> tuple[str, uuid.UUID]:
    return validation.user(user_id), validation.uuid_value("archive_id", archive_id)
