"""The search statements: the vector arms (hot HNSW cosine, archived binary-quantized Hamming) and the
lexical arm (an OR of the query's English lexemes, ranked BM25-like over all the user's memories).

One statement shape per case (hot, archived, both tiers, month-scoped, with superseded memories for
audits), with NULL-able filter parameters, so the plans never build SQL per query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import warm

if TYPE_CHECKING:
    from .types import SearchRequest


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
    category="m.category",
    domain="m.domain",
    metadata="m.metadata",
    created="m.created_at",
    seen="m.last_accessed_at",
)
ARCHIVED_FILTERS = _FILTERS.format(
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
    where: str = "true"  # rows the arm may return (stubs have no vector: memory_lib.lifecycle.stubs)


HOT_VECTORS = VectorArm(
    "vector", "m.embedding <=> %(embedding)s::vector", "1 - (m.embedding <=> %(embedding)s::vector)"
)

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
    hot_live, archived_live = (
        ("", "")
        if include_superseded
        else ("AND sm.superseded_by IS NULL ", "AND sa.original_superseded_by IS NULL ")
    )
    return f"""q AS MATERIALIZED (SELECT {_TSQUERY} AS tsq), terms AS MATERIALIZED (
        SELECT DISTINCT quote_literal(l)::tsquery AS tq
        FROM unnest(tsvector_to_array(to_tsvector('english', %(text_query)s))) AS l
        WHERE NOT %(websearch)s AND %(bm25)s
    ), n AS MATERIALIZED (
        -- N, the user's memories: index-only counts, superseded ones included and each tier counted up to
        -- N_CAP (a filter on superseded_by made it a table scan: 200 ms at 100k hot). N only sets the
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


# A term in more than DF_CAP of a user's memories is "common": counted up to the cap only, and not
# used to find candidates when the query has rarer terms. At most MATCH_CAP full-text matches are
# scored per tier (search bench: 10k hot + 40k archived templated memories).
DF_CAP = 250
MATCH_CAP = 500
N_CAP = 20_000


_HOT_TIER = _Tier(
    table="memories",
    alias="m",
    arm=HOT_VECTORS,
    tsv="m.content_tsv",
    live="m.superseded_by IS NULL",
    filters=_HOT_FILTERS,
    select="""m.id AS memory_id, NULL::uuid AS archive_id, m.user_id, m.content AS text, m.created_at,
           m.updated_at, m.category, m.domain, m.metadata -> 'tags' AS tags, NULL::text AS storage_ref,
           NULL::timestamptz AS archived_at, m.metadata -> 'chunk' AS chunk, m.superseded_by""",
    pool="pool",
)
HOT_SEARCH_SQL = _tier_sql(_HOT_TIER)


def _archived_tier(arm: VectorArm, pool: str, include_superseded: bool = False) -> _Tier:
    return _Tier(
        table="archived_memories",
        alias="a",
        arm=arm,
        tsv=_ARCHIVED_TSV.format(a="a"),
        live="true" if include_superseded else "a.original_superseded_by IS NULL",
        filters=ARCHIVED_FILTERS,
        select=ARCHIVED_SELECT,
        pool=pool,
    )


def archived_search_sql(arm: VectorArm, *, include_superseded: bool = False) -> str:
    """Phase 2's statement for one way of storing summary vectors (ARCHIVED_VECTORS is the schema's);
    include_superseded: superseded archive rows are candidates too."""
    return _tier_sql(_archived_tier(arm, "pool", include_superseded), include_superseded)


# A stub shows its stub text (memory_lib.lifecycle.stubs.stub_text); its full-text entry is the whole summary's.
ARCHIVED_SELECT = """a.original_id AS memory_id, a.id AS archive_id, a.user_id,
           CASE WHEN a.stubbed_at IS NULL THEN a.summary ELSE '[archived] ' || left(a.summary, 200) END AS text,
           a.original_created_at AS created_at, a.original_updated_at AS updated_at,
           a.original_category AS category, a.original_domain AS domain, a.metadata -> 'tags' AS tags,
           a.storage_ref, a.archived_at, a.metadata -> 'chunk' AS chunk,
           a.original_superseded_by AS superseded_by"""
ARCHIVED_SEARCH_SQL = archived_search_sql(ARCHIVED_VECTORS)
# When phase 2 is known to be needed before phase 1 runs (phase2="always", the past asked for), both
# tiers go in one statement: same candidates and ranking, BM25 statistics counted once.
BOTH_TIERS_SQL = _both_tiers_sql(_HOT_TIER, _archived_tier(ARCHIVED_VECTORS, "archived_pool"))
# Month-scoped phase 2 (memory_lib.retrieval.warm): the same statements reading only the months asked for. Phase 1
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


def statement_for(sql: str, request: SearchRequest) -> str:
    """The statement to run: `sql` itself, or its include_superseded twin when the request asks for it."""
    return WITH_SUPERSEDED_SQL[sql] if request.include_superseded else sql
