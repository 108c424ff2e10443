"""The search statements: the vector arms (hot HNSW cosine, archived binary-quantized Hamming) and the
lexical arm (an OR of the query's English lexemes, ranked by BM25 with the user's statistics).

One statement shape per case (hot, archived, both tiers, month-scoped, with superseded memories for
audits), with NULL-able filter parameters, so the plans never build SQL per query.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from ..storage.packs import ref_sql
from . import warm

if TYPE_CHECKING:
    from ..core.config import RetrievalConfig
    from .types import SearchFilters, SearchRequest


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
# clause (user_id and filters), instead of returning fewer than LIMIT. Every read of a search goes
# through an index by design; without sequential scans the planner cannot trade the HNSW walk of a
# large user (the vector arm's second branch) for a scan and sort of the whole table, which it costs
# lower than pgvector's graph walk at any size we measured.
# No parallel workers: every read of a search is bounded (a graph walk, at most match_cap matches, an exact
# scan of at most a tier's exact threshold), so workers only add their start-up. The planner gave the
# exact branch of a large user's archive (100,000 rows among 400,000) a Gather Merge of 2 workers, which
# started even when that branch did not run: 4-6 ms on a statement that takes 3-7 ms without them
# (bench search at 100k).
SEARCH_SETTINGS_SQL = """
    SELECT set_config('hnsw.ef_search', %(ef_search)s, true),
           set_config('hnsw.iterative_scan', 'relaxed_order', true),
           set_config('enable_seqscan', 'off', true),
           set_config('max_parallel_workers_per_gather', '0', true),
           t.partitioned,
           -- On tiers partitioned by user: the partition holding the user's rows of each tier (NULL when
           -- the user has none there, and then no graph walk runs), which the walk reads directly.
           CASE WHEN t.partitioned THEN (SELECT m.tableoid::regclass::text FROM memories m
                                         WHERE m.user_id = %(user_id)s LIMIT 1) END AS hot_home,
           CASE WHEN t.partitioned THEN (SELECT a.tableoid::regclass::text FROM archived_memories a
                                         WHERE a.user_id = %(user_id)s LIMIT 1) END AS archived_home
    FROM (SELECT c.relkind = 'p' AS partitioned FROM pg_class c WHERE c.oid = 'memories'::regclass) AS t"""


# What a search runs with, as one round trip (simple protocol: no parameters, so ef_search is written
# in): whether the tiers are partitioned by user (the row: the first statement's), then the settings of
# SEARCH_SETTINGS_SQL as SET LOCAL. On a distributed database (Citus) a setting must be a SET LOCAL, after
# citus.propagate_set_commands = 'local', to reach the workers that run the search; on one node that
# first one is an unused placeholder setting. The partitions holding the user's rows are read by
# SEARCH_SETTINGS_SQL only when the tiers are partitioned.
def search_session_sql(ef_search: int) -> str:
    return f"""SELECT c.relkind = 'p' AS partitioned FROM pg_class c WHERE c.oid = 'memories'::regclass;
    SET LOCAL citus.propagate_set_commands = 'local';
    SET LOCAL hnsw.ef_search = {int(ef_search)};
    SET LOCAL hnsw.iterative_scan = relaxed_order;
    SET LOCAL enable_seqscan = off;
    SET LOCAL max_parallel_workers_per_gather = 0"""


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

    `distance` (a number) orders the candidates (ascending, served by the tier's HNSW index when the
    user's rows are above the tier's exact threshold); `similarity` is the cosine to the query, or an
    estimate on the same scale: hot and archived candidates share one vector ranking. With `rerank`, the
    arm fetches `oversample` × pool candidates, `rerank(rerank_column value, query)` gives each its
    similarity, and the best pool of them stay vector candidates.
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

# An archive row's full-text document (sql/020's archive_document, written out: the same text as the
# GIN index archived_user_lexemes, so the planner matches them): the summary's lexemes and the
# fingerprint, the original's lexemes the summary lacks.
_ARCHIVED_TSV = "(to_tsvector('english'::regconfig, {a}.summary) || coalesce({a}.lexemes, ''::tsvector))"


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
    exact_max: str  # the parameter: up to this many rows of the user, the vector arm is exact
    size: str  # at least the number of positions of a row's document (bounds its ts_rank_cd)
    created: str  # when the memory was written (context: its neighbours in time)
    key: str  # the tie-break of `created` order, as the tier's (user, created) index sorts it


# The query's terms with the user's BM25 statistics: document frequencies from user_term_stats and N
# from user_corpus_stats (both kept exact on write by sql/020's triggers, over the user's live
# memories of both tiers), so a search reads one row per query term and one per user, never the
# user's postings lists to count them. Shared by the tiers when one statement searches both.
def _bm25_prelude(include_superseded: bool = False) -> str:
    # An audit search (include_superseded) also matches terms only superseded memories hold (df 0 in
    # the live statistics, which still rank it).
    only_live = "false" if include_superseded else "true"
    return f"""q AS MATERIALIZED (SELECT {_TSQUERY} AS tsq), corpus AS MATERIALIZED (
        SELECT greatest(coalesce(max(us.docs), 0), 1)::float8 AS n
        FROM user_corpus_stats us WHERE us.user_id = %(user_id)s
    ), idf AS MATERIALIZED (
        SELECT t.tq, row_number() OVER () AS n, coalesce(s.df, 0)::float8 AS df,
               ln(1 + (c.n - coalesce(s.df, 0) + 0.5) / (coalesce(s.df, 0) + 0.5)) AS w
        FROM (SELECT DISTINCT l, quote_literal(l)::tsquery AS tq
              FROM unnest(tsvector_to_array(to_tsvector('english', %(text_query)s))) AS l
              WHERE NOT %(websearch)s AND %(bm25)s) AS t
        CROSS JOIN corpus c
        LEFT JOIN user_term_stats s ON s.user_id = %(user_id)s AND s.lexeme = t.l
    ), mass AS MATERIALIZED (
        -- The question's full idf mass, its words missing from every memory included: a match's share of
        -- it (text_share) is how much of the question the match's words carry.
        SELECT nullif(sum(w), 0) AS total FROM idf
    ), sel AS MATERIALIZED (
        -- Candidates come from the rarest terms first: terms in df order while their postings add up to at
        -- most match_cap (always the rarest one), so the index reads are bounded whatever the corpus size.
        -- The commoner terms still count in every candidate's score.
        SELECT CASE WHEN %(websearch)s OR NOT %(bm25)s OR NOT {only_live}
                         OR NOT EXISTS (SELECT 1 FROM idf WHERE df > 0)
                    THEN (SELECT tsq FROM q)
                    ELSE (SELECT string_agg(r.tq::text, ' | ')::tsquery
                          FROM (SELECT tq, sum(df) OVER (ORDER BY df, tq::text) AS postings,
                                       row_number() OVER (ORDER BY df, tq::text) AS rarity
                                FROM idf WHERE df > 0) AS r
                          WHERE r.rarity = 1 OR r.postings <= %(match_cap)s) END AS tsq
    )"""


def _tier_ctes(t: _Tier) -> str:
    """One tier's candidates: the `pool` nearest by cosine and the `pool` best full-text matches.

    Full-text score of an OR query (bm25 mode): BM25 with tf taken as 1 and no length normalization
    (b 0): Σ idf(term) over the query terms a memory contains, idf = ln(1 + (N - df + 0.5) / (df + 0.5)).
    Memories are short, and in chat the shortest are greetings and back-channel ("What about Kate?"):
    normalizing by length ranked them above the message that says something with the same words. The
    statistics are the user's, over both tiers (an archive row's document: its summary's lexemes and its
    fingerprint, the original's lexemes the summary lacks), so scores of both tiers compare and one
    ranking merges them. ts_rank_cd breaks ties. websearch mode: ts_rank_cd.

    Context: up to context_neighbours memories written before and as many after each of the `pool` best
    matches (within context_window of it, same tier) gain context_weight × that match's score ×
    context_decay^(steps away - 1). In a conversation the message that answers a question often shares
    no word with it, while one a few messages before it does; real chat comes in bursts of short
    messages, so the answer is often several messages on, not the next one.
    """
    a, arm = t.alias, t.arm
    user_live = f"{a}.user_id = %(user_id)s AND {t.live}"
    # The memories written just before / just after a match (step 1 the nearest), within the context
    # window: same user, same tier, same filters. One probe of the tier's (user_id, created) index each
    # side. Memories written at the same instant are a batch (an import, facts extracted together), not a
    # conversation: not context.
    neighbour = f"""(SELECT {a}.id, row_number() OVER (ORDER BY {t.created} DESC, {t.key} DESC) AS step
                 FROM {t.table} {a}
                 WHERE {user_live} {t.filters}
                   AND {t.created} >= b.created - %(context_window)s::interval AND {t.created} < b.created
                 ORDER BY {t.created} DESC, {t.key} DESC LIMIT %(context_neighbours)s)
            UNION ALL
            (SELECT {a}.id, row_number() OVER (ORDER BY {t.created}, {t.key}) AS step
                 FROM {t.table} {a}
                 WHERE {user_live} {t.filters}
                   AND {t.created} > b.created AND {t.created} <= b.created + %(context_window)s::interval
                 ORDER BY {t.created}, {t.key} LIMIT %(context_neighbours)s)"""
    return f"""{a}_hits AS MATERIALIZED (
        SELECT {a}.id, {t.created} AS created, {t.key} AS key, {t.tsv} AS tsv, sel.tsq, {t.size} AS size
        FROM {t.table} {a}, sel
        WHERE sel.tsq IS NOT NULL AND {user_live} AND {t.tsv} @@ sel.tsq {t.filters}
        LIMIT %(match_cap)s
    ), {a}_idf AS MATERIALIZED (
        -- Each match's idf sum from one join of the matches with the query's terms (a handful), summed in
        -- the terms' order (the same sum for the same terms), rather than a subquery run per match.
        SELECT h.id, coalesce(sum(i.w ORDER BY i.n), 0) AS idf_sum
        FROM {a}_hits h LEFT JOIN idf i ON h.tsv @@ i.tq
        GROUP BY h.id
    ), {a}_floor AS MATERIALIZED (
        -- The pool-th best idf sum. ts_rank_cd only breaks ties (1e-3 x cd), and on an OR of lexemes it is
        -- at most 0.1 per position of the document (one per cover), so at most its size (characters, and
        -- lexemes without positions): a match whose idf sum is below this floor by more than 1e-3 x size
        -- cannot be among the pool best, and its ts_rank_cd (~10 us a match) is not computed.
        SELECT coalesce(min(s.idf_sum), 0) AS t
        FROM (SELECT idf_sum FROM {a}_idf ORDER BY idf_sum DESC LIMIT %({t.pool})s) AS s
    ), {a}_matched AS (
        SELECT h.id, h.created, h.key, s.idf_sum,
               CASE WHEN s.idf_sum + 1e-3 * h.size >= f.t THEN ts_rank_cd(h.tsv, h.tsq) ELSE 0 END AS cd
        FROM {a}_hits h JOIN {a}_idf s ON s.id = h.id CROSS JOIN {a}_floor f
    ), {a}_bm25 AS MATERIALIZED (
        SELECT id, created, key, idf_sum + 1e-3 * cd AS score
        FROM {a}_matched
        ORDER BY score DESC, id LIMIT %({t.pool})s
    ), {a}_context AS (
        SELECT n.id, max(b.score * power(%(context_decay)s::float8, n.step - 1)) AS score
        FROM {a}_bm25 b CROSS JOIN LATERAL ({neighbour}) AS n
        WHERE %(context_weight)s > 0 AND NOT %(websearch)s  -- explicit text_query: those tokens only
        GROUP BY n.id
    ), {a}_txt AS (
        SELECT r.id, r.text_rank, least(r.text_rank / mass.total, 1) AS text_share
        FROM (SELECT coalesce(b.id, c.id) AS id,
                     coalesce(b.score, 0) + %(context_weight)s * coalesce(c.score, 0) AS text_rank
              FROM {a}_bm25 b FULL JOIN {a}_context c ON c.id = b.id
              ORDER BY text_rank DESC, id LIMIT %({t.pool})s) AS r, mass
    ), {a}_exact AS MATERIALIZED (
        -- A user with few memories in this tier: exact nearest neighbours over the user's rows (read by
        -- a user index), else the HNSW graph with the user as a filter. Left to itself, the planner read
        -- 2,500 rows of a user from the full-text GIN index and sorted them by distance: 10 ms at
        -- 1536-d where the graph takes 2 ms (bench search).
        SELECT count(*) <= %({t.exact_max})s AS yes
        FROM (SELECT 1 FROM {t.table} {a} WHERE {a}.user_id = %(user_id)s LIMIT %({t.exact_max})s + 1) AS s
    ), {a}_vec AS (
        -- Ties (hamming distances of sign bits are integers) are cut by id, so the same rows give
        -- the same candidates on any layout (the graph walk below has no such order to offer). `+ 0`:
        -- an order the HNSW index cannot serve, so this branch reads the user's rows and is exact (left
        -- to itself, the planner walked the graph here for a user of 2,000 archive rows: 5.8 ms, not 1).
        (SELECT {a}.id FROM {t.table} {a}
         WHERE (SELECT yes FROM {a}_exact) AND {user_live} AND {arm.where} {t.filters}
         ORDER BY ({arm.distance}) + 0, {a}.id LIMIT %({t.pool})s * {arm.oversample})
        UNION ALL
        -- `user_id || ''` is not indexable: the planner walks the graph and filters by user. So is the
        -- key under another collation than its indexes' (`C`, the same equality), which a distributed
        -- database prunes by: the whole statement then runs on the user's shard (docs: distributed-postgres).
        (SELECT {a}.id FROM {t.table} {a}
         WHERE NOT (SELECT yes FROM {a}_exact) AND ({a}.user_id || '') = %(user_id)s
               AND {a}.user_id = %(user_id)s COLLATE "C" AND {t.live}
               AND {arm.where} {t.filters}
         ORDER BY {arm.distance} LIMIT %({t.pool})s * {arm.oversample})
    ), {a}_candidates AS (
        SELECT id FROM {a}_vec UNION SELECT id FROM {a}_txt
    )"""


def _tier_select(t: _Tier) -> str:
    a = t.alias
    return f"""SELECT {t.select},
           {t.arm.similarity} AS similarity, {t.arm.rerank_column} AS rerank,
           v.id IS NOT NULL AS in_vector, x.text_rank, x.text_share
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


