"""Two-phase hybrid search, and the query plans shared by the sync and async clients.

A *plan* is a generator that yields operations (`Sql`, `GetVerified`) and receives their results;
`run_plan` executes one on a psycopg Connection, `run_plan_async` on an AsyncConnection, each inside
one transaction. The SQL text, the control flow and the ranking live once, here and in the other
plan modules (write_path, promotion), so both clients return the same results by construction
(psycopg 3 drives its own protocol the same way).

Search for one user, seeing one snapshot (the plan runs REPEATABLE READ when it opens the transaction,
and hits are de-duplicated by original id, so a concurrent archival cannot show a memory twice):

* Phase 1, hot memories: the `pool` nearest by cosine (HNSW, `hnsw.ef_search` from config, iterative
  scan so filters cannot starve the result) and the `pool` best full-text matches. Full text is an OR
  of the query's English lexemes (stop words dropped, stems), ranked BM25-like (idf of each term among
  all the user's memories, both tiers, length-normalized; see _tier_sql): a memory sharing one rare word
  with the question is a candidate, and rare words weigh more than common ones. `text_query` lets a caller send exact tokens (an
  order number) to full text with websearch syntax ("quoted phrases", `or`, `-term`: all terms
  required) and a natural question to the vector arm.
* Phase 2, archived summaries (their binary-quantized vectors' HNSW index by Hamming distance, with the
  cosine estimated from it; and their tsvector: the same two arms; a stub, sql/011, has no vector and
  is found by full text only), unless
  phase 1 is strong: `limit` hot hits that nearly restate the query (cosine >= strong_hot_similarity).
  It also runs when the caller asks for the past (`include_past`, a time window or a named time before
  the hot horizon). Mode auto/always/never. A question naming a time reads only the archive rows of
  the months it names (memory_lib.warm). When phase 2 is needed whatever phase 1 finds (always, the
  past asked for), one statement searches both tiers: BM25 statistics counted once, one round trip.
* Hot and archived candidates are ranked together, as if they were one table: reciprocal rank fusion
  over the joint vector list (by cosine) and the joint full-text list (by full-text score)::

      relevance = (wv/(k + vector_position) + wt/(k + text_position)) / ((wv + wt)/(k + 1))   in [0, 1]
      final = boost · (α·relevance + β·recency + γ·tag_match + δ·time_match)

  wv is 1 for semantic embedders and ¼ for lexical ones (RetrievalConfig.vector_weight None), wt 1.
  Defaults α 1, β 0, boost 1: recency and the tier only break ties, so archiving a memory does not
  bury it. recency = 0.5 ** (age_days / half_life); tag_match = share of the query's tags the memory
  carries; time_match = 1 when the memory was created inside a time the query names ("last year",
  "in May 2023", "yesterday"). No absolute cosine cut-off by default (scales differ per embedder);
  optional per-tier floors drop vector-only candidates below them (full-text matches are always kept).
* At most `limit` hits (hot_limit / archived_limit cap each tier), best first.
* Superseded memories (hot superseded_by, archived original_superseded_by) are never returned, unless
  an audit asks for them (include_superseded=True): then they are candidates too, counted in the BM25
  statistics, and each such hit names its replacement (SearchHit.superseded_by).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from psycopg import errors as psycopg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import validation, warm
from .config import RetrievalConfig
from .errors import EmbeddingMismatchError, InvalidInputError, embedding_mismatch_reason
from .models import CATEGORIES
from .timescope import TimeWindow, parse_time_window
from .trace import span

if TYPE_CHECKING:
    import psycopg

    from .consolidated_search import ConsolidatedHit
    from .embedding import Embedder
    from .escalation import Escalation
    from .objectstore import ObjectStore

T = TypeVar("T")

# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class Sql:
    """One statement. fetch: 'all' rows, 'one' row (or None), or 'rowcount'."""

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

    Applied only when run_plan opens the transaction; inside a caller's transaction the caller's
    isolation level stands (SET TRANSACTION must come before any query). Returns None."""


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
            "embedder", None, f"this operation re-embeds a text into {op.model!r} ({op.dim}-d): pass that embedder"
        )
    if embedder.model != op.model or embedder.dim != op.dim:
        raise EmbeddingMismatchError(
            "embedder.model", embedder.model, embedding_mismatch_reason(op.model, op.dim, embedder.model, embedder.dim)
        )
    return query_vector(embedder.embed([op.text])[0], op.dim)


def _stale_prepared(exc: BaseException) -> bool:
    """A statement psycopg prepared (after 5 runs) whose result columns changed since: DDL such as a
    re-embedding's start/flip/drop (memory_lib.reembedding). Postgres refuses it on every later run."""
    return isinstance(exc, psycopg_errors.FeatureNotSupported) and "cached plan must not change result type" in str(exc)


_DEALLOCATE = "DEALLOCATE ALL"  # psycopg forgets its prepared statements too when it sees this succeed


def run_plan(conn: psycopg.Connection, plan: Plan[T], *, object_store: ObjectStore | None = None,
             embedder: Embedder | None = None) -> T:  # fmt: skip
    """Execute `plan` on a sync connection in one transaction (a savepoint if one is open). A prepared
    statement made stale by DDL fails this run and is deallocated, so the next run works."""
    try:
        return _run_plan(conn, plan, object_store=object_store, embedder=embedder)
    except Exception as exc:
        if _stale_prepared(exc) and conn.info.transaction_status == _IDLE:
            conn.execute(_DEALLOCATE)
        raise


