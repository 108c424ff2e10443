"""AsyncMemoryClient, the memory API agents use, on asyncio. Hand-written: tools/async_to_sync.py
generates MemoryClient (memory_lib/client/sync_client.py) from this file, and `make lint` checks the two
agree. Every method drives one flow of memory_lib.client.flows, so both clients run the same SQL and the
same control flow and return the same results."""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar, Unpack

from psycopg_pool import AsyncConnectionPool

from ..core.config import ContextBudget, Settings
from ..core.plans import Flow, drive_async
from ..core.rows import AsyncConn
from ..lifecycle.forget import ForgetResult, Steps, run_forget_async
from ..lifecycle.promotion import Expansion, RestoreOutcome
from ..llm.embedding import Embedder, embedder_from_settings
from ..retrieval.consolidated import ConsolidatedHit, SourceExpansion
from ..retrieval.context import AssembledContext, ContextItem, TokenCounter, Turn
from ..retrieval.escalation import Evaluator
from ..retrieval.rerank import Reranker
from ..retrieval.types import SearchHit, SearchResult
from ..storage.objectstore import ObjectStore, object_store_from_settings
from ..write import memory_api as api
from ..write.memory_api import MemoryEvent, MemoryPage, MemoryRecord, UpdateResult
from ..write.write_path import AddResult
from .flows import DEFAULT_ACTOR, Flows, SearchOptions, build_parts, check_keywords
from .pools import open_pool_async, open_ready_database_async

log = logging.getLogger(__name__)
T = TypeVar("T")