# At most MATCH_CAP full-text matches are scored per tier; candidates come from the rarest query terms
# whose document frequencies add up to at most MATCH_CAP (search bench: 10k hot + 40k archived).
MATCH_CAP = 500
# Up to EXACT_MAX hot memories of a user, the hot vector arm is exact (every row of the user compared);
# above, the tier's HNSW index (~4 µs a 1536-d cosine: 1,000 rows ≈ the graph walk's 2-4 ms).
EXACT_MAX = 1000
# The same for a user's archive rows. Their sign bits cost ~0.45 µs a row with its read (1536-d: 2,000
# rows 0.9 ms, 10,000 rows 4.6 ms), while the graph walk filtered by a user who holds a small share of
# the table takes 5-6 ms (2,000 of 42,000 rows): up to 4,000 rows, exact is faster and finds the true
# nearest. Counting up to 4,001 of a large user's rows costs ~0.3 ms (1,001: 0.1 ms).
ARCHIVED_EXACT_MAX = 4000


_HOT_TIER = _Tier(
    table="memories",
    alias="m",
    arm=HOT_VECTORS,
    tsv="m.content_tsv",
    live="m.superseded_by IS NULL",
    filters=_HOT_FILTERS,
    created="m.created_at",
    key="m.id",
    size="char_length(m.content)",
    select="""m.id AS memory_id, NULL::uuid AS archive_id, m.user_id, m.content AS text, m.created_at,
           m.updated_at, m.category, m.domain, m.metadata -> 'tags' AS tags, NULL::text AS storage_ref,
           NULL::timestamptz AS archived_at, m.metadata -> 'chunk' AS chunk, m.superseded_by""",
    pool="pool",
    exact_max="exact_max",
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
        exact_max="archived_exact_max",
        created="a.original_created_at",
        key="a.original_id",
        size="char_length(a.summary) + coalesce(length(a.lexemes), 0)",
    )