def _run_plan(conn: psycopg.Connection, plan: Plan[T], *, object_store: ObjectStore | None,
              embedder: Embedder | None) -> T:  # fmt: skip
    outermost = conn.info.transaction_status == _IDLE
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            try:  # StopIteration must not reach the transaction block: it would roll back
                op = next(plan)
                while True:
                    if isinstance(op, Snapshot):
                        if outermost:
                            cur.execute(_SNAPSHOT_SQL)
                        result: Any = None
                    elif isinstance(op, Sql):
                        cur.execute(op.query, op.params)
                        result = (
                            cur.fetchall()
                            if op.fetch == "all"
                            else cur.fetchone()
                            if op.fetch == "one"
                            else cur.rowcount
                        )
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
    conn: psycopg.AsyncConnection, plan: Plan[T], *, object_store: ObjectStore | None = None,
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
    conn: psycopg.AsyncConnection, plan: Plan[T], *, object_store: ObjectStore | None,
    embedder: Embedder | None,
) -> T:
    outermost = conn.info.transaction_status == _IDLE
    try:
        async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            try:
                op = next(plan)
                while True:
                    result: Any
                    if isinstance(op, Snapshot):
                        if outermost:
                            await cur.execute(_SNAPSHOT_SQL)
                        result = None
                    elif isinstance(op, Sql):
                        await cur.execute(op.query, op.params)
                        if op.fetch == "all":
                            result = await cur.fetchall()
                        elif op.fetch == "one":
                            result = await cur.fetchone()
                        else:
                            result = cur.rowcount
                    elif isinstance(op, EmbedText):
                        result = await asyncio.to_thread(_embed, embedder, op)
                    else:
                        result = await asyncio.to_thread(_store(object_store).read_ref, op.storage_ref, op.sha256)
                    op = plan.send(result)
            except StopIteration as stop:
                value: T = stop.value
    finally:
        plan.close()
    return value


# --------------------------------------------------------------------------- input checks


