"""Every client method's body, written once as a flow (memory_lib.core.plans), and what the flows share.

AsyncMemoryClient drives a flow with `drive_async` (blocking calls in threads), MemoryClient (generated
from it) with `drive`: both run the same SQL and the same control flow. A writing flow returns (result,
the memory ids to dual-write), the dual write coming after its transaction (memory_lib.lifecycle.reembedding).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, TypedDict, Unpack

import numpy as np

from ..core import validation
from ..core.config import ContextBudget, Settings
from ..core.errors import InvalidInputError, UnknownParameterError
from ..core.plans import Call, Flow, RunPlan
from ..core.validation import SearchParams, normalize_tags, utc_now
from ..lifecycle import stubs
from ..lifecycle.forget import Steps, forget_steps
from ..lifecycle.promotion import Expansion, RestoreOutcome, expand_flow, record_access_plan, restore_flow
from ..lifecycle.reembedding import DualWriter
from ..llm.embedding import Embedder
from ..observability.trace import span
from ..retrieval import search_spans
from ..retrieval.consolidated import (
    ConsolidatedHit,
    Kind,
    SourceExpansion,
    active_digests_plan,
    expand_sources_plan,
)
from ..retrieval.context import (
    AssembledContext,
    ContextItem,
    TokenCounter,
    Turn,
    approx_token_count,
    check_context_inputs,
    check_counter,
    pack_search_result,
)
from ..retrieval.escalation import Evaluator, Phase3Mode, escalated_search, evaluator_from_settings
from ..retrieval.rerank import Reranker
from ..retrieval.types import Phase2Mode, SearchFilters, SearchHit, SearchRequest, SearchResult
from ..storage.objectstore import ObjectStore
from ..write import ingest
from ..write import memory_api as api
from ..write.memory_api import MemoryEvent, MemoryPage, MemoryRecord, UpdateResult
from ..write.write_judge import LLMWriteJudge, write_judge_from_settings
from ..write.write_path import AddResult, prepare_memory

DEFAULT_ACTOR = "memory_lib.client"


class SearchOptions(TypedDict, total=False):
    """The keywords of `search` (and of `build_context`, which passes them on); their defaults and checks
    are memory_lib.core.validation.SearchParams'. See AsyncMemoryClient.search for what each does."""

    limit: int | None
    archived_limit: int | None
    filters: SearchFilters | None
    tags: Sequence[str] | None
    include_past: bool
    phase2: Phase2Mode
    phase3: Phase3Mode
    text_query: str | None
    record_access: bool
    follow_links: bool
    include_superseded: bool
    debug: bool | None
    now: datetime | None


# The keywords a method passes on (search and build_context to the search flow, from_settings and connect
# to the client's constructor): an unknown one is refused naming the public method, never an internal one.
SEARCH_KEYWORDS = frozenset(SearchOptions.__annotations__)
CONTEXT_KEYWORDS = frozenset(["recent_turns", "budget", "summaries", "counter", "max_tokens"])


def check_keywords(
    method: str, given: Mapping[str, Any], known: frozenset[str], *, also: frozenset[str] = frozenset()
) -> None:
    """UnknownParameterError (an InvalidInputError and a TypeError) for a keyword `method` does not take;
    `also`: its own parameters, offered as suggestions too."""
    for name, value in given.items():
        if name not in known:
            raise UnknownParameterError(method, name, value, known | also)


@dataclass(frozen=True)
class Parts:
    """What both clients share: their configuration, checked once when the client is built."""

    embedder: Embedder
    object_store: ObjectStore | None
    settings: Settings
    actor: str
    token_counter: TokenCounter
    evaluator: Evaluator  # phase 3's escalation decision (memory_lib.retrieval.escalation)
    reranker: Reranker | None  # reorders every search's hits when given (memory_lib.retrieval.rerank)
    judge: LLMWriteJudge | None  # the write judge (WriteConfig.judge; memory_lib.write.write_judge)
    dual: DualWriter  # fills second vectors during a re-embedding (memory_lib.lifecycle.reembedding)

    def embed_one(self, text: str) -> np.ndarray:
        return ingest.embed_one(self.embedder, text)

    def search_params(
        self, user_id: str, query: str, options: SearchOptions
    ) -> tuple[SearchParams, SearchFilters | None]:
        """Every search argument validated before the query is embedded (memory_lib.core.validation)."""
        given: dict[str, Any] = dict(options)
        filters = given.pop("filters", None)
        params = validation.validated(SearchParams, {"user_id": user_id, "query": query, **given})
        if filters is not None:
            if not isinstance(filters, SearchFilters):
                raise InvalidInputError("filters", filters, "must be a SearchFilters")
            validation.check_filters(filters)
        return params, filters

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

    def forget(self, user_id: object, memory_id: object, now: datetime | None, *, one: bool) -> Steps:
        if one and memory_id is None:
            raise InvalidInputError(
                "memory_id", None, "is required: the memory to forget (forget_user forgets all)"
            )
        return forget_steps(self.object_store, user_id, memory_id, actor=self.actor, now=_now(now))