def archived_search_sql(arm: VectorArm, *, include_superseded: bool = False) -> str:
    """Phase 2's statement for one way of storing summary vectors (ARCHIVED_VECTORS is the schema's);
    include_superseded: superseded archive rows are candidates too."""
    return _tier_sql(_archived_tier(arm, "pool", include_superseded), include_superseded)


# storage.packs.ref_sql with the backup object looked up by the searched user as a constant, not the
# row's user_id: the same row (every archive row read is that user's), and a lookup a distributed
# database routes to the user's shard instead of every shard of backup_objects.
_REF = ref_sql("a").replace("o.user_id = a.user_id", "o.user_id = %(user_id)s")
if ref_sql("a") == _REF:  # a changed ref_sql would silently keep reading every shard
    raise RuntimeError("storage.packs.ref_sql changed shape: rewrite retrieval.sql._REF")

# A stub shows its stub text (memory_lib.lifecycle.stubs.stub_text); its full-text entry is the whole summary's.
ARCHIVED_SELECT = f"""a.original_id AS memory_id, a.id AS archive_id, a.user_id,
           CASE WHEN a.stubbed_at IS NULL THEN a.summary ELSE '[archived] ' || left(a.summary, 200) END AS text,
           a.original_created_at AS created_at, a.original_updated_at AS updated_at,
           a.original_category AS category, a.original_domain AS domain, a.metadata -> 'tags' AS tags,
           {_REF} AS storage_ref, a.archived_at, a.metadata -> 'chunk' AS chunk,
           a.original_superseded_by AS superseded_by"""
