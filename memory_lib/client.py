"""The library API agents use: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio).

Both take a connection or a pool, an Embedder and an ObjectStore. Every method's body is written once, as
a flow (memory_lib.core.plans) of the same plans (memory_lib.retrieval.search, write_path, promotion):
MemoryClient drives it with `drive`, AsyncMemoryClient with `drive_async`, so they return the same results. Every method takes the
user_id first and never reads or writes another user's rows.

    with MemoryClient.from_settings() as memory:
        memory.add("u1", "Prefers a cortado in the morning", tags=["coffee"])
        hits = memory.search("u1", "what coffee does the user like?")

A single psycopg Connection serves one thread at a time; pass a pool (`connection_pool(url)`)
to share a client between threads or tasks.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import numpy as np
from pgvector.psycopg import register_vector, register_vector_async
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .core import validation
from .core.config import ContextBudget, Settings
from .core.errors import InvalidInputError, UnknownParameterError
from .core.plans import Call, Flow, Plan, RunPlan, drive, drive_async, query_vector
from .core.rows import AsyncConn, Conn
from .core.validation import SearchParams, normalize_tags, utc_now
from .lifecycle import stubs
from .lifecycle.forget import ForgetResult, Steps, forget_steps, run_forget, run_forget_async
from .lifecycle.promotion import Expansion, RestoreOutcome, expand_flow, record_access_plan, restore_flow
from .lifecycle.reembedding import DualWriter
from .llm.embedding import Embedder, embedder_from_settings
from .observability import telemetry
from .observability.trace import SpanHandle, span
from .retrieval.consolidated import (
    ConsolidatedHit,
    Kind,
    SourceExpansion,
    active_digests_plan,
    expand_sources_plan,
)
from .retrieval.context import (
    AssembledContext,
    ContextItem,
    TokenCounter,
    Turn,
    approx_token_count,
    assemble_context,
    check_assembly_options,
    check_counter,
    check_max_tokens,
    prepare_items,
    prepare_turns,
)
from .retrieval.escalation import Evaluator, Phase3Mode, escalated_search, evaluator_from_settings
from .retrieval.rerank import Reranker
from .retrieval.types import Phase2Mode, SearchFilters, SearchHit, SearchRequest, SearchResult, finish_debug
from .storage.db import check_schema
from .storage.objectstore import ObjectStore, object_store_from_settings
from .write import chunking
from .write import memory_api as api
from .write.memory_api import MemoryEvent, MemoryPage, MemoryRecord, UpdateResult
from .write.write_judge import Candidate, LLMWriteJudge, Verdict, write_judge_from_settings
from .write.write_path import (
    AddResult,
    PreparedMemory,
    add_chunks_plan,
    add_plan,
    judge_candidates_plan,
    near_duplicate_thresholds,
    prepare_memory,
)

__all__ = [
    "AddResult",
    "ForgetResult",
    "MemoryEvent",
    "MemoryPage",
    "MemoryRecord",
    "UpdateResult",
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

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_ACTOR = "memory_lib.client"


def connection_pool(url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any) -> ConnectionPool:
    """A pool of connections configured like memory_lib.storage.db.connect (autocommit, dict rows, pgvector).

    The schema is checked first: on a database that was never migrated the pool would otherwise retry
    registering the missing `vector` type until its timeout; this raises SchemaError at once instead.
    """
    check_schema(url)
    return ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=True,
        configure=register_vector,
        kwargs={"autocommit": True, "row_factory": dict_row},
        **kwargs,
    )


def async_connection_pool(
    url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any
) -> AsyncConnectionPool:
    """The async twin of `connection_pool`; open it with `await pool.open()` (or `async with`)."""
    return AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=register_vector_async,
        kwargs={"autocommit": True, "row_factory": dict_row},
        **kwargs,
    )


@dataclass(frozen=True)
class _Parts:
    """What both clients share: configuration and the pure steps around the plans."""

    embedder: Embedder
    object_store: ObjectStore | None
    settings: Settings
    actor: str
    token_counter: TokenCounter
    evaluator: Evaluator  # phase 3's escalation decision (memory_lib.retrieval.escalation)
    reranker: Reranker | None = None  # reorders every search's hits when given (memory_lib.retrieval.rerank)
    judge: LLMWriteJudge | None = None  # the write judge (WriteConfig.judge; memory_lib.write.write_judge)

    def embed_one(self, text: str) -> np.ndarray:
        return query_vector(self.embedder.embed([text])[0], self.embedder.dim)

    def prepare_write(self, memory: PreparedMemory, supersedes: uuid.UUID | None) -> _Write:
        """Chunk (memory_lib.write.chunking) and embed a prepared memory: no database yet."""
        cfg, e = self.settings.chunking, self.embedder
        size, overlap = chunking.chunk_limits(
            cfg.max_tokens, cfg.overlap_tokens, getattr(e, "max_tokens", None)
        )
        chunks = chunking.split(memory.content, max_tokens=size, overlap=overlap)
        if len(chunks) == 1:
            return _Write(memory, chunks, [self.embed_one(memory.content)], supersedes)
        if supersedes is not None:
            raise InvalidInputError(
                "supersedes",
                str(supersedes),
                f"a text this long is stored as {len(chunks)} chunks, "
                "and chunks never supersede a memory: update() the memory with a shorter text",
            )
        return _Write(
            memory, chunks, [query_vector(v, e.dim) for v in e.embed([c.text for c in chunks])], None
        )

    def judge_plan(self, w: _Write) -> Plan[list[Candidate]] | None:
        """The read that finds what the LLM judge must see; None when no judge is asked (none configured,
        the caller named what the text supersedes, or a long text)."""
        if self.judge is None or w.supersedes is not None or len(w.chunks) > 1:
            return None
        e = self.embedder
        return judge_candidates_plan(
            w.memory,
            w.vectors[0],
            embedding_model=e.model,
            k=self.settings.write.judge_candidates,
            thresholds=near_duplicate_thresholds(self.settings.retrieval, e.model, getattr(e, "kind", None)),
        )

    def verdict(self, w: _Write, candidates: list[Candidate]) -> Verdict | None:
        """The LLM judge's verdict (it never raises: a failure is a failed verdict, and the text is added)."""
        return (
            self.judge.judge(w.memory.content, candidates) if self.judge is not None and candidates else None
        )

    def write_plan(self, w: _Write, now: datetime, verdict: Verdict | None = None) -> Plan[AddResult]:
        """The plan that stores a prepared write (memory_lib.write.write_path)."""
        e = self.embedder
        if len(w.chunks) == 1:
            return add_plan(
                w.memory,
                w.vectors[0],
                config=self.settings.retrieval,
                write=self.settings.write,
                embedder_kind=getattr(e, "kind", None),
                supersedes=w.supersedes,
                verdict=verdict,
                embedding_model=e.model,
                actor=self.actor,
                now=now,
            )
        vectors: Any = w.vectors  # one vector per chunk (add_chunks_plan zips them with the chunks)
        return add_chunks_plan(
            w.memory, w.chunks, vectors, embedding_model=e.model, actor=self.actor, now=now
        )

    def search_params(self, filters: SearchFilters | None, **kwargs: Any) -> SearchParams:
        """Every search argument validated before the query is embedded (memory_lib.core.validation)."""
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
            user_id=params.user_id,
            query=params.query,
            embedding=embedding,
            config=self.settings.retrieval,
            now=utc_now(params.now),
            text_query=params.text_query,
            filters=filters or SearchFilters(),
            tags=normalize_tags(params.tags),
            include_past=params.include_past,
            phase2=params.phase2,  # type: ignore[arg-type]
            limit=params.limit,
            archived_limit=params.archived_limit,
            embedding_model=self.embedder.model,
            embedder_kind=getattr(self.embedder, "kind", None),
            debug=self.settings.retrieval.debug if params.debug is None else params.debug,
            include_superseded=params.include_superseded,
        )

    def search_attrs(self, params: SearchParams) -> dict[str, Any]:
        """The search span's opening attributes: modes and limits, never the user or the query."""
        return {
            "memory_archive.limit": self.settings.retrieval.limit if params.limit is None else params.limit,
            "memory_archive.phase2.mode": params.phase2,
            "memory_archive.phase3.mode": params.phase3,
            "memory_archive.reranker": self.reranker_name,
        }

    @property
    def reranker_name(self) -> str | None:
        return None if self.reranker is None else getattr(self.reranker, "name", type(self.reranker).__name__)

    def rerank(self, query: str, result: SearchResult) -> SearchResult:
        """The configured reranker's order of the hits (a child span `rerank`); no reranker: unchanged."""
        if self.reranker is None:
            return result
        with span(
            "rerank",
            {
                "memory_archive.reranker": self.reranker_name,
                "memory_archive.rerank.candidates": len(result.hits),
            },
        ) as s:
            hits = self.reranker.rerank(query, result.hits)
            if s.recording:
                s.set({"memory_archive.hit_ids": [str(h.id) for h in hits]})
        return replace(result, hits=hits)

    def finish_search(self, result: SearchResult, s: SpanHandle) -> SearchResult:
        """The debug record completed (memory_lib.retrieval.types.finish_debug); the search span's outcome: ids,
        tiers and final scores only (memory_lib.observability.trace: never a text)."""
        result = finish_debug(result, self.reranker_name)
        if s.recording:
            esc = result.escalation
            s.set(
                {
                    "memory_archive.hits": len(result.hits),
                    "memory_archive.hit_ids": [str(h.id) for h in result.hits],
                    "memory_archive.hit_tiers": [str(h.source) for h in result.hits],
                    "memory_archive.hit_scores": [h.scores.final for h in result.hits],
                    "memory_archive.candidates.hot": result.hot_candidates,
                    "memory_archive.candidates.archived": result.archived_candidates,
                    "memory_archive.phase2.reason": result.phase2_reason,
                    "memory_archive.tiers_searched": list(esc.tiers_searched) if esc else None,
                    "memory_archive.phase3.action": esc.action if esc else None,
                    "memory_archive.phase3.evaluator": esc.evaluator if esc else None,
                    "memory_archive.consolidated_ids": [str(h.id) for h in result.consolidated],
                }
            )
        return result

    def update_inputs(
        self, user_id: object, memory_id: object, changes: dict[str, Any]
    ) -> tuple[str, uuid.UUID]:
        user, mid = validation.user(user_id), validation.uuid_value("memory_id", memory_id)
        api.check_update_args(changes)
        return user, mid

    def prepare_update(self, row: dict[str, Any], changes: dict[str, Any], allow_secrets: object) -> Any:
        memory = api.prepare_update(
            row, changes, allow_secrets=allow_secrets, secret_policy=self.settings.secrets
        )
        return memory, memory.content != row["content"]

    def forget(self, user_id: object, memory_id: object, now: datetime | None, *, one: bool) -> Steps:
        if one and memory_id is None:
            raise InvalidInputError(
                "memory_id", None, "is required: the memory to forget (forget_user forgets all)"
            )
        return forget_steps(self.object_store, user_id, memory_id, actor=self.actor, now=_now(now))

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
        active_digests: Sequence[ConsolidatedHit] = (),
    ) -> AssembledContext:
        """Summaries: the caller's, the active digests and phase 3's digest hits (levels 2+), archived hits
        (level 1); snippets: phase 3's facts, then hot hits (memory_lib.retrieval.context orders and trims by level)."""
        digests = {
            d.id: d for d in [*active_digests, *(h for h in result.consolidated if h.kind == "digest")]
        }
        facts = [ContextItem.from_consolidated(h) for h in result.consolidated if h.kind == "fact"]
        with span("pack") as s:
            ctx = assemble_context(
                summaries=[
                    *summaries,
                    *map(ContextItem.from_consolidated, digests.values()),
                    *result.archived,
                ],
                recent_turns=recent_turns,
                snippets=[*facts, *result.hot],
                budget=budget or self.settings.context,
                counter=counter or self.token_counter,
                max_tokens=max_tokens,
            )
            if s.recording:
                s.set(
                    {
                        "memory_archive.tokens.used": ctx.total_tokens,
                        "memory_archive.tokens.available": ctx.available,
                        "memory_archive.tokens.budget": ctx.budget.total,
                        "memory_archive.blocks": len(ctx.blocks),
                        "memory_archive.memories.offered": ctx.offered_memories,
                        "memory_archive.memories.injected": ctx.injected_memories,
                        "memory_archive.injected_ids": [
                            str(b.provenance.archive_id or b.provenance.memory_id)
                            for b in ctx.blocks
                            if b.provenance is not None
                        ],
                        "memory_archive.dropped.duplicates": ctx.dropped_duplicates,
                        "memory_archive.dropped.budget": ctx.dropped_for_budget,
                        "memory_archive.injection_hit_rate": ctx.injection_hit_rate,
                        "memory_archive.memory_token_share": ctx.memory_token_share,
                    }
                )
        telemetry.record_context(ctx)
        return ctx