def require_user_id(user_id: object) -> str:
    """Every call names its user: a missing or blank user_id is an error, never 'all users'."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id", user_id, "is required: a non-empty string")
    if "\x00" in user_id or len(user_id) > 200:
        raise InvalidInputError("user_id", user_id, "must be at most 200 characters without NUL bytes")
    return user_id


def normalize_tags(tags: Sequence[str] | None, *, field: str = "tags") -> tuple[str, ...]:
    """Tags compare case-insensitively: stripped, casefolded, unique, sorted."""
    if tags is None:
        return ()
    if isinstance(tags, str):
        raise InvalidInputError(field, tags, "pass a sequence of tags, not one string")
    out: set[str] = set()
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or "\x00" in tag or len(tag) > 100:
            raise InvalidInputError(
                field, tag, "each tag must be a non-empty string of at most 100 characters"
            )
        out.add(" ".join(tag.split()).casefold())
    return tuple(sorted(out))


@dataclass(frozen=True)
class SearchFilters:
    """Hard filters: a hit must match every one given. Times bound created_at, [since, until); the
    seen window bounds ts_seen = coalesce(last_accessed_at, created_at), [seen_since, seen_until)
    (seed 004's `ts_seen window`). `categories` is seed 004's `type in (...)`, `required_tags` its tags
    filter (GIN). Indexes: memories_user_type_seen, memories_tags (tests/test_write_path_filters.py)."""

    categories: tuple[str, ...] | None = None
    domains: tuple[str, ...] | None = None
    required_tags: tuple[str, ...] | None = None
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
            object.__setattr__(self, name, validation.optional_timestamp(f"filters.{name}", getattr(self, name)))
        if self.since and self.until and self.since >= self.until:
            raise InvalidInputError("filters.until", self.until, f"must be after filters.since={self.since}")
        if self.seen_since and self.seen_until and self.seen_since >= self.seen_until:
            raise InvalidInputError("filters.seen_until", self.seen_until,
                                    f"must be after filters.seen_since={self.seen_since}")  # fmt: skip

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
    embedder_kind: str | None = None  # "semantic" or "lexical" (Embedder.kind): sets the default vector weight
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
        return total, min(total, total if hot is None else hot), min(total, total if archived is None else archived)


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
    # A chunk of a long text (memory_lib.chunking): its parent, shared by its siblings; a search
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
    # Set on archived memories surfaced by association (follow_links, memory_lib.associations): the
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
        return f"{self.label} {self.text}" if self.label and not self.text.startswith(self.label) else self.text


@dataclass(frozen=True)
class SearchResult:
    hits: list[SearchHit]
    phase2_reason: str | None  # why archived memories were searched, None when they were not
    hot_candidates: int
    archived_candidates: int
    # Phase 3 (memory_lib.escalation): digest and fact hits, and the decision recorded on every client search.
    consolidated: list[ConsolidatedHit] = field(default_factory=list)
    escalation: Escalation | None = None
    # Archived memories the hot hits link to (follow_links=True), not in `hits`: each labelled with
    # linked_from. Empty unless asked for.
    associated: list[SearchHit] = field(default_factory=list)
    # The [since, until) of original creation times phase 2 read (memory_lib.warm), None: all of it.
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
    by_tier = {t: first.candidates_by_tier.get(t, 0) + again.candidates_by_tier.get(t, 0)
               for t in ("hot", "archived")}  # fmt: skip
    ordered = sorted(best.values(), key=lambda c: (-c.scores.final, c.tier != "hot", str(c.id)))
    return replace(first, candidates_by_tier=by_tier, candidates=tuple(ordered))


def finish_debug(result: SearchResult, reranker: str | None = None) -> SearchResult:
    """The result with its debug record (if any) naming the final hits, the escalation and the reranker."""
    if result.debug is None:
        return result
    debug = replace(result.debug, chosen_ids=tuple(h.id for h in result.hits), escalation=result.escalation,
                    phase2_reason=result.phase2_reason, reranker=reranker)  # fmt: skip
    return replace(result, debug=debug)


# --------------------------------------------------------------------------- SQL

# Static text with NULL-able parameters: one statement shape, whichever filters are used.
_FILTERS = """
      AND (%(categories)s::text[] IS NULL OR {category} = ANY(%(categories)s::text[]))
      AND (%(domains)s::text[] IS NULL OR {domain} = ANY(%(domains)s::text[]))
      AND (%(required_tags)s::jsonb IS NULL OR {metadata} -> 'tags' @> %(required_tags)s::jsonb)
      AND (%(since)s::timestamptz IS NULL OR {created} >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR {created} < %(until)s::timestamptz)
      AND (%(seen_since)s::timestamptz IS NULL OR coalesce({seen}, {created}) >= %(seen_since)s::timestamptz)
      AND (%(seen_until)s::timestamptz IS NULL OR coalesce({seen}, {created}) < %(seen_until)s::timestamptz)"""

_HOT_FILTERS = _FILTERS.format(
    category="m.category", domain="m.domain", metadata="m.metadata", created="m.created_at",
    seen="m.last_accessed_at",
)  # fmt: skip
_ARCHIVED_FILTERS = _FILTERS.format(
    category="a.original_category",
    domain="a.original_domain",
    metadata="a.metadata",
    created="a.original_created_at",
    seen="a.last_accessed_at",
)

# pgvector 0.8: iterative index scans keep walking the HNSW graph until enough rows pass the WHERE
# clause (user_id and filters), instead of returning fewer than LIMIT.
SEARCH_SETTINGS_SQL = """
    SELECT set_config('hnsw.ef_search', %(ef_search)s, true),
           set_config('hnsw.iterative_scan', 'relaxed_order', true)"""

# The full-text query. A natural question becomes an OR of its English lexemes (stemmed, stop words
# dropped): websearch_to_tsquery ANDs every term and matched ~15% of LoCoMo questions at all, the OR
# query ranked by ts_rank_cd reaches BM25-level recall (shared notes). Lexemes are quoted, so any
# text is safe. An explicit text_query keeps websearch syntax: the caller asked for those tokens.
_TSQUERY = """(SELECT CASE WHEN %(websearch)s THEN websearch_to_tsquery('english', %(text_query)s)
        ELSE (SELECT string_agg(quote_literal(l), ' | ')::tsquery
              FROM unnest(tsvector_to_array(to_tsvector('english', %(text_query)s))) AS l) END)"""


@dataclass(frozen=True)
class VectorArm:
    """How a tier's vector arm finds rows and scores them, as SQL over alias a/m and %(embedding)s.

    `distance` orders the candidates (ascending, served by the tier's HNSW index); `similarity` is the
    cosine to the query, or an estimate on the same scale: hot and archived candidates share one vector
    ranking. With `rerank`, the arm fetches `oversample` × pool candidates, `rerank(rerank_column value,
    query)` gives each its similarity, and the best pool of them stay vector candidates.
    """

    name: str
    distance: str
    similarity: str
    oversample: int = 1
    rerank_column: str = "NULL"
    rerank: Callable[[Any, np.ndarray], float] | None = None
    where: str = "true"  # rows the arm may return (stubs have no vector: memory_lib.stubs)


HOT_VECTORS = VectorArm("vector", "m.embedding <=> %(embedding)s::vector",
                        "1 - (m.embedding <=> %(embedding)s::vector)")  # fmt: skip

# 007: one bit per dimension (the sign). For sign bits of a random direction, P(bit differs) = angle/π,
# so cos(π · hamming / dim) estimates the cosine (SimHash); HNSW orders by hamming itself.
# 011: a stub has no bits; it is reachable by full text only (similarity 0 when found that way).
ARCHIVED_VECTORS = VectorArm(
    "bit",
    "a.summary_bits <~> binary_quantize(%(embedding)s::vector)",
    "coalesce(cos(pi() * (a.summary_bits <~> binary_quantize(%(embedding)s::vector)) / bit_length(a.summary_bits)), 0)",
    where="a.summary_bits IS NOT NULL",
)

# The archived summary's tsvector: an expression (007 indexes it with GIN), not a stored column.
_ARCHIVED_TSV = "to_tsvector('english'::regconfig, {a}.summary)"


@dataclass(frozen=True)
class _Tier:
    table: str
    alias: str
    arm: VectorArm
    tsv: str
    live: str
    filters: str
    select: str
    pool: str  # the parameter holding this tier's candidate pool size


# BM25 statistics of the query's terms over ALL the user's memories (both tiers): computed once per
# statement, shared by the tiers when one statement searches both. Document frequencies count live
# memories, or every memory with include_superseded (the rows that statement can return).
def _bm25_prelude(include_superseded: bool = False) -> str:
    hot_live, archived_live = ("", "") if include_superseded else (
        "AND sm.superseded_by IS NULL ", "AND sa.original_superseded_by IS NULL ")  # fmt: skip
    return f"""q AS MATERIALIZED (SELECT {_TSQUERY} AS tsq), terms AS MATERIALIZED (
        SELECT DISTINCT quote_literal(l)::tsquery AS tq
        FROM unnest(tsvector_to_array(to_tsvector('english', %(text_query)s))) AS l
        WHERE NOT %(websearch)s AND %(bm25)s
    ), n AS MATERIALIZED (
        -- N, the user's memories: index-only counts, superseded ones included and each tier counted up to
        -- _N_CAP (a filter on superseded_by made it a table scan: 200 ms at 100k hot). N only sets the
        -- idf scale: a term's weight still falls with its document frequency.
        SELECT ((SELECT count(*) FROM (SELECT 1 FROM memories sm WHERE sm.user_id = %(user_id)s
                                       LIMIT %(n_cap)s) AS s)
              + (SELECT count(*) FROM (SELECT 1 FROM archived_memories sa WHERE sa.user_id = %(user_id)s
                                       LIMIT %(n_cap)s) AS s))::float8 AS n
        WHERE EXISTS (SELECT 1 FROM terms)
    ), df AS MATERIALIZED (
        SELECT t.tq,
               (SELECT count(*) FROM (SELECT 1 FROM memories sm WHERE sm.user_id = %(user_id)s
                    {hot_live}AND sm.content_tsv @@ t.tq LIMIT %(df_cap)s) AS s)::float8
             + (SELECT count(*) FROM (SELECT 1 FROM archived_memories sa WHERE sa.user_id = %(user_id)s
                    {archived_live}AND {_ARCHIVED_TSV.format(a="sa")} @@ t.tq
                    LIMIT %(df_cap)s) AS s)
               AS df
        FROM terms t
    ), idf AS MATERIALIZED (
        SELECT df.tq, ln(1 + (n.n - df.df + 0.5) / (df.df + 0.5)) AS w FROM df CROSS JOIN n
    ), sel AS MATERIALIZED (
        -- Match on the selective terms (df under the cap) when there are any: a term in most memories
        -- would make every memory a candidate. The common terms still count in the score.
        SELECT CASE WHEN %(websearch)s OR NOT %(bm25)s OR NOT EXISTS (SELECT 1 FROM df WHERE df < %(df_cap)s)
                    THEN (SELECT tsq FROM q)
                    ELSE (SELECT string_agg(df.tq::text, ' | ')::tsquery FROM df WHERE df < %(df_cap)s) END AS tsq
    )"""


_BM25_PRELUDE = _bm25_prelude()


def _tier_ctes(t: _Tier) -> str:
    """One tier's candidates: the `pool` nearest by cosine and the `pool` best full-text matches.

    Full-text score of an OR query (bm25 mode): Σ idf(term) over the query terms a memory contains, with
    BM25's length normalization (k1 1.2, b 0.75; tf taken as 1, memories are short) against the mean
    length of the matching memories; idf = ln(1 + (N - df + 0.5) / (df + 0.5)) over ALL the user's
    memories, hot and archived (GIN-index counts per term, capped), so scores of both tiers compare and
    one ranking can merge them. ts_rank_cd breaks ties. websearch mode: ts_rank_cd.
    """
    a, arm = t.alias, t.arm
    user_live = f"{a}.user_id = %(user_id)s AND {t.live}"
    return f"""{a}_hits AS MATERIALIZED (
        -- The tsvector once per match (for archive rows it is computed from the summary), then scored.
        SELECT {a}.id, {t.tsv} AS tsv, sel.tsq
        FROM {t.table} {a}, sel
        WHERE sel.tsq IS NOT NULL AND {user_live} AND {t.tsv} @@ sel.tsq {t.filters}
        LIMIT %(match_cap)s
    ), {a}_matched AS (
        SELECT h.id, length(h.tsv)::float8 AS dl, ts_rank_cd(h.tsv, h.tsq) AS cd,
               (SELECT coalesce(sum(i.w), 0) FROM idf i WHERE h.tsv @@ i.tq) AS idf_sum
        FROM {a}_hits h
    ), {a}_txt AS (
        SELECT id, idf_sum * 2.2 / (1 + 1.2 * (0.25 + 0.75 * dl / greatest(avg(dl) OVER (), 1))) + 1e-3 * cd
                   AS text_rank
        FROM {a}_matched
        ORDER BY text_rank DESC, id LIMIT %({t.pool})s
    ), {a}_vec AS (
        SELECT {a}.id FROM {t.table} {a}
        WHERE {user_live} AND {arm.where} {t.filters}
        ORDER BY {arm.distance} LIMIT %({t.pool})s * {arm.oversample}
    ), {a}_candidates AS (
        SELECT id FROM {a}_vec UNION SELECT id FROM {a}_txt
    )"""


def _tier_select(t: _Tier) -> str:
    a = t.alias
    return f"""SELECT {t.select},
           {t.arm.similarity} AS similarity, {t.arm.rerank_column} AS rerank,
           v.id IS NOT NULL AS in_vector, x.text_rank
    FROM {a}_candidates c JOIN {t.table} {a} ON {a}.id = c.id
         LEFT JOIN {a}_vec v ON v.id = c.id LEFT JOIN {a}_txt x ON x.id = c.id
    WHERE {a}.user_id = %(user_id)s"""


def _tier_sql(t: _Tier, include_superseded: bool = False) -> str:
    return f"WITH {_bm25_prelude(include_superseded)}, {_tier_ctes(t)}\n    {_tier_select(t)}"


def _both_tiers_sql(hot: _Tier, archived: _Tier, include_superseded: bool = False) -> str:
    """Both tiers in one statement: the BM25 statistics once, one round trip, one plan. Rows carry `tier`."""
    return f"""WITH {_bm25_prelude(include_superseded)}, {_tier_ctes(hot)}, {_tier_ctes(archived)}
    SELECT 'hot' AS tier, h.* FROM ({_tier_select(hot)}) h
    UNION ALL
    SELECT 'archived' AS tier, x.* FROM ({_tier_select(archived)}) x"""


# A term in more than _DF_CAP of a user's memories is "common": counted up to the cap only, and not
# used to find candidates when the query has rarer terms. At most _MATCH_CAP full-text matches are
# scored per tier (search bench: 10k hot + 40k archived templated memories).
_DF_CAP = 250
_MATCH_CAP = 500
_N_CAP = 20_000


_HOT_TIER = _Tier(
    table="memories", alias="m", arm=HOT_VECTORS, tsv="m.content_tsv",
    live="m.superseded_by IS NULL", filters=_HOT_FILTERS,
    select="""m.id AS memory_id, NULL::uuid AS archive_id, m.user_id, m.content AS text, m.created_at,
           m.updated_at, m.category, m.domain, m.metadata -> 'tags' AS tags, NULL::text AS storage_ref,
           NULL::timestamptz AS archived_at, m.metadata -> 'chunk' AS chunk, m.superseded_by""",
    pool="pool",
)  # fmt: skip
HOT_SEARCH_SQL = _tier_sql(_HOT_TIER)

def _archived_tier(arm: VectorArm, pool: str, include_superseded: bool = False) -> _Tier:
    return _Tier(table="archived_memories", alias="a", arm=arm, tsv=_ARCHIVED_TSV.format(a="a"),
                 live="true" if include_superseded else "a.original_superseded_by IS NULL",
                 filters=_ARCHIVED_FILTERS, select=_ARCHIVED_SELECT, pool=pool)  # fmt: skip


def archived_search_sql(arm: VectorArm, *, include_superseded: bool = False) -> str:
    """Phase 2's statement for one way of storing summary vectors (ARCHIVED_VECTORS is the schema's);
    include_superseded: superseded archive rows are candidates too."""
    return _tier_sql(_archived_tier(arm, "pool", include_superseded), include_superseded)


# A stub shows its stub text (memory_lib.stubs.stub_text); its full-text entry is the whole summary's.
_ARCHIVED_SELECT = """a.original_id AS memory_id, a.id AS archive_id, a.user_id,
           CASE WHEN a.stubbed_at IS NULL THEN a.summary ELSE '[archived] ' || left(a.summary, 200) END AS text,
           a.original_created_at AS created_at, a.original_updated_at AS updated_at,
           a.original_category AS category, a.original_domain AS domain, a.metadata -> 'tags' AS tags,
           a.storage_ref, a.archived_at, a.metadata -> 'chunk' AS chunk,
           a.original_superseded_by AS superseded_by"""
ARCHIVED_SEARCH_SQL = archived_search_sql(ARCHIVED_VECTORS)
# When phase 2 is known to be needed before phase 1 runs (phase2="always", the past asked for), both
# tiers go in one statement: same candidates and ranking, BM25 statistics counted once.
BOTH_TIERS_SQL = _both_tiers_sql(_HOT_TIER, _archived_tier(ARCHIVED_VECTORS, "archived_pool"))
# Month-scoped phase 2 (memory_lib.warm): the same statements reading only the months asked for. Phase 1
# is scoped too: its BM25 statistics count the same archive rows as phase 2's, so the tiers' scores compare.
HOT_SCOPED_SQL = warm.scope_sql(HOT_SEARCH_SQL)
ARCHIVED_SCOPED_SQL = warm.scope_sql(ARCHIVED_SEARCH_SQL)
BOTH_TIERS_SCOPED_SQL = warm.scope_sql(BOTH_TIERS_SQL)
# search(include_superseded=True), for audits: each statement above reading superseded memories too
# (hot and archived), its full-text statistics counting them as well. Keyed by the default statement.
_HOT_TIER_ALL = replace(_HOT_TIER, live="true")
_ARCHIVED_ALL_SQL = archived_search_sql(ARCHIVED_VECTORS, include_superseded=True)
_BOTH_ALL_SQL = _both_tiers_sql(_HOT_TIER_ALL, _archived_tier(ARCHIVED_VECTORS, "archived_pool", True), True)
WITH_SUPERSEDED_SQL = {
    HOT_SEARCH_SQL: _tier_sql(_HOT_TIER_ALL, True),
    ARCHIVED_SEARCH_SQL: _ARCHIVED_ALL_SQL,
    BOTH_TIERS_SQL: _BOTH_ALL_SQL,
    HOT_SCOPED_SQL: warm.scope_sql(_tier_sql(_HOT_TIER_ALL, True)),
    ARCHIVED_SCOPED_SQL: warm.scope_sql(_ARCHIVED_ALL_SQL),
    BOTH_TIERS_SCOPED_SQL: warm.scope_sql(_BOTH_ALL_SQL),
}


def _statement(sql: str, request: SearchRequest) -> str:
    """The statement to run: `sql` itself, or its include_superseded twin when the request asks for it."""
    return WITH_SUPERSEDED_SQL[sql] if request.include_superseded else sql


SHAPE_SQL = """
    SELECT (SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim') AS dim,
           (SELECT value FROM memory_archive_settings WHERE key = 'embedding_model') AS model"""


# A re-embedding flip (memory_lib.reembedding) renames the vector columns and changes the settings in one
# transaction holding ACCESS EXCLUSIVE locks on these tables. Taking ACCESS SHARE on them BEFORE reading
# the settings makes a statement wait for a flip in progress and then see its settings and columns
# together. LOCK takes no snapshot, so in a REPEATABLE READ plan the snapshot is taken after it.
LOCK_VECTOR_TABLES = Sql(
    "LOCK TABLE memories, archived_memories, memory_digests, memory_facts IN ACCESS SHARE MODE", {}, "rowcount"
)


def checked_shape_plan(dim: int, model: str) -> Plan[dict[str, Any]]:
    """The embedder must match the database's active embedding space: same dimension, and the model
    recorded on first write (or made active by a re-embedding flip). Locks the vector tables first
    (LOCK_VECTOR_TABLES): the rest of the plan's statements see the space that was checked."""
    yield LOCK_VECTOR_TABLES
    row = yield Sql(SHAPE_SQL, {}, "one")
    if row["dim"] is None:
        raise EmbeddingMismatchError("embedding_dim", None, "the schema is not initialized: run migrations")
    if int(row["dim"]) != dim or (row["model"] is not None and row["model"] != model):
        field, value = ("embedder.dim", dim) if int(row["dim"]) != dim else ("embedder.model", model)
        raise EmbeddingMismatchError(field, value, embedding_mismatch_reason(row["model"], int(row["dim"]), model, dim))
    return row



# --------------------------------------------------------------------------- ranking (pure)


def recency_decay(updated_at: datetime, now: datetime, half_life_days: float) -> float:
    """1 for a memory updated now, ½ after one half-life; future timestamps count as now."""
    age_days = max((now - updated_at).total_seconds() / 86400.0, 0.0)
    return 0.5 ** (age_days / half_life_days)


def tag_match(query_tags: Sequence[str], memory_tags: Sequence[str]) -> float:
    if not query_tags:
        return 0.0
    have = set(memory_tags)
    return sum(1 for t in query_tags if t in have) / len(query_tags)


def _positions(rows: Sequence[Mapping[str, Any]], key: str, include: str | None) -> dict[int, int]:
    """1-based rank of each row index by `key` descending (ties by memory id), among rows where `include`."""
    chosen = [i for i, r in enumerate(rows) if (r[include] if include else r[key] is not None)]
    chosen.sort(key=lambda i: (-float(rows[i][key]), str(rows[i]["memory_id"])))
    return {i: pos for pos, i in enumerate(chosen, start=1)}


Source = Literal["hot", "archived"]


def resolved_vector_weight(config: RetrievalConfig, embedder_kind: str | None) -> float:
    """config.vector_weight, or by embedder: a lexical (hashing) embedder's vector list mostly repeats
    X"""
    if config.vector_weight is not None:
        return config.vector_weight
    return 0.25 if embedder_kind == "lexical" else 1.0


def rank_candidates(
    rows: Sequence[Mapping[str, Any]],
    *,
    sources: Sequence[Source],
    config: RetrievalConfig,
    tags: Sequence[str],
    now: datetime,
    window: TimeWindow | None = None,
    embedder_kind: str | None = None,
) -> list[SearchHit]:
    """Fuse and score the candidates of both tiers together (formula in the module docstring), best first.

    rows[i] comes from tier sources[i]. A vector-only candidate below its tier's optional cosine floor
    is dropped; a full-text match is always kept. Rows with the same original id (a memory seen hot and
    archived by a concurrent archival), and chunks of one parent, collapse to the better one.
    """
    k = config.rrf_k
    wv, wt = resolved_vector_weight(config, embedder_kind), config.text_weight
    vec_pos = _positions(rows, "similarity", "in_vector")
    txt_pos = _positions(rows, "text_rank", None)
    rrf_max = (wv + wt) / (k + 1)
    hits: list[SearchHit] = []
    for i, row in enumerate(rows):
        source = sources[i]
        similarity = float(row["similarity"])
        matched_text = row["text_rank"] is not None
        floor = config.hot_similarity_threshold if source == "hot" else config.archived_similarity_threshold
        if floor is not None and similarity < floor and not matched_text:
            continue
        vp, tp = vec_pos.get(i), txt_pos.get(i)
        rrf = (wv / (k + vp) if vp else 0.0) + (wt / (k + tp) if tp else 0.0)
        relevance = rrf / rrf_max
        memory_tags = tuple(row["tags"]) if isinstance(row["tags"], list) else ()
        recency = recency_decay(row["updated_at"], now, config.recency_half_life_days)
        tags_score = tag_match(tags, memory_tags)
        in_window = 1.0 if window is not None and window.contains(row["created_at"]) else 0.0
        boost = config.active_boost if source == "hot" else 1.0
        base = (
            config.alpha_similarity * relevance
            + config.beta_recency * recency
            + config.gamma_tags * tags_score
            + config.delta_time * in_window
        )
        scores = HitScores(
            similarity=similarity,
            text_rank=float(row["text_rank"]) if matched_text else None,
            vector_position=vp,
            text_position=tp,
            rrf=rrf,
            hybrid_similarity=relevance,
            recency=recency,
            tag_match=tags_score,
            boost=boost,
            final=boost * base,
            time_match=in_window,
        )
        chunk = row.get("chunk") if isinstance(row.get("chunk"), dict) else None
        provenance = Provenance(
            user_id=row["user_id"],
            memory_id=row["memory_id"],
            archive_id=row["archive_id"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            category=row["category"],
            domain=row["domain"],
            tags=memory_tags,
            storage_ref=row["storage_ref"],
            archived_at=row["archived_at"],
            parent_id=uuid.UUID(chunk["parent_id"]) if chunk else None,
            chunk_index=chunk["index"] if chunk else None,
            chunk_count=chunk["count"] if chunk else None,
        )
        superseded_by = row.get("superseded_by")
        hits.append(SearchHit(source, row["text"], scores, provenance, superseded_by=superseded_by))
    seen: set[uuid.UUID] = set()
    unique = []
    for hit in sort_hits(hits):  # the best hit of each memory, and of each long text's chunks
        key = hit.provenance.parent_id or hit.provenance.memory_id
        if key not in seen:
            seen.add(key)
            unique.append(hit)
    return unique


def sort_hits(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """Best first; ties go to hot hits, then to the more recent, then by id (deterministic)."""
    return sorted(
        hits, key=lambda h: (-h.scores.final, h.source != "hot", -h.scores.recency, str(h.id))
    )


def cut(hits: Sequence[SearchHit], total: int, hot_cap: int, archived_cap: int) -> list[SearchHit]:
    """The best `total` hits with at most hot_cap hot and archived_cap archived ones."""
    out: list[SearchHit] = []
    left = {"hot": hot_cap, "archived": archived_cap}
    for hit in hits:
        if len(out) >= total:
            break
        if left[hit.source] > 0:
            left[hit.source] -= 1
            out.append(hit)
    return out


def phase2_reason_upfront(request: SearchRequest, window: TimeWindow | None = None) -> str | None:
    """Why archived memories must be searched whatever phase 1 finds, or None (then phase1 decides)."""
    if request.phase2 == "never":
        return None
    if request.phase2 == "always":
        return "always"
    if request.include_past:
        return "past_requested"
    horizon = request.now - timedelta(days=request.config.hot_horizon_days)
    f = request.filters
    if (f.since is not None and f.since < horizon) or (f.until is not None and f.until <= horizon):
        return "window_before_hot_horizon"
    if window is not None and window.since < horizon:
        return "query_names_the_past"
    return None


def phase2_reason(
    request: SearchRequest, hot_hits: Sequence[SearchHit], limit: int, window: TimeWindow | None = None
) -> str | None:
    """Why archived memories must be searched too, or None: in auto mode, unless phase 1 is strong."""
    if request.phase2 == "never":
        return None
    upfront = phase2_reason_upfront(request, window)
    if upfront is not None:
        return upfront
    if len(hot_hits) < limit:
        return "too_few_hot_hits"
    floor = request.config.hot_similarity_threshold
    if floor is not None and not any(h.scores.similarity >= floor for h in hot_hits):
        return "none_above_threshold"
    strong = request.config.strong_hot_similarity
    if sum(1 for h in hot_hits if h.scores.similarity >= strong) < limit:
        return "weak_hot_hits"
    return None


def candidate_pool(limit: int, config: RetrievalConfig) -> int:
    """How many candidates each arm of the hybrid search fetches before fusion."""
    return max(limit * config.candidates_per_hit, config.min_candidates)


def rerank_rows(rows: Sequence[dict[str, Any]], arm: VectorArm, query: np.ndarray, pool: int) -> list[dict[str, Any]]:
    """With arm.rerank: every row's similarity from its compact vector; the best `pool` of the vector
    candidates stay vector candidates, the others only as full-text matches (or not at all)."""
    if arm.rerank is None:
        return list(rows)
    out = [r | {"similarity": arm.rerank(r["rerank"], query)} for r in rows]
    vec = sorted((r for r in out if r["in_vector"]), key=lambda r: (-r["similarity"], str(r["memory_id"])))
    for r in vec[pool:]:
        r["in_vector"] = False
    return [r for r in out if r["in_vector"] or r["text_rank"] is not None]


def search_plan(
    request: SearchRequest, *, archived_vectors: VectorArm = ARCHIVED_VECTORS, one_statement: bool = True
) -> Plan[SearchResult]:
    """Phase 1, phase 2 when needed, one ranking. Read-only, one snapshot.

    When phase 2 is needed whatever phase 1 finds (phase2_reason_upfront), both tiers are searched by
    one statement (one_statement=False: two, as in auto mode); the hits are the same either way.
    archived_vectors: how archive rows store summary vectors; the default is the schema's (007). Other
    arms need their own columns (bench footprint adds them to compare representations)."""
    cfg = request.config
    total, hot_cap, archived_cap = request.limits
    window = parse_time_window(request.query, request.now)
    explicit = request.text_query is not None and request.text_query.strip() != ""
    params = {
        "user_id": request.user_id,
        "embedding": request.embedding,
        "text_query": request.text_query if explicit else request.query,
        "websearch": explicit,
        "bm25": cfg.text_ranking == "bm25",
        "df_cap": _DF_CAP,
        "match_cap": _MATCH_CAP,
        "n_cap": _N_CAP,
        **request.filters.params(),
    }
    scope = None  # the months a question names: the only archive rows read (memory_lib.warm)
    if cfg.archive_time_scope == "months":
        scope = warm.month_scope(window, request.filters.since, request.filters.until)
    if scope is not None:
        params |= {"scope_since": scope[0], "scope_until": scope[1]}
    yield Snapshot()
    if request.embedding_model is not None:  # a query vector from another model would rank noise
        yield from checked_shape_plan(int(request.embedding.size), request.embedding_model)
    else:
        yield LOCK_VECTOR_TABLES
    yield Sql(SEARCH_SETTINGS_SQL, {"ef_search": str(cfg.hnsw_ef_search)}, "one")
    kind = request.embedder_kind
    upfront = phase2_reason_upfront(request, window) if archived_cap > 0 else None
    if one_statement and upfront is not None and hot_cap > 0 and archived_vectors is ARCHIVED_VECTORS:
        # Phase 2 runs whatever phase 1 finds: one statement for both tiers, the same rows.
        pools = {"pool": candidate_pool(hot_cap, cfg), "archived_pool": candidate_pool(archived_cap, cfg)}
        with span("retrieve", {"memory_archive.phase": "1+2", "memory_archive.tiers": ["hot", "archived"],
                               "memory_archive.phase2.reason": upfront}) as s:  # fmt: skip
            both_sql = _statement(BOTH_TIERS_SQL if scope is None else BOTH_TIERS_SCOPED_SQL, request)
            both = yield Sql(both_sql, params | pools)
            tiers: dict[str, list[dict[str, Any]]] = {"hot": [], "archived": []}
            for row in both:
                tiers[row.pop("tier")].append(row)
            s.set({"memory_archive.candidates.hot": len(tiers["hot"]),
                   "memory_archive.candidates.archived": len(tiers["archived"])})  # fmt: skip
        return _result(tiers["hot"], tiers["archived"], request, window, upfront, scope)
    hot_rows: list[dict[str, Any]] = []
    with span("retrieve", {"memory_archive.phase": "1", "memory_archive.tiers": ["hot"]}) as s:
        if hot_cap > 0:
            hot_sql = _statement(HOT_SEARCH_SQL if scope is None else HOT_SCOPED_SQL, request)
            hot_rows = yield Sql(hot_sql, params | {"pool": candidate_pool(hot_cap, cfg)})
        hot_only = rank_candidates(hot_rows, sources=["hot"] * len(hot_rows), config=cfg, tags=request.tags,
                                   now=request.now, window=window, embedder_kind=kind)  # fmt: skip
        reason = phase2_reason(request, hot_only[:hot_cap], hot_cap, window) if archived_cap > 0 else None
        s.set({"memory_archive.candidates.hot": len(hot_rows), "memory_archive.phase2.needed": reason is not None})
    archived_rows: list[dict[str, Any]] = []
    if reason is not None:
        with span("retrieve", {"memory_archive.phase": "2", "memory_archive.tiers": ["archived"],
                               "memory_archive.phase2.reason": reason}) as s:  # fmt: skip
            pool = candidate_pool(archived_cap, cfg)
            if archived_vectors is ARCHIVED_VECTORS:
                sql = _statement(ARCHIVED_SEARCH_SQL if scope is None else ARCHIVED_SCOPED_SQL, request)
            else:
                sql = archived_search_sql(archived_vectors, include_superseded=request.include_superseded)
                sql = sql if scope is None else warm.scope_sql(sql)
            archived_rows = yield Sql(sql, params | {"pool": pool})
            archived_rows = rerank_rows(archived_rows, archived_vectors, request.embedding, pool)
            s.set({"memory_archive.candidates.archived": len(archived_rows),
                   "memory_archive.archive_scoped": scope is not None})  # fmt: skip
    return _result(hot_rows, archived_rows, request, window, reason, scope if reason is not None else None)


def _result(hot_rows: list[dict[str, Any]], archived_rows: list[dict[str, Any]], request: SearchRequest,
            window: TimeWindow | None, reason: str | None,
            scope: tuple[datetime, datetime] | None = None) -> SearchResult:  # fmt: skip
    total, hot_cap, archived_cap = request.limits
    rows = [*hot_rows, *archived_rows]
    sources: list[Source] = ["hot"] * len(hot_rows) + ["archived"] * len(archived_rows)
    ranked = rank_candidates(rows, sources=sources, config=request.config, tags=request.tags, now=request.now,
                             window=window, embedder_kind=request.embedder_kind)  # fmt: skip
    result = SearchResult(cut(ranked, total, hot_cap, archived_cap), reason, len(hot_rows), len(archived_rows),
                          archive_scope=scope)  # fmt: skip
    return replace(result, debug=debug_record(ranked, result)) if request.debug else result


def utc_now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    return validation.optional_timestamp("now", now).astimezone(UTC)


def query_vector(embedding: Any, dim: int) -> np.ndarray:
    vec = np.asarray(embedding, dtype=np.float32).reshape(-1)
    if vec.size != dim or not np.isfinite(vec).all() or not math.isfinite(float(np.linalg.norm(vec))):
        raise InvalidInputError("query embedding", f"shape={vec.shape}", f"must be {dim} finite floats")
    return vec
