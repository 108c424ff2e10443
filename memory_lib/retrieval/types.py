"""The value types of search: filters, the validated request, hits with their scores and provenance,
results and the debug record. Plain dataclasses; they import only from memory_lib.core."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.config import RetrievalConfig
from ..core.errors import InvalidInputError
from ..core.models import CATEGORIES
from ..core.validation import normalize_tags, require_user_id

if TYPE_CHECKING:
    from .consolidated import ConsolidatedHit
    from .escalation import Escalation


@dataclass(frozen=True)
class SearchFilters:
    """Hard filters: a hit must match every one given. Times bound created_at, [since, until); the
    seen window bounds ts_seen = coalesce(last_accessed_at, created_at), [seen_since, seen_until)
    (the `ts_seen` window). `categories` filters by type (`type in (...)`), `required_tags` by tags
    (GIN). Indexes: memories_user_type_seen, memories_tags (tests/write/test_write_path_filters.py)."""

    # Any sequence of strings is accepted; __post_init__ stores a tuple.
    categories: Sequence[str] | None = None
    domains: Sequence[str] | None = None
    required_tags: Sequence[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    seen_since: datetime | None = None
    seen_until: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("categories", "domains", "required_tags"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise InvalidInputError(f"filters.{name}", value, "pass a sequence, not one string")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        for cat in self.categories or ():
            if cat not in CATEGORIES:
                raise InvalidInputError("filters.categories", cat, f"must be one of {CATEGORIES}")
        if self.required_tags is not None:
            object.__setattr__(
                self, "required_tags", normalize_tags(self.required_tags, field="filters.required_tags")
            )
        for name in ("since", "until", "seen_since", "seen_until"):  # aware, or ISO 8601 with an offset
            object.__setattr__(
                self, name, validation.optional_timestamp(f"filters.{name}", getattr(self, name))
            )
        if self.since and self.until and self.since >= self.until:
            raise InvalidInputError("filters.until", self.until, f"must be after filters.since={self.since}")
        if self.seen_since and self.seen_until and self.seen_since >= self.seen_until:
            raise InvalidInputError(
                "filters.seen_until", self.seen_until, f"must be after filters.seen_since={self.seen_since}"
            )

    def params(self) -> dict[str, Any]:
        return {
            "categories": list(self.categories) if self.categories is not None else None,
            "domains": list(self.domains) if self.domains is not None else None,
            "required_tags": Jsonb(list(self.required_tags)) if self.required_tags else None,
            "since": self.since,
            "until": self.until,
            "seen_since": self.seen_since,
            "seen_until": self.seen_until,
        }


Phase2Mode = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class SearchRequest:
    """A validated search: built by the clients after the query is embedded."""

    user_id: str
    query: str
    embedding: np.ndarray
    config: RetrievalConfig
    now: datetime
    text_query: str | None = None
    filters: SearchFilters = field(default_factory=SearchFilters)
    tags: tuple[str, ...] = ()
    include_past: bool = False
    phase2: Phase2Mode = "auto"
    hot_limit: int | None = None  # cap on hot hits (config.hot_limit when None; None there: no cap)
    archived_limit: int | None = None  # cap on archived hits, likewise; 0 turns phase 2 off
    embedding_model: str | None = None  # checked against the store's when given
    limit: int | None = None  # hits in all (config.limit when None)
    embedder_kind: str | None = (
        None  # "semantic" or "lexical" (Embedder.kind): sets the default vector weight
    )
    debug: bool = False  # fill SearchResult.debug (SearchDebug); off: no record is built
    # Audits: superseded memories (hot superseded_by, archived original_superseded_by) are candidates too,
    # and counted in the full-text statistics. Default False: search returns live memories only.
    include_superseded: bool = False

    @property
    def limits(self) -> tuple[int, int, int]:
        """(hits in all, cap on hot hits, cap on archived hits)."""
        total = self.config.limit if self.limit is None else self.limit
        hot = self.hot_limit if self.hot_limit is not None else self.config.hot_limit
        archived = self.archived_limit if self.archived_limit is not None else self.config.archived_limit
        return (
            total,
            min(total, total if hot is None else hot),
            min(total, total if archived is None else archived),
        )


def check_search_args(
    user_id: object, query: object, *, limit: int | None, archived_limit: int | None, phase2: str
) -> str:
    """Validate what can be checked before embedding the query (which may cost an API call)."""
    require_user_id(user_id)
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query", query, "must be a non-empty string")
    if "\x00" in query:
        raise InvalidInputError("query", query, "contains a NUL byte")
    for name, value in (("limit", limit), ("archived_limit", archived_limit)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1000
        ):
            raise InvalidInputError(name, value, "must be an integer between 0 and 1000")
    if phase2 not in ("auto", "always", "never"):
        raise InvalidInputError("phase2", phase2, "must be 'auto', 'always' or 'never'")
    return query


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class HitScores:
    similarity: float  # cosine of query and memory (or summary) embedding
    text_rank: float | None  # ts_rank_cd, None when the text query did not match
    vector_position: int | None  # 1-based rank in the vector candidate list
    text_position: int | None  # 1-based rank in the full-text candidate list
    rrf: float
    hybrid_similarity: float  # the fused relevance, rrf / its maximum, in [0, 1]
    recency: float
    tag_match: float
    boost: float
    final: float
    time_match: float = 0.0  # 1 when created inside a time the query names


@dataclass(frozen=True)
class Provenance:
    user_id: str
    memory_id: uuid.UUID  # the original memory's id (the same id it had while hot)
    archive_id: uuid.UUID | None  # archived_memories.id, for expand()
    created_at: datetime
    updated_at: datetime
    category: str
    domain: str | None
    tags: tuple[str, ...]
    storage_ref: str | None = None  # where the verified original lives (archived hits)
    archived_at: datetime | None = None
    # A chunk of a long text (memory_lib.write.chunking): its parent, shared by its siblings; a search
    # returns one hit per parent, its best chunk.
    parent_id: uuid.UUID | None = None
    chunk_index: int | None = None
    chunk_count: int | None = None


@dataclass(frozen=True)
class SearchHit:
    source: Literal["hot", "archived"]
    text: str  # the memory's content, or the archive's summary
    scores: HitScores
    provenance: Provenance
    # Set on archived memories surfaced by association (follow_links, memory_lib.retrieval.associations): the
    # hot hit whose entity_links name this memory. None for hits the search itself ranked.
    linked_from: uuid.UUID | None = None
    # The memory that replaced this one, hot or archived: only set on hits of a search with
    # include_superseded=True (a default search returns live memories only).
    superseded_by: uuid.UUID | None = None

    @property
    def id(self) -> uuid.UUID:
        """What to pass on: the memory id for hot hits, the archive id (for expand) for archived ones."""
        return self.provenance.archive_id or self.provenance.memory_id

    @property
    def label(self) -> str:
        if self.linked_from is not None:
            return f"[archived, linked from {self.linked_from}]"
        return "[archived]" if self.source == "archived" else ""

    @property
    def labeled_text(self) -> str:
        return (
            f"{self.label} {self.text}" if self.label and not self.text.startswith(self.label) else self.text
        )


@dataclass(frozen=True)
class SearchResult:
    hits: list[SearchHit]
    phase2_reason: str | None  # why archived memories were searched, None when they were not
    hot_candidates: int
    archived_candidates: int
    # Phase 3 (memory_lib.retrieval.escalation): digest and fact hits, and the decision recorded on every client search.
    consolidated: list[ConsolidatedHit] = field(default_factory=list)
    escalation: Escalation | None = None
    # Archived memories the hot hits link to (follow_links=True), not in `hits`: each labelled with
    # linked_from. Empty unless asked for.
    associated: list[SearchHit] = field(default_factory=list)
    # The [since, until) of original creation times phase 2 read (memory_lib.retrieval.warm), None: all of it.
    archive_scope: tuple[datetime, datetime] | None = None
    # Debug mode (RetrievalConfig.debug or search(debug=True)): candidates, scores, chosen ids. None when off.
    debug: SearchDebug | None = None

    def __iter__(self) -> Iterator[SearchHit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    @property
    def hot(self) -> list[SearchHit]:
        return [h for h in self.hits if h.source == "hot"]

    @property
    def archived(self) -> list[SearchHit]:
        return [h for h in self.hits if h.source == "archived"]


@dataclass(frozen=True)
class CandidateDebug:
    """One fused candidate: its id (as SearchHit.id), tier and every score (HitScores: the cosine, or
    its estimate for archived summaries; the full-text score; the fused relevance; the final score)."""

    id: uuid.UUID
    memory_id: uuid.UUID
    tier: Source
    scores: HitScores


@dataclass(frozen=True)
class SearchDebug:
    """Why a search returned what it did (debug mode). Invariant: chosen_ids are the ids of the result's
    hits, in order. Why tiers were searched is not copied: phase2_reason is the result's, and
    `escalation` is the result's own Escalation object (phase 3's decision and the tiers searched)."""

    phase2_reason: str | None
    # Rows each tier's statement returned, before fusion (a forced re-search of phase 3's search_warm adds
    # its rows).
    candidates_by_tier: Mapping[str, int]
    # After fusion, best first: one per memory (a long text's chunks collapse), optional floors applied.
    candidates: tuple[CandidateDebug, ...]
    chosen_ids: tuple[uuid.UUID, ...]
    escalation: Escalation | None = None
    reranker: str | None = None  # Reranker.name when a reranker reordered the hits

    @property
    def tiers_searched(self) -> tuple[str, ...]:
        if self.escalation is not None:
            return self.escalation.tiers_searched
        return ("hot", "archived") if self.phase2_reason is not None else ("hot",)


def debug_record(ranked: Sequence[SearchHit], result: SearchResult) -> SearchDebug:
    """The debug record of one ranking (the fused candidates) and the result cut from it."""
    return SearchDebug(
        phase2_reason=result.phase2_reason,
        candidates_by_tier={"hot": result.hot_candidates, "archived": result.archived_candidates},
        candidates=tuple(CandidateDebug(h.id, h.provenance.memory_id, h.source, h.scores) for h in ranked),
        chosen_ids=tuple(h.id for h in result.hits),
    )


def merge_debug(first: SearchDebug | None, again: SearchDebug | None) -> SearchDebug | None:
    """A second search's candidates (phase 3's search_warm) added to the first's, best first, one per id."""
    if first is None or again is None:
        return first
    best: dict[uuid.UUID, CandidateDebug] = {}
    for c in (*first.candidates, *again.candidates):
        if c.id not in best or c.scores.final > best[c.id].scores.final:
            best[c.id] = c
    by_tier = {
        t: first.candidates_by_tier.get(t, 0) + again.candidates_by_tier.get(t, 0)
        for t in ("hot", "archived")
    }
    ordered = sorted(best.values(), key=lambda c: (-c.scores.final, c.tier != "hot", str(c.id)))
    return replace(first, candidates_by_tier=by_tier, candidates=tuple(ordered))


def finish_debug(result: SearchResult, reranker: str | None = None) -> SearchResult:
    """The result with its debug record (if any) naming the final hits, the escalation and the reranker."""
    if result.debug is None:
        return result
    debug = replace(
        result.debug,
        chosen_ids=tuple(h.id for h in result.hits),
        escalation=result.escalation,
        phase2_reason=result.phase2_reason,
        reranker=reranker,
    )
    return replace(result, debug=debug)


Source = Literal["hot", "archived"]