def _parts(
    embedder: Embedder,
    object_store: ObjectStore | None,
    settings: Settings | None,
    actor: str,
    token_counter: TokenCounter | None,
    evaluator: Evaluator | None = None,
    reranker: Reranker | None = None,
) -> _Parts:
    if not actor or not isinstance(actor, str):
        raise InvalidInputError("actor", actor, "must be a non-empty string")
    validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    settings = settings or Settings()
    evaluator = evaluator or evaluator_from_settings(settings.retrieval.phase3_evaluator, settings.llm)
    if reranker is not None and not callable(getattr(reranker, "rerank", None)):
        raise InvalidInputError(
            "reranker", reranker, "must have a rerank(query, hits) method (memory_lib.retrieval.rerank)"
        )
    judge = write_judge_from_settings(settings.write, settings.llm)
    counter = approx_token_count if token_counter is None else check_counter(token_counter, "token_counter")
    return _Parts(embedder, object_store, settings, actor, counter, evaluator, reranker, judge)


@dataclass(frozen=True)
class _Write:
    """A text on its way in: validated, chunked and embedded."""

    memory: PreparedMemory
    chunks: list[chunking.Chunk]
    vectors: list[np.ndarray]
    supersedes: uuid.UUID | None


class _Flows:
    """Every client method's body, written once as a flow (memory_lib.core.plans): MemoryClient drives
    them with `drive`, AsyncMemoryClient with `drive_async` (blocking calls in threads). A writing flow
    returns (result, the memory ids to dual-write), the dual write coming after its transaction."""

    _parts: _Parts

    def _add(
        self,
        user_id: str,
        content: str,
        *,
        category: str,
        domain: str | None,
        importance: float,
        tags: Sequence[str] | None,
        metadata: dict[str, Any] | None,
        pinned: bool,
        entity_links: list[uuid.UUID] | None,
        allow_secrets: bool,
        ttl_days: int | None,
        supersedes: uuid.UUID | None,
        now: datetime | None,
    ) -> Flow[tuple[AddResult, list[uuid.UUID]]]:
        p = self._parts
        target = None if supersedes is None else validation.uuid_value("supersedes", supersedes)
        memory = prepare_memory(
            user_id,
            content,
            category=category,
            domain=domain,
            importance=importance,
            tags=tags,  # type: ignore[arg-type]  # prepare_memory checks what it is given
            metadata=metadata,
            pinned=pinned,
            entity_links=entity_links,
            allow_secrets=allow_secrets,
            ttl_days=ttl_days,
            secret_policy=p.settings.secrets,
        )
        w: _Write = yield Call(partial(p.prepare_write, memory, target))
        find = p.judge_plan(w)
        verdict = None
        if find is not None:
            candidates = yield RunPlan(find)
            verdict = yield Call(partial(p.verdict, w, candidates))
        result: AddResult = yield RunPlan(p.write_plan(w, _now(now), verdict))
        return result, list(result.chunk_ids) or [result.memory_id]

    def _search(
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
        phase3: Phase3Mode = "auto",
        text_query: str | None = None,
        record_access: bool = False,
        follow_links: bool = False,
        include_superseded: bool = False,
        debug: bool | None = None,
        now: datetime | None = None,
    ) -> Flow[SearchResult]:
        p = self._parts
        params = p.search_params(
            filters,
            user_id=user_id,
            query=query,
            limit=limit,
            archived_limit=archived_limit,
            tags=tags,
            include_past=include_past,
            phase2=phase2,
            phase3=phase3,
            text_query=text_query,
            record_access=record_access,
            now=now,
            follow_links=follow_links,
            debug=debug,
            include_superseded=include_superseded,
        )
        with span("memory_archive.search", p.search_attrs(params)) as s:
            request = p.search_request(params, filters, (yield Call(partial(p.embed_one, params.query))))
            result = yield from escalated_search(
                request,
                params.phase3,  # type: ignore[arg-type]
                evaluator=p.evaluator,
                embed=p.embed_one,
                follow_links=params.follow_links,
            )
            if p.reranker is not None:  # a blocking SDK or model: a call (the span context goes along)
                result = yield Call(partial(p.rerank, params.query, result))
            result = p.finish_search(result, s)
            if params.record_access and result.hits:
                yield from self._record_access(user_id, [h.id for h in result.hits], now=request.now)
        return result

    def _expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None) -> Flow[Expansion]:
        p = self._parts
        when = _now(now)
        exp: Expansion = yield from expand_flow(
            *_archive_ref(user_id, archive_id), config=p.settings.promotion, actor=p.actor, now=when
        )
        if exp.promoted:
            return exp
        summary = yield RunPlan(stubs.stub_summary_plan(exp.user_id, exp.archive_id))
        if summary is None:
            return exp
        vector = yield Call(partial(p.embed_one, summary))
        plan = stubs.restore_vector_plan(
            exp.user_id, exp.archive_id, vector, model=p.embedder.model, actor=p.actor, now=when
        )
        return replace(exp, vector_restored=(yield RunPlan(plan)))

    def _expand_digest(self, user_id: str, digest: uuid.UUID | ConsolidatedHit) -> Flow[SourceExpansion]:
        expansion: SourceExpansion = yield RunPlan(expand_sources_plan(*_consolidated_ref(user_id, digest)))
        return expansion

    def _record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None
    ) -> Flow[int]:
        n: int = yield RunPlan(record_access_plan(validation.user(user_id), _ids(ids), now=_now(now)))
        return n

    def _build_context(
        self,
        user_id: str,
        query: str,
        recent_turns: Sequence[Turn],
        budget: ContextBudget | None,
        *,
        summaries: Sequence[str | ContextItem],
        counter: TokenCounter | None,
        max_tokens: int | None,
        **search_kwargs: Any,
    ) -> Flow[AssembledContext]:
        _check_keywords("build_context", search_kwargs, _SEARCH_KEYWORDS, also=_CONTEXT_KEYWORDS)
        p = self._parts
        turns, items = p.context_inputs(recent_turns, summaries, budget, counter, max_tokens)
        with span("memory_archive.build_context"):
            result = yield from self._search(user_id, query, **search_kwargs)
            active = yield RunPlan(active_digests_plan(result_user(user_id)))
            return p.context(result, turns, items, budget, counter, max_tokens, active)

    def _restore(
        self,
        user_id: str,
        *,
        archive_id: uuid.UUID | None,
        original_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Flow[tuple[RestoreOutcome, list[uuid.UUID]]]:
        outcome: RestoreOutcome = yield from restore_flow(
            validation.user(user_id),
            archive_id=archive_id,
            original_id=original_id,
            actor=self._parts.actor,
            now=_now(now),
        )
        return outcome, [outcome.memory_id] if outcome.restored else []

    def _get(self, user_id: str, memory_id: uuid.UUID) -> Flow[MemoryRecord | None]:
        record: MemoryRecord | None = yield RunPlan(api.get_plan(user_id, memory_id))
        return record

    def _history(self, user_id: str, memory_id: uuid.UUID) -> Flow[list[MemoryEvent]]:
        events: list[MemoryEvent] = yield RunPlan(api.history_plan(user_id, memory_id))
        return events

    def _update(
        self,
        user_id: str,
        memory_id: uuid.UUID,
        content: str,
        *,
        category: str,
        domain: str | None,
        importance: float,
        tags: Sequence[str] | None,
        metadata: dict[str, Any],
        pinned: bool,
        allow_secrets: bool,
        now: datetime | None,
    ) -> Flow[tuple[UpdateResult, list[uuid.UUID]]]:
        p = self._parts
        changes = {
            "content": content,
            "category": category,
            "domain": domain,
            "importance": importance,
            "tags": tags,
            "metadata": metadata,
            "pinned": pinned,
        }
        user, mid = p.update_inputs(user_id, memory_id, changes)
        when = _now(now)
        row = yield RunPlan(api.current_plan(user, mid))
        memory, new_text = p.prepare_update(row, changes, allow_secrets)
        embedding = (yield Call(partial(p.embed_one, memory.content))) if new_text else None
        result: UpdateResult = yield RunPlan(
            api.update_plan(
                memory, mid, row, embedding, embedding_model=p.embedder.model, actor=p.actor, now=when
            )
        )
        return result, [result.memory_id] if result.outcome == "superseded" else []

    def _list(
        self,
        user_id: str,
        *,
        tier: str | None,
        category: str | Sequence[str] | None,
        created_after: datetime | None,
        created_before: datetime | None,
        include_superseded: bool,
        limit: int,
        cursor: str | None,
    ) -> Flow[MemoryPage]:
        query = api.list_query(
            user_id,
            tier=tier,
            category=category,
            created_after=created_after,
            created_before=created_before,
            include_superseded=include_superseded,
            limit=limit,
            cursor=cursor,
        )
        page: MemoryPage = yield RunPlan(api.list_plan(query))
        return page


class MemoryClient(_Flows):
    """Synchronous memory API over a psycopg Connection or ConnectionPool."""

    def __init__(
        self,
        conn: Conn | ConnectionPool[Any],
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
        self._parts = _parts(embedder, object_store, settings, actor, token_counter, evaluator, reranker)
        self._owned: list[Any] = []
        self._dual = DualWriter(embedding=self._parts.settings.embedding)

    def _dual_write(self, ids: Sequence[uuid.UUID]) -> None:
        """During a re-embedding, fill the new rows' second vectors now (memory_lib.lifecycle.reembedding); the
        backfill fills whatever this misses, so a failure here is logged, never raised."""
        try:
            with self._connection() as conn:
                self._dual.fill(conn, "hot", ids)
        except Exception:  # noqa: BLE001 - the write itself succeeded; the backfill covers these rows
            log.warning(
                "dual write of %d memories failed; the re-embedding backfill will fill them",
                len(ids),
                exc_info=True,
            )

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> MemoryClient:
        """Open the configured database (migrated already: no DDL, no lock; SchemaError otherwise), its
        embedder and object store; close() releases them."""
        from .storage.db import open_ready_database

        _check_keywords("from_settings", kwargs, _CLIENT_KEYWORDS)  # before a database is opened
        settings = settings or Settings.from_env()
        db = open_ready_database(settings)
        try:
            pool = connection_pool(db.url)
        except BaseException:
            db.close()
            raise
        try:
            client = cls(
                pool,
                embedder=kwargs.pop("embedder", None) or embedder_from_settings(settings.embedding),
                object_store=kwargs.pop("object_store", None) or object_store_from_settings(settings),
                settings=settings,
                **kwargs,
            )
        except BaseException:
            pool.close()
            db.close()
            raise
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
    def _connection(self) -> Iterator[Conn]:
        if isinstance(self._conn, ConnectionPool):
            with self._conn.connection() as conn:
                yield conn
        else:
            yield self._conn

    def _drive(self, flow: Flow[T]) -> T:
        """Each plan on a connection of its own from the pool (or the one connection), calls in this thread."""
        p = self._parts
        return drive(self._connection, flow, object_store=p.object_store, embedder=p.embedder)

    def _write(self, flow: Flow[tuple[T, list[uuid.UUID]]]) -> T:
        result, ids = self._drive(flow)
        if ids:
            self._dual_write(ids)
        return result

    def _drive_forget(self, flow: Flow[ForgetResult]) -> ForgetResult:
        """Forget runs on one connection from start to end (memory_lib.lifecycle.forget)."""
        with self._connection() as conn:
            return run_forget(conn, flow)

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
        ttl_days: int | None = None,
        supersedes: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> AddResult:
        """Remember `content` for `user_id`. Add-only: a new memory, unless it is the same text again or a
        restatement of a live memory (merged); it replaces a live memory only when that is known:
        `supersedes=<id>`, the LLM judge when one is configured, or the opt-in state rule. A long text
        is stored as chunks sharing a parent id. ttl_days: None (no TTL), 0 (pinned canonical fact) or
        N days, after which the nightly run archives it (reason ttl_expired). See memory_lib.write.write_path."""
        return self._write(
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
            )
        )

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
        phase3: Phase3Mode = "auto",
        text_query: str | None = None,
        record_access: bool = False,
        follow_links: bool = False,
        include_superseded: bool = False,
        debug: bool | None = None,
        now: datetime | None = None,
    ) -> SearchResult:
        """Hot memories first, archived summaries when needed (see memory_lib.retrieval.search). With
        record_access=True the hits count as used (access_count, last_accessed_at). With
        follow_links=True, `result.associated` holds the archived memories the hot hits link to
        (memory_lib.retrieval.associations), each labelled with the hot memory that links to it. With debug=True
        (default: retrieval.debug) `result.debug` records the candidates, their scores and the chosen ids
        (memory_lib.retrieval.types.SearchDebug); a client given a `reranker` returns the hits in its order.
        include_superseded=True (audits) returns superseded memories too, each hit's `superseded_by`
        naming the memory that replaced it; by default search returns live memories only.

        Every argument is checked first (memory_lib.core.validation): `query` and `text_query` are at most
        MAX_QUERY_CHARS (4,000) characters; `now` is an aware datetime or an ISO 8601 string with an
        offset; limits are integers in 0..1000; flags are real booleans; `filters` is a SearchFilters
        whose values are re-checked (domains and tags must be storable text)."""
        return self._drive(
            self._search(
                user_id,
                query,
                limit=limit,
                archived_limit=archived_limit,
                filters=filters,
                tags=tags,
                include_past=include_past,
                phase2=phase2,
                phase3=phase3,
                text_query=text_query,
                record_access=record_access,
                follow_links=follow_links,
                include_superseded=include_superseded,
                debug=debug,
                now=now,
            )
        )

    def expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None = None) -> Expansion:
        """The verified original of an archived memory; re-promotes it on the Nth expansion in the window.
        A stub that stays archived gets its summary vector back (its summary re-embedded, memory_lib.lifecycle.stubs):
        after the expansion's commit, so a crash in between leaves a stub the next expansion restores."""
        return self._drive(self._expand(user_id, archive_id, now=now))

    def expand_digest(self, user_id: str, digest: uuid.UUID | ConsolidatedHit) -> SourceExpansion:
        """The memories (hot, or archived: summary + archive id for expand) a digest or fact hit of
        `user_id` was built from; NotFoundError when it is not this user's."""
        return self._drive(self._expand_digest(user_id, digest))

    def record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None = None
    ) -> int:
        """Count a use of these memories (hot ids, archive ids or hits); returns the rows updated."""
        return self._drive(self._record_access(user_id, ids, now=now))

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
        return self._drive(
            self._build_context(
                user_id,
                query,
                recent_turns,
                budget,
                summaries=summaries,
                counter=counter,
                max_tokens=max_tokens,
                **search_kwargs,
            )
        )

    def restore(
        self,
        user_id: str,
        *,
        archive_id: uuid.UUID | None = None,
        original_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> RestoreOutcome:
        """Bring an archived memory back to the hot tier now (idempotent)."""
        return self._write(self._restore(user_id, archive_id=archive_id, original_id=original_id, now=now))

    # -- the memory API (memory_lib.write.memory_api) and erasure (memory_lib.lifecycle.forget)

    def get(self, user_id: str, memory_id: uuid.UUID) -> MemoryRecord | None:
        """The memory (hot, or archived: by its id or archive id) of this user, or None."""
        return self._drive(self._get(user_id, memory_id))

    def history(self, user_id: str, memory_id: uuid.UUID) -> list[MemoryEvent]:
        """The memory's audit events, oldest first, across hot, archived and restored states."""
        return self._drive(self._history(user_id, memory_id))

    def update(
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
        return self._write(
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
            )
        )

    def delete(self, user_id: str, memory_id: uuid.UUID, *, now: datetime | None = None) -> ForgetResult:
        """Delete = forget one memory: erased from every tier, table and backup version (memory_lib.lifecycle.forget)."""
        return self.forget(user_id, memory_id, now=now)

    def forget(self, user_id: str, memory_id: uuid.UUID, *, now: datetime | None = None) -> ForgetResult:
        """Erase one memory and the versions it superseded; the audit log keeps a tombstone. Idempotent."""
        return self._drive_forget(self._parts.forget(user_id, memory_id, now, one=True))

    def forget_user(self, user_id: str, *, now: datetime | None = None) -> ForgetResult:
        """Erase every memory of the user (right to erasure). Idempotent; a re-run completes a killed one."""
        return self._drive_forget(self._parts.forget(user_id, None, now, one=False))

    def list(
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
    ) -> MemoryPage:
        """The user's memories, newest first, one page (keyset `cursor` from the previous page)."""
        return self._drive(
            self._list(
                user_id,
                tier=tier,
                category=category,
                created_after=created_after,
                created_before=created_before,
                include_superseded=include_superseded,
                limit=limit,
                cursor=cursor,
            )
        )


class AsyncMemoryClient(_Flows):
    """MemoryClient's methods (the same flows) driven on asyncio, over a psycopg AsyncConnection or
    AsyncConnectionPool.

    Embedding, LLM and object storage calls (blocking SDKs) run in worker threads.
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
        self._parts = _parts(embedder, object_store, settings, actor, token_counter, evaluator, reranker)
        self._owned_pool: AsyncConnectionPool | None = None
        self._owned_db: Any = None
        self._dual = DualWriter(embedding=self._parts.settings.embedding)

    async def _dual_write(self, ids: Sequence[uuid.UUID]) -> None:
        """MemoryClient._dual_write, on asyncio."""
        try:
            async with self._connection() as conn:
                await self._dual.fill_async(conn, "hot", ids)
        except Exception:  # noqa: BLE001 - the write itself succeeded; the backfill covers these rows
            log.warning(
                "dual write of %d memories failed; the re-embedding backfill will fill them",
                len(ids),
                exc_info=True,
            )

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> AsyncMemoryClient:
        """A client over a new, opened pool to `url` (migrated already: SchemaError otherwise); close() closes it."""
        _check_keywords("connect", kwargs, _CLIENT_KEYWORDS)  # before a pool is opened
        await asyncio.to_thread(check_schema, url)
        pool = async_connection_pool(url)
        await pool.open(wait=True)
        try:
            client = cls(pool, **kwargs)
        except BaseException:
            await pool.close()
            raise
        client._owned_pool = pool
        return client

    @classmethod
    async def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> AsyncMemoryClient:
        """Like MemoryClient.from_settings: the migrated database of `settings`, checked, never changed."""
        from .storage.db import open_ready_database

        _check_keywords("from_settings", kwargs, _CLIENT_KEYWORDS)  # before a database is opened
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
    async def _connection(self) -> AsyncIterator[AsyncConn]:
        if isinstance(self._conn, AsyncConnectionPool):
            async with self._conn.connection() as conn:
                yield conn
        else:
            yield self._conn

    async def _drive(self, flow: Flow[T]) -> T:
        p = self._parts
        return await drive_async(self._connection, flow, object_store=p.object_store, embedder=p.embedder)

    async def _write(self, flow: Flow[tuple[T, list[uuid.UUID]]]) -> T:
        result, ids = await self._drive(flow)
        if ids:
            await self._dual_write(ids)
        return result

    async def _drive_forget(self, flow: Flow[ForgetResult]) -> ForgetResult:
        async with self._connection() as conn:
            return await run_forget_async(conn, flow)

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
        """As MemoryClient.add."""
        return await self._write(
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
            )
        )

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
        phase3: Phase3Mode = "auto",
        text_query: str | None = None,
        record_access: bool = False,
        follow_links: bool = False,
        include_superseded: bool = False,
        debug: bool | None = None,
        now: datetime | None = None,
    ) -> SearchResult:
        """As MemoryClient.search."""
        return await self._drive(
            self._search(
                user_id,
                query,
                limit=limit,
                archived_limit=archived_limit,
                filters=filters,
                tags=tags,
                include_past=include_past,
                phase2=phase2,
                phase3=phase3,
                text_query=text_query,
                record_access=record_access,
                follow_links=follow_links,
                include_superseded=include_superseded,
                debug=debug,
                now=now,
            )
        )

    async def expand(self, user_id: str, archive_id: uuid.UUID, *, now: datetime | None = None) -> Expansion:
        """As MemoryClient.expand."""
        return await self._drive(self._expand(user_id, archive_id, now=now))

    async def expand_digest(self, user_id: str, digest: uuid.UUID | ConsolidatedHit) -> SourceExpansion:
        """As MemoryClient.expand_digest."""
        return await self._drive(self._expand_digest(user_id, digest))

    async def record_access(
        self, user_id: str, ids: Sequence[uuid.UUID | SearchHit], *, now: datetime | None = None
    ) -> int:
        """As MemoryClient.record_access."""
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
        **search_kwargs: Any,
    ) -> AssembledContext:
        """As MemoryClient.build_context."""
        return await self._drive(
            self._build_context(
                user_id,
                query,
                recent_turns,
                budget,
                summaries=summaries,
                counter=counter,
                max_tokens=max_tokens,
                **search_kwargs,
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
        """As MemoryClient.restore."""
        return await self._write(
            self._restore(user_id, archive_id=archive_id, original_id=original_id, now=now)
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
            )
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
    ) -> MemoryPage:
        """The user's memories, newest first, one page (keyset `cursor` from the previous page)."""
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
            )
        )


