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
  all the user's memories, both tiers, not length-normalized; see _tier_ctes): a memory sharing one rare word
  with the question is a candidate, and rare words weigh more than common ones. `text_query` lets a caller send exact tokens (an
  order number) to full text with websearch syntax ("quoted phrases", `or`, `-term`: all terms
  required) and a natural question to the vector arm.
* Phase 2, archived summaries (their binary-quantized vectors' HNSW index by Hamming distance, with the
  cosine estimated from it; and their tsvector: the same two arms; a stub, sql/011, has no vector and
  is found by full text only), unless
  phase 1 is strong: `limit` hot hits that nearly restate the query (cosine >= strong_hot_similarity).
  It also runs when the caller asks for the past (`include_past`, a time window or a named time before
  the hot horizon). Mode auto/always/never. A question naming a time reads only the archive rows of
  the months it names (memory_lib.retrieval.warm). When phase 2 is needed whatever phase 1 finds (always, the
  past asked for), one statement searches both tiers: BM25 statistics read once, one round trip.
* Hot and archived candidates are ranked together, as if they were one table: reciprocal rank fusion
  over the joint vector list (by cosine) and the joint full-text list (by full-text score)::

      relevance = (wv/(k + vector_position) + wt·share/(k + text_position)) / ((wv + wt)/(k + 1))   in [0, 1]
      final = boost · (α·relevance + β·recency + γ·tag_match + δ·time_match)

  wv by embedder kind when RetrievalConfig.vector_weight is None (ranking.VECTOR_WEIGHT_BY_KIND,
  cross-validated on LoCoMo), wt 1. The full-text score is BM25 with the user's statistics plus context
  (a memory written just before or after one of the best matches gains context_weight × its score);
  share = the full-text score over the question's whole idf mass, at most 1 (its words missing from every
  memory count too), so a match on one word of a long question weighs less than a strong vector match.
  Defaults α 1, β 0, boost 1: recency and the tier only break ties, so archiving a memory does not
  bury it. recency = 0.5 ** (age_days / half_life); tag_match = share of the query's tags the memory
  carries; time_match = 1 when the memory was created inside a time the query names ("last year",
  "in May 2023", "yesterday"). No absolute cosine cut-off by default (scales differ per embedder);
  optional per-tier floors drop vector-only candidates below them (full-text matches are always kept).