def build_parts(
    embedder: Embedder,
    object_store: ObjectStore | None,
    settings: Settings | None,
    actor: str,
    token_counter: TokenCounter | None,
    evaluator: Evaluator | None = None,
    reranker: Reranker | None = None,
) -> Parts:
    """A client's configuration checked (InvalidInputError naming the argument) and its LLM roles built."""
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
    return Parts(
        embedder,
        object_store,
        settings,
        actor,
        counter,
        evaluator,
        reranker,
        judge,
        DualWriter(embedding=settings.embedding),
    )


class Flows:
    """One flow per client method; the clients drive them (see the module docstring)."""

    _parts: Parts

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
        e, settings = p.embedder, p.settings
        w: ingest.PreparedWrite = yield Call(
            partial(ingest.prepare_write, memory, target, embedder=e, settings=settings)
        )
        find = ingest.judge_plan(w, judge=p.judge, embedder=e, settings=settings)
        verdict = None
        if find is not None:
            candidates = yield RunPlan(find)
            verdict = yield Call(partial(ingest.judge_verdict, p.judge, w, candidates))
        result: AddResult = yield RunPlan(
            ingest.write_plan(w, embedder=e, settings=settings, actor=p.actor, now=_now(now), verdict=verdict)
        )
        return result, list(result.chunk_ids) or [result.memory_id]

    def _search(self, user_id: str, query: str, **options: Unpack[SearchOptions]) -> Flow[SearchResult]:
        check_keywords("search", options, SEARCH_KEYWORDS)
        p = self._parts
        params, filters = p.search_params(user_id, query, options)
        with span(
            "memory_archive.search", search_spans.search_attrs(params, p.settings.retrieval, p.reranker)
        ) as s:
            request = p.search_request(params, filters, (yield Call(partial(p.embed_one, params.query))))
            result = yield from escalated_search(
                request,
                params.phase3,  # type: ignore[arg-type]
                evaluator=p.evaluator,
                embed=p.embed_one,
                follow_links=params.follow_links,
            )
            if p.reranker is not None:  # a blocking SDK or model: a call (the span context goes along)
                result = yield Call(partial(search_spans.rerank, p.reranker, params.query, result))
            result = search_spans.finish_search(result, s, p.reranker)
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
        **search: Unpack[SearchOptions],
    ) -> Flow[AssembledContext]:
        check_keywords("build_context", search, SEARCH_KEYWORDS, also=CONTEXT_KEYWORDS)
        p = self._parts
        turns, items = check_context_inputs(recent_turns, summaries, budget, counter, max_tokens)
        with span("memory_archive.build_context"):
            result = yield from self._search(user_id, query, **search)
            active = yield RunPlan(active_digests_plan(validation.user(user_id)))
            return pack_search_result(
                result,
                turns,
                items,
                budget=budget or p.settings.context,
                counter=counter or p.token_counter,
                max_tokens=max_tokens,
                active_digests=active,
            )

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
        user, mid = validation.user(user_id), validation.uuid_value("memory_id", memory_id)
        api.check_update_args(changes)
        when = _now(now)
        row = yield RunPlan(api.current_plan(user, mid))
        memory = api.prepare_update(
            row, changes, allow_secrets=allow_secrets, secret_policy=p.settings.secrets
        )
        new_text = memory.content != row["content"]
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
        tags: Sequence[str] | None,
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
            tags=tags,
        )
        page: MemoryPage = yield RunPlan(api.list_plan(query))
        return page


def _ids(ids: Sequence[uuid.UUID | SearchHit]) -> list[uuid.UUID]:
    if isinstance(ids, (str, uuid.UUID, SearchHit)):
        ids = [ids]
    if isinstance(ids, (bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidInputError("ids", ids, "must be a sequence of memory ids, archive ids or hits")
    return [i.id if isinstance(i, SearchHit) else validation.uuid_value("ids", i) for i in ids]


def _now(now: datetime | str | None) -> datetime:
    """`now` as aware UTC (an ISO 8601 string with an offset is accepted, see memory_lib.core.validation)."""
    return utc_now(validation.optional_timestamp("now", now))


def _consolidated_ref(user_id: object, digest: object) -> tuple[str, Kind, uuid.UUID]:
    """(user, kind, id): a ConsolidatedHit says its kind; a bare id is a digest's."""
    if isinstance(digest, ConsolidatedHit):
        return validation.user(user_id), digest.kind, digest.id
    return validation.user(user_id), "digest", validation.uuid_value("digest", digest)


def _archive_ref(user_id: object, archive_id: object) -> tuple[str, uuid.UUID]:
    return validation.user(user_id), validation.uuid_value("archive_id", archive_id)