# The keywords a method passes on (build_context to search, from_settings and connect to the client's
# constructor): an unknown one is refused naming the public method, never the internal one it reaches.
_SEARCH_KEYWORDS = frozenset(list(inspect.signature(_Flows._search).parameters)[3:])  # after user_id, query
_CONTEXT_KEYWORDS = frozenset(["recent_turns", "budget", "summaries", "counter", "max_tokens"])
_CLIENT_KEYWORDS = frozenset(list(inspect.signature(MemoryClient.__init__).parameters)[2:])  # after conn


def _check_keywords(
    method: str, given: Mapping[str, Any], known: frozenset[str], *, also: frozenset[str] = frozenset()
) -> None:
    """UnknownParameterError (an InvalidInputError and a TypeError) for a keyword `method` does not take;
    `also`: its own parameters, offered as suggestions too."""
    for name, value in given.items():
        if name not in known:
            raise UnknownParameterError(method, name, value, known | also)


def _ids(ids: Sequence[uuid.UUID | SearchHit]) -> list[uuid.UUID]:
    if isinstance(ids, (str, uuid.UUID, SearchHit)):
        ids = [ids]
    if isinstance(ids, (bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidInputError("ids", ids, "must be a sequence of memory ids, archive ids or hits")
    return [i.id if isinstance(i, SearchHit) else validation.uuid_value("ids", i) for i in ids]


def _now(now: datetime | str | None) -> datetime:
    """`now` as aware UTC (an ISO 8601 string with an offset is accepted, see memory_lib.core.validation)."""
    return utc_now(validation.optional_timestamp("now", now))


def result_user(user_id: object) -> str:
    return validation.user(user_id)


def _consolidated_ref(user_id: object, digest: object) -> tuple[str, Kind, uuid.UUID]:
    """(user, kind, id): a ConsolidatedHit says its kind; a bare id is a digest's."""
    if isinstance(digest, ConsolidatedHit):
        return validation.user(user_id), digest.kind, digest.id
    return validation.user(user_id), "digest", validation.uuid_value("digest", digest)


def _archive_ref(user_id: object, archive_id: object) -> tuple[str, uuid.UUID]:
    return validation.user(user_id), validation.uuid_value("archive_id", archive_id)