* At most `limit` hits (hot_limit / archived_limit cap each tier), best first.
* Superseded memories (hot superseded_by, archived original_superseded_by) are never returned, unless
  an audit asks for them (include_superseded=True): then they are candidates too (ranked with the live
  memories' BM25 statistics), and each such hit names its replacement (SearchHit.superseded_by).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ..core.plans import Plan, Snapshot, Sql
from ..core.timescope import TimeWindow, parse_time_window
from ..observability.trace import span
from ..storage.space import SHAPE_SQL, check_shape, locked
from . import warm
from .ranking import candidate_pool, cut, rank_candidates, rerank_rows
from .sql import (
    ARCHIVED_SCOPED_SQL,
    ARCHIVED_SEARCH_SQL,
    ARCHIVED_VECTORS,
    BOTH_TIERS_SCOPED_SQL,
    BOTH_TIERS_SQL,
    HOT_SCOPED_SQL,
    HOT_SEARCH_SQL,
    SEARCH_SETTINGS_SQL,
    VectorArm,
    archived_search_sql,
    homes_of,
    pruned,
    search_session_sql,
    statement_for,
    statement_params,
)
from .types import SearchHit, SearchRequest, SearchResult, Source, debug_record


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
    params = statement_params(
        request.user_id,
        request.embedding,
        request.query,
        cfg,
        request.filters,
        text_query=request.text_query,
    )
    scope = None  # the months a question names: the only archive rows read (memory_lib.retrieval.warm)
    if cfg.archive_time_scope == "months":
        scope = warm.month_scope(window, request.filters.since, request.filters.until)
    if scope is not None:
        params |= {"scope_since": scope[0], "scope_until": scope[1]}
    yield Snapshot()
    # The lock and the settings in one round trip; the space after the lock (checked_shape_plan's order),
    # in a statement of its own: on Citus a statement that reads a distributed table (the settings) beside
    # SET LOCALs it propagates makes the next shard query fail.
    session = yield Sql(locked(search_session_sql(cfg.hnsw_ef_search)), {}, "one")
    if request.embedding_model is not None:  # a query vector from another model would rank noise
        check_shape((yield Sql(SHAPE_SQL, {}, "one")), int(request.embedding.size), request.embedding_model)
    if session["partitioned"]:  # the tiers hash-partitioned by user: each walk reads the user's partition
        session = yield Sql(
            SEARCH_SETTINGS_SQL, {"ef_search": str(cfg.hnsw_ef_search), "user_id": request.user_id}, "one"
        )
    homes = homes_of(session)
    kind = request.embedder_kind
    upfront = phase2_reason_upfront(request, window) if archived_cap > 0 else None
    if one_statement and upfront is not None and hot_cap > 0 and archived_vectors is ARCHIVED_VECTORS:
        # Phase 2 runs whatever phase 1 finds: one statement for both tiers, the same rows.
        pools = {"pool": candidate_pool(hot_cap, cfg), "archived_pool": candidate_pool(archived_cap, cfg)}
        with span(
            "retrieve",
            {
                "memory_archive.phase": "1+2",
                "memory_archive.tiers": ["hot", "archived"],
                "memory_archive.phase2.reason": upfront,
            },
        ) as s:
            both_sql = statement_for(
                BOTH_TIERS_SQL if scope is None else BOTH_TIERS_SCOPED_SQL, request, homes=homes
            )
            both = yield Sql(both_sql, params | pools)
            tiers: dict[str, list[dict[str, Any]]] = {"hot": [], "archived": []}
            for row in both:
                tiers[row.pop("tier")].append(row)
            s.set(
                {
                    "memory_archive.candidates.hot": len(tiers["hot"]),
                    "memory_archive.candidates.archived": len(tiers["archived"]),
                }
            )
        return _result(tiers["hot"], tiers["archived"], request, window, upfront, scope)
    hot_rows: list[dict[str, Any]] = []
    with span("retrieve", {"memory_archive.phase": "1", "memory_archive.tiers": ["hot"]}) as s:
        if hot_cap > 0:
            hot_sql = statement_for(HOT_SEARCH_SQL if scope is None else HOT_SCOPED_SQL, request, homes=homes)
            hot_rows = yield Sql(hot_sql, params | {"pool": candidate_pool(hot_cap, cfg)})
        hot_only = rank_candidates(
            hot_rows,
            sources=["hot"] * len(hot_rows),
            config=cfg,
            tags=request.tags,
            now=request.now,
            window=window,
            embedder_kind=kind,
            # phase2_reason reads the first hot_cap; without phase 2 the result is those (debug: all)
            limit=None if request.debug else hot_cap,
        )
        reason = phase2_reason(request, hot_only[:hot_cap], hot_cap, window) if archived_cap > 0 else None
        s.set(
            {
                "memory_archive.candidates.hot": len(hot_rows),
                "memory_archive.phase2.needed": reason is not None,
            }
        )
    archived_rows: list[dict[str, Any]] = []
    if reason is not None:
        with span(
            "retrieve",
            {
                "memory_archive.phase": "2",
                "memory_archive.tiers": ["archived"],
                "memory_archive.phase2.reason": reason,
            },
        ) as s:
            pool = candidate_pool(archived_cap, cfg)
            if archived_vectors is ARCHIVED_VECTORS:
                sql = statement_for(
                    ARCHIVED_SEARCH_SQL if scope is None else ARCHIVED_SCOPED_SQL,
                    request,
                    homes=homes,
                )
            else:
                sql = archived_search_sql(archived_vectors, include_superseded=request.include_superseded)
                sql = sql if scope is None else warm.scope_sql(sql)
                sql = pruned(sql, homes) if homes else sql
            archived_rows = yield Sql(sql, params | {"pool": pool})
            archived_rows = rerank_rows(archived_rows, archived_vectors, request.embedding, pool)
            s.set(
                {
                    "memory_archive.candidates.archived": len(archived_rows),
                    "memory_archive.archive_scoped": scope is not None,
                }
            )
    # Without phase 2 the candidates are phase 1's, already ranked: the same hits as ranking them again.
    ranked = hot_only if reason is None else None
    return _result(
        hot_rows, archived_rows, request, window, reason, scope if reason is not None else None, ranked=ranked
    )


def _result(
    hot_rows: list[dict[str, Any]],
    archived_rows: list[dict[str, Any]],
    request: SearchRequest,
    window: TimeWindow | None,
    reason: str | None,
    scope: tuple[datetime, datetime] | None = None,
    *,
    ranked: list[SearchHit] | None = None,
) -> SearchResult:
    """The result of ranking the rows of both tiers together (`ranked`: that ranking, when known)."""
    total, hot_cap, archived_cap = request.limits
    if ranked is None:
        rows = [*hot_rows, *archived_rows]
        sources: list[Source] = ["hot"] * len(hot_rows)
        sources += ["archived"] * len(archived_rows)
        ranked = rank_candidates(
            rows,
            sources=sources,
            config=request.config,
            tags=request.tags,
            now=request.now,
            window=window,
            embedder_kind=request.embedder_kind,
            # `cut` keeps the first `total` when no tier's cap is below it (debug: every candidate)
            limit=None if request.debug or min(hot_cap, archived_cap) < total else total,
        )
    result = SearchResult(
        cut(ranked, total, hot_cap, archived_cap),
        reason,
        len(hot_rows),
        len(archived_rows),
        archive_scope=scope,
    )
    return replace(result, debug=debug_record(ranked, result)) if request.debug else result