ARCHIVED_SEARCH_SQL = archived_search_sql(ARCHIVED_VECTORS)
# When phase 2 is known to be needed before phase 1 runs (phase2="always", the past asked for), both
# tiers go in one statement: same candidates and ranking, BM25 statistics read once.
BOTH_TIERS_SQL = _both_tiers_sql(_HOT_TIER, _archived_tier(ARCHIVED_VECTORS, "archived_pool"))
# Month-scoped phase 2 (memory_lib.retrieval.warm): the same statements reading only the months asked for. Both
# tiers keep the user's whole BM25 statistics, so their scores compare (phase 1 reads no archive row).
HOT_SCOPED_SQL = warm.scope_sql(HOT_SEARCH_SQL)
ARCHIVED_SCOPED_SQL = warm.scope_sql(ARCHIVED_SEARCH_SQL)
BOTH_TIERS_SCOPED_SQL = warm.scope_sql(BOTH_TIERS_SQL)
# search(include_superseded=True), for audits: each statement above reading superseded memories too
# (hot and archived), matched by every query term; ranked with the live statistics. Keyed by the default statement.
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


def statement_params(
    user_id: str,
    embedding: np.ndarray,
    query: str,
    config: RetrievalConfig,
    filters: SearchFilters,
    *,
    text_query: str | None = None,
) -> dict[str, Any]:
    """The parameters every search statement above takes, but the candidate pools (`pool`,
    `archived_pool`) and a month scope: `query` goes to full text as an OR of its lexemes, unless an
    explicit `text_query` (websearch syntax) is given."""
    explicit = text_query is not None and text_query.strip() != ""
    return {
        "user_id": user_id,
        "embedding": embedding,
        "text_query": text_query if explicit else query,
        "websearch": explicit,
        "bm25": config.text_ranking == "bm25",
        "match_cap": MATCH_CAP,
        "exact_max": EXACT_MAX,
        "archived_exact_max": ARCHIVED_EXACT_MAX,
        "context_weight": config.context_weight,
        "context_window": timedelta(minutes=config.context_window_minutes),
        "context_neighbours": config.context_neighbours,
        "context_decay": config.context_decay,
        **filters.params(),
    }