class AsyncMemoryClient(Flows):
    """The memory API over a psycopg AsyncConnection or AsyncConnectionPool (a pool lets several threads
    or tasks share one client; a single connection serves one at a time). Embedding, LLM and object
    storage calls are blocking SDK calls, made in worker threads by the asyncio client and in the
    calling thread by the sync one.

    What the client opened itself (`connect`, `from_settings`) it closes on close() or on leaving its
    `with` block; a connection or pool passed in stays the caller's.
    """

    def __init__(
        self,
        conn: AsyncConn | AsyncConnectionPool[Any],
        *,
        embedder: Embedder,
        object_store: ObjectStore | None = None,
        settings: Settings | None = None,
        actor: str = DEFAULT_ACTOR,
        token_counter: TokenCounter | None = None,
        evaluator: Evaluator | None = None,
        reranker: Reranker | None = None,
    ):
        self._conn = conn
        self._parts = build_parts(embedder, object_store, settings, actor, token_counter, evaluator, reranker)
        self._resources = AsyncExitStack()  # what close() closes, last opened first

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> AsyncMemoryClient:
        """A client over a new, opened pool to `url` (migrated already: SchemaError otherwise); close()
        closes it. `kwargs` are the constructor's (embedder, object_store, settings, ...)."""
        check_keywords("connect", kwargs, CLIENT_KEYWORDS)  # before a pool is opened
        pool = await open_pool_async(url)
        try:
            client = cls(pool, **kwargs)
        except BaseException:
            await pool.close()
            raise
        client._resources.push_async_callback(pool.close)
        return client

    @classmethod
    async def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> AsyncMemoryClient:
        """Open the configured database (migrated already: no DDL, no lock; SchemaError otherwise), its
        embedder and object store (unless given); close() releases them. Without `settings`, the
        environment's (Settings.from_env())."""
        check_keywords("from_settings", kwargs, CLIENT_KEYWORDS)  # before a database is opened
        settings = settings or Settings.from_env()
        async with AsyncExitStack() as opened:
            db = await open_ready_database_async(settings)
            opened.callback(db.close)
            client = await cls.connect(
                db.url,
                embedder=kwargs.pop("embedder", None) or embedder_from_settings(settings.embedding),
                object_store=kwargs.pop("object_store", None) or object_store_from_settings(settings),
                settings=settings,
                **kwargs,
            )
            await opened.enter_async_context(client._resources)  # the pool closes before the database
            client._resources = opened.pop_all()
        return client

    async def close(self) -> None:
        """Close what the client opened (its pool, its database); idempotent."""
        await self._resources.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConn]:
        if isinstance(self._conn, AsyncConnectionPool):
            async with self._conn.connection() as conn:
                yield conn
        else:
            yield self._conn

    async def _drive(self, flow: Flow[T]) -> T:
        """Each plan on a connection of its own from the pool (or the one connection)."""
        p = self._parts
        return await drive_async(self._connection, flow, object_store=p.object_store, embedder=p.embedder)

    async def _write(self, user_id: str, flow: Flow[tuple[T, list[uuid.UUID]]]) -> T:
        result, ids = await self._drive(flow)
        if ids:
            await self._dual_write(user_id, ids)
        return result

    async def _dual_write(self, user_id: str, ids: Sequence[uuid.UUID]) -> None:
        """During a re-embedding, fill the new rows' second vectors now (memory_lib.lifecycle.reembedding); the
        backfill fills whatever this misses, so a failure here is logged, never raised."""
        try:
            async with self._connection() as conn:
                await self._parts.dual.fill_async(conn, "hot", ids, user_id=user_id)
        except Exception:  # noqa: BLE001 - the write itself succeeded; the backfill covers these rows
            log.warning(
                "dual write of %d memories failed; the re-embedding backfill will fill them",
                len(ids),
                exc_info=True,
            )

    async def _drive_forget(self, steps: Steps) -> ForgetResult:
        """Forget runs on one connection from start to end (memory_lib.lifecycle.forget)."""
        async with self._connection() as conn:
            return await run_forget_async(conn, steps)

    # -- write

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
        ttl_days: int | None = None,
        supersedes: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> AddResult:
        """Remember `content` for `user_id`. Add-only: a new memory, unless it is the same text again or a
        restatement of a live memory (merged); it replaces a live memory only when that is known:
        `supersedes=<id>`, the LLM judge when one is configured, or the opt-in state rule. A long text
        is stored as chunks sharing a parent id. ttl_days: None (no TTL), 0 (pinned canonical fact) or
        N days, after which the nightly run archives it (reason ttl_expired). See memory_lib.write.write_path."""
        return await self._write(
            user_id,
            self._add(
                user_id,
                content,
                category=category,
                domain=domain,
                importance=importance,
                tags=tags,
                metadata=metadata,
                pinned=pinned,
                entity_links=entity_links,
                allow_secrets=allow_secrets,
                ttl_days=ttl_days,
                supersedes=supersedes,
                now=now,
            ),
        )

    # -- read

    async def search(self, user_id: str, query: str, **options: Unpack[SearchOptions]) -> SearchResult:
        """Hot memories first, archived summaries when needed (see memory_lib.retrieval.search). The
        options (memory_lib.client.SearchOptions, all keywords): `limit` and `archived_limit` hits per
        tier (default: retrieval settings); `filters` (a SearchFilters) and `tags`; `include_past`;
        `phase2` and `phase3` ("auto", "always" or "never"); `text_query` for the lexical arm instead
        of `query`; `now` (default: the current time). With record_access=True the hits count as used
        (access_count, last_accessed_at). With follow_links=True, `result.associated` holds the archived
        memories the hot hits link to (memory_lib.retrieval.associations), each labelled with the hot
        memory that links to it. With debug=True (default: retrieval.debug) `result.debug` records the
        candidates, their scores and the chosen ids (memory_lib.retrieval.types.SearchDebug); a client
        given a `reranker` returns the hits in its order. include_superseded=True (audits) returns
        superseded memories too, each hit's `superseded_by` naming the memory that replaced it; by
        default search returns live memories only.

        Every argument is checked first (memory_lib.core.validation): `query` and `text_query` are at most
        MAX_QUERY_CHARS (4,000) characters; `now` is an aware datetime or an ISO 8601 string with an
        offset; limits are integers in 0..1000; flags are real booleans; `filters` is a SearchFilters
        whose values are re-checked (domains and tags must be storable text); an unknown keyword is an
        UnknownParameterError (a TypeError) naming it."""
        return await self._drive(self._search(user_id, query, **options))

    async def expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None = None) -> Expansion:
        """The verified original of an archived memory; re-promotes it on the Nth expansion in the window.
        A stub that stays archived gets its summary vector back (its summary re-embedded, memory_lib.lifecycle.stubs):
        after the expansion's commit, so a crash in between leaves a stub the next expansion restores."""
        return await self._drive(self._expand(user_id, archive_id, now=now))

    async def expand_digest(self, user_id: str, digest: uuid.UUID | ConsolidatedHit) -> SourceExpansion:
        """The memories (hot, or archived: summary + archive id for expand) a digest or fact hit of
        `user_id` was built from; NotFoundError when it is not this user's."""
        return await self._drive(self._expand_digest(user_id, digest))

    async def record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None = None
    ) -> int:
        """Count a use of these memories (hot ids, archive ids or hits); returns the rows updated."""
        return await self._drive(self._record_access(user_id, ids, now=now))

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
        **search: Unpack[SearchOptions],
    ) -> AssembledContext:
        """Search (with `search`'s options), then pack summaries, recent turns and snippets within the
        token budget (memory_lib.retrieval.context)."""
        return await self._drive(
            self._build_context(
                user_id,
                query,
                recent_turns,
                budget,
                summaries=summaries,
                counter=counter,
                max_tokens=max_tokens,
                **search,
            )
        )

    async def restore(
        self,
        user_id: str,
        *,
        archive_id: uuid.UUID | None = None,
        original_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> RestoreOutcome:
        """Bring an archived memory back to the hot tier now (idempotent)."""
        return await self._write(
            user_id, self._restore(user_id, archive_id=archive_id, original_id=original_id, now=now)
        )

    # -- the memory API (memory_lib.write.memory_api) and erasure (memory_lib.lifecycle.forget)

    async def get(self, user_id: str, memory_id: uuid.UUID) -> MemoryRecord | None:
        """The memory (hot, or archived: by its id or archive id) of this user, or None."""
        return await self._drive(self._get(user_id, memory_id))

    async def history(self, user_id: str, memory_id: uuid.UUID) -> list[MemoryEvent]:
        """The memory's audit events, oldest first, across hot, archived and restored states."""
        return await self._drive(self._history(user_id, memory_id))

    async def update(
        self,
        user_id: str,
        memory_id: uuid.UUID,
        content: str = api.UNSET,
        *,
        category: str = api.UNSET,
        domain: str | None = api.UNSET,
        importance: float = api.UNSET,
        tags: Sequence[str] | None = api.UNSET,
        metadata: dict[str, Any] = api.UNSET,
        pinned: bool = api.UNSET,
        allow_secrets: bool = False,
        now: datetime | None = None,
    ) -> UpdateResult:
        """Change a live hot memory: new text supersedes it with a new, re-embedded version; other
        fields change in place. Audited either way (see memory_lib.write.memory_api)."""
        return await self._write(
            user_id,
            self._update(
                user_id,
                memory_id,
                content,
                category=category,
                domain=domain,
                importance=importance,
                tags=tags,
                metadata=metadata,
                pinned=pinned,
                allow_secrets=allow_secrets,
                now=now,
            ),
        )

    async def delete(
        self, user_id: str, memory_id: uuid.UUID, *, now: datetime | None = None
    ) -> ForgetResult:
        """Delete = forget one memory: erased from every tier, table and backup version (memory_lib.lifecycle.forget)."""
        return await self.forget(user_id, memory_id, now=now)

    async def forget(
        self, user_id: str, memory_id: uuid.UUID, *, now: datetime | None = None
    ) -> ForgetResult:
        """Erase one memory and the versions it superseded; the audit log keeps a tombstone. Idempotent."""
        return await self._drive_forget(self._parts.forget(user_id, memory_id, now, one=True))

    async def forget_user(self, user_id: str, *, now: datetime | None = None) -> ForgetResult:
        """Erase every memory of the user (right to erasure). Idempotent; a re-run completes a killed one."""
        return await self._drive_forget(self._parts.forget(user_id, None, now, one=False))

    async def list(
        self,
        user_id: str,
        *,
        tier: str | None = None,
        category: str | Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        include_superseded: bool = False,
        limit: int = api.DEFAULT_PAGE,
        cursor: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> MemoryPage:
        """The user's memories, newest first, one page (keyset `cursor` from the previous page); with
        `tags`, only the memories (hot or archived) carrying every one of them."""
        return await self._drive(
            self._list(
                user_id,
                tier=tier,
                category=category,
                created_after=created_after,
                created_before=created_before,
                include_superseded=include_superseded,
                limit=limit,
                cursor=cursor,
                tags=tags,
            )
        )


# The constructor's keywords after `conn`: what connect and from_settings pass on.
CLIENT_KEYWORDS = frozenset(list(inspect.signature(AsyncMemoryClient.__init__).parameters)[2:])