# A tier's partition holding the user's rows, per tier table, on tiers partitioned by user
# (SEARCH_SETTINGS_SQL's hot_home / archived_home); () when the tiers are not partitioned.
Homes = tuple[tuple[str, str | None], ...]


def homes_of(session: dict[str, Any]) -> Homes:
    """The partitions a search reads its graph walks from, from SEARCH_SETTINGS_SQL's row."""
    if not session["partitioned"]:
        return ()
    return (("memories", session["hot_home"]), ("archived_memories", session["archived_home"]))


def statement_for(sql: str, request: SearchRequest, *, homes: Homes = ()) -> str:
    """The statement to run: `sql` itself, or its include_superseded twin when the request asks for it;
    on tiers partitioned by user (`homes`), with each graph walk reading the user's partition."""
    stmt = WITH_SUPERSEDED_SQL[sql] if request.include_superseded else sql
    return pruned(stmt, homes) if homes else stmt


# The graph walk filters by `user_id || ''` so that the planner cannot read the user's rows from a user
# index and sort them (see _tier_ctes). That expression does not prune partitions: on tiers partitioned
# by user (memory_lib.storage.partitioning) Postgres would walk every partition's graph (bench partitions:
# 100x slower). Naming the key beside it prunes, but then the planner reads the user's rows from a user
# index and sorts them again (40 users x 2,500 memories on 16 partitions: p95 26.3 ms against 7.5 ms for
# the walk). So the walk reads the user's partition itself, still filtered by the unindexable
# expression; a tier where the user has no row (no home: no walk runs) keeps the parent and the key.
_WALK = re.compile(
    r"FROM (\w+) (\w+)(\s+)WHERE NOT \(SELECT yes FROM \2_exact\) AND \(\2\.user_id \|\| ''\) = %\(user_id\)s"
)
# A relation name as regclass prints it (quoted by Postgres where needed, schema-qualified when the schema
# is not on the search path); anything else is not spliced into a statement.
_RELATION = re.compile(r'(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)(?:\.(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*))?')


@functools.lru_cache(maxsize=512)  # (statement, partitions) pairs: bounded, a home per user
def pruned(sql: str, homes: Homes) -> str:
    by_table = dict(homes)

    def walk(m: re.Match[str]) -> str:
        table, alias, gap = m.group(1), m.group(2), m.group(3)
        head = f"WHERE NOT (SELECT yes FROM {alias}_exact) AND ({alias}.user_id || '') = %(user_id)s"
        home = by_table.get(table)
        if home is not None and _RELATION.fullmatch(home):
            return f"FROM {home} {alias}{gap}{head}"
        return f"FROM {table} {alias}{gap}{head} AND {alias}.user_id = %(user_id)s"

    return _WALK.sub(walk, sql)
