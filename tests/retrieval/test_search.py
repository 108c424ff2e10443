"""Two-phase hybrid search against a real Postgres + pgvector: ranking, phase 2, filters, labels."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.core.errors import EmbeddingMismatchError, InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.ranking import VECTOR_WEIGHT_BY_KIND, rank_candidates, recency_decay, tag_match
from memory_lib.retrieval.search import parse_time_window, phase2_reason
from memory_lib.retrieval.types import SearchFilters, SearchHit, SearchRequest
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_client
from testing.rows import one

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)  # old enough to be archived (min_age_days 90)


def _archive_old(conn, store, batch_key: str = "night-1") -> None:
    services = archival_services(store)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key=batch_key, as_of=NOW, actor="test")
    assert report.gate_passed and report.status.failed == 0


# --------------------------------------------------------------------------- pure ranking


def _row(
    similarity: float,
    *,
    text_rank: float | None = None,
    in_vector: bool = True,
    age_days: float = 0.0,
    tags: list[str] | None = None,
    archived: bool = False,
) -> dict:
    mid = uuid.uuid4()
    return {
        "memory_id": mid,
        "archive_id": uuid.uuid4() if archived else None,
        "user_id": "u1",
        "text": f"m{mid}",
        "created_at": NOW - timedelta(days=age_days),
        "updated_at": NOW - timedelta(days=age_days),
        "category": "episodic",
        "domain": None,
        "tags": tags,
        "storage_ref": None,
        "archived_at": None,
        "similarity": similarity,
        "in_vector": in_vector,
        "text_rank": text_rank,
    }


def test_recency_halves_every_half_life():
    assert recency_decay(NOW, NOW, 30) == 1.0
    assert recency_decay(NOW - timedelta(days=30), NOW, 30) == pytest.approx(0.5)
    assert recency_decay(NOW - timedelta(days=90), NOW, 30) == pytest.approx(0.125)
    assert recency_decay(NOW + timedelta(days=1), NOW, 30) == 1.0  # clock skew is not a bonus


def test_tag_match_is_the_share_of_query_tags_present():
    assert tag_match([], ["a"]) == 0.0
    assert tag_match(["a", "b"], ["b", "c"]) == 0.5
    assert tag_match(["a"], ["a"]) == 1.0


def _rank(rows, cfg=None, sources=None, **kw):
    cfg = cfg or RetrievalConfig()
    sources = sources or ["hot"] * len(rows)
    return rank_candidates(rows, sources=sources, config=cfg, tags=kw.pop("tags", []), now=NOW, **kw)


def test_score_follows_the_documented_formula():
    cfg = RetrievalConfig()
    rows = [_row(0.9, text_rank=0.2, age_days=30, tags=["coffee"]), _row(0.8, age_days=0)]
    hits = _rank(rows, cfg, tags=["coffee"])
    by_sim = {round(h.scores.similarity, 2): h.scores for h in hits}
    both = by_sim[0.9]  # first in both lists: rrf at its maximum, relevance 1
    k, wv = cfg.rrf_k, VECTOR_WEIGHT_BY_KIND["semantic"]  # no embedder kind given: semantic
    assert both.vector_position == 1 and both.text_position == 1
    assert both.rrf == pytest.approx((wv + 1) / (k + 1)) and both.hybrid_similarity == pytest.approx(1.0)
    assert both.final == pytest.approx(
        cfg.alpha_similarity * 1.0 + cfg.beta_recency * 0.5 + cfg.gamma_tags * 1.0
    )
    vec_only = by_sim[0.8]  # second in the vector list only
    assert vec_only.text_position is None
    assert vec_only.hybrid_similarity == pytest.approx((wv / (k + 2)) / ((wv + 1) / (k + 1)))
    assert vec_only.final == pytest.approx(
        cfg.alpha_similarity * vec_only.hybrid_similarity + cfg.beta_recency
    )


def test_defaults_let_recency_and_the_tier_only_break_ties():
    # An archived memory a year old that ranks first in both lists beats a fresh hot memory ranked second.
    old = _row(0.9, text_rank=0.3, age_days=365, archived=True)
    fresh = _row(0.85, text_rank=0.2, age_days=0)
    hits = _rank([fresh, old], sources=["hot", "archived"])
    assert [h.source for h in hits] == ["archived", "hot"]
    # Exact ties go to the hot hit, then to the more recent one.
    a, b = _row(0.5, archived=True), _row(0.5)
    b["memory_id"] = a["memory_id"]  # seen hot and archived (a concurrent archival)
    tie = rank_candidates(
        [a, b], sources=["archived", "hot"], config=RetrievalConfig(vector_weight=0.0), tags=[], now=NOW
    )
    assert len(tie) == 1 and tie[0].source == "hot"  # same original id: one hit, the hot one


def test_optional_floor_keeps_vector_hits_above_it_and_every_text_match():
    cfg = RetrievalConfig(hot_similarity_threshold=0.7)
    rows = [_row(0.75), _row(0.5), _row(0.1, text_rank=0.1, in_vector=False)]
    assert sorted(round(h.scores.similarity, 2) for h in _rank(rows, cfg)) == [0.1, 0.75]
    assert len(_rank(rows)) == 3  # no floor by default: cosine scales differ per embedder


def test_active_boost_multiplies_hot_scores_when_configured():
    cfg = RetrievalConfig(active_boost=1.2)
    [hot] = _rank([_row(0.8)], cfg)
    [arch] = _rank([_row(0.8, archived=True)], cfg, sources=["archived"])
    assert hot.scores.final == pytest.approx(cfg.active_boost * arch.scores.final)
    assert arch.label == "[archived]" and arch.labeled_text.startswith("[archived] ")
    assert hot.label == "" and arch.id == arch.provenance.archive_id and hot.id == hot.provenance.memory_id


def _request(**kw) -> SearchRequest:
    base = {"user_id": "u1", "query": "q", "embedding": None, "config": RetrievalConfig(), "now": NOW}
    return SearchRequest(**(base | kw))


def _hits(*sims: float) -> list[SearchHit]:
    return _rank([_row(s) for s in sims])


def test_phase2_runs_unless_phase1_is_strong():
    five_strong = _hits(0.95, 0.9, 0.85, 0.82, 0.81)
    assert phase2_reason(_request(), five_strong, 5) is None
    assert phase2_reason(_request(), five_strong[:4], 5) == "too_few_hot_hits"
    assert phase2_reason(_request(), _hits(0.95, 0.9, 0.85, 0.82, 0.6), 5) == "weak_hot_hits"
    floor = _request(config=RetrievalConfig(hot_similarity_threshold=0.99))
    assert phase2_reason(floor, five_strong, 5) == "none_above_threshold"
    assert phase2_reason(_request(include_past=True), five_strong, 5) == "past_requested"
    past = SearchFilters(since=NOW - timedelta(days=400), until=NOW - timedelta(days=300))
    assert phase2_reason(_request(filters=past), five_strong, 5) == "window_before_hot_horizon"
    recent = SearchFilters(since=NOW - timedelta(days=10))
    assert phase2_reason(_request(filters=recent), five_strong, 5) is None
    assert phase2_reason(_request(phase2="always"), five_strong, 5) == "always"
    assert phase2_reason(_request(phase2="never"), [], 5) is None
    last_year = parse_time_window("what did I pay last year?", NOW)
    assert phase2_reason(_request(), five_strong, 5, last_year) == "query_names_the_past"


# --------------------------------------------------------------------------- against Postgres


def test_full_text_finds_an_exact_order_number_that_vector_search_ranks_low(conn):
    client = make_client(conn)
    target = client.add(
        "u1",
        "Refund for ORD-4417 approved by Dana after the courier lost the parcel near the Rotterdam depot "
        "during the storm last winter, customer notified by phone",
        now=NOW,
    )
    for number in (
        "ORD-4471",
        "ORD-4147",
        "ORD-7441",
        "ORD-4418",
        "ORD-4416",
        "ORD-1447",
        "ORD-4714",
        "ORD-4427",
    ):
        client.add("u1", f"{number} refund requested", now=NOW)
    query = "ORD-4417 refund"
    # Vector search alone: the long memory is far down the list.
    q = HashingEmbedder(TEST_DIM).embed([query])[0]
    ranked = [
        r["id"]
        for r in conn.execute(
            "SELECT id FROM memories WHERE user_id = 'u1' ORDER BY embedding <=> %s LIMIT 100", (q,)
        )
    ]
    assert ranked.index(target.memory_id) + 1 > 5
    # Exact tokens sent as text_query (websearch syntax: every term required) put it first.
    natural = [h.provenance.memory_id for h in client.search("u1", query, phase2="never", now=NOW)]
    assert (
        target.memory_id in natural
    )  # within the default top 10, though fusion with the vector arm ranks it lower
    result = client.search("u1", query, text_query="ORD-4417", phase2="never", now=NOW)
    top = result.hits[0]
    assert top.provenance.memory_id == target.memory_id
    assert top.scores.text_position == 1
    assert top.scores.vector_position is not None and top.scores.vector_position > 5
    assert all(h.scores.text_rank is None for h in result.hits[1:])  # no other memory has the token


def test_archived_memory_is_found_labeled_and_carries_provenance(conn, object_store):
    client = make_client(
        conn,
        object_store,
        retrieval=RetrievalConfig(hot_similarity_threshold=0.5, archived_similarity_threshold=0.3),
    )
    original = (
        "Project Heron kickoff with Priya Raman in Lisbon: budget 48,000 EUR approved. "
        "The team will meet every Thursday."
    )
    archived = client.add("u1", original, importance=0.1, tags=["work"], now=OLD)
    client.add("u1", "Bought oat milk and bread at the corner shop", now=NOW)
    _archive_old(conn, object_store)
    assert (
        one(conn.execute("SELECT count(*) AS n FROM memories WHERE id = %s", (archived.memory_id,)))["n"] == 0
    )

    result = client.search("u1", "Project Heron budget in Lisbon", now=NOW)
    assert result.phase2_reason == "too_few_hot_hits"
    [hit] = result.archived
    assert hit.source == "archived" and hit.label == "[archived]"
    assert hit.provenance.memory_id == archived.memory_id and hit.provenance.user_id == "u1"
    assert hit.provenance.storage_ref and hit.provenance.archive_id is not None
    assert hit.provenance.created_at == OLD and hit.provenance.tags == ("work",)
    assert "Heron" in hit.text
    # The archive row kept the memory's tags: tag filters and scores work on archived hits too.
    tagged = client.search(
        "u1", "Project Heron budget", filters=SearchFilters(required_tags=["work"]), tags=["work"], now=NOW
    )
    assert [h.provenance.memory_id for h in tagged] == [archived.memory_id]
    assert tagged.hits[0].scores.tag_match == 1.0
    # never: phase 2 does not run; always: it runs even when hot hits suffice.
    assert client.search("u1", "Project Heron budget in Lisbon", phase2="never", now=NOW).archived == []
    assert client.search("u1", "oat milk", phase2="always", now=NOW).phase2_reason == "always"


def test_filters_apply_to_both_tiers(conn, local_store):
    client = make_client(
        conn,
        local_store,
        retrieval=RetrievalConfig(hot_similarity_threshold=0.0, archived_similarity_threshold=0.0),
    )
    client.add(
        "u1", "Tennis lesson with coach Marco", category="episodic", domain="sport", tags=["tennis"], now=NOW
    )
    client.add(
        "u1", "Tennis racket restrung", category="semantic", domain="sport", now=NOW - timedelta(days=20)
    )
    client.add("u1", "Tennis club membership fee", category="episodic", domain="money", now=NOW)
    client.add("u1", "Old tennis tournament result", importance=0.0, domain="sport", tags=["tennis"], now=OLD)
    _archive_old(conn, local_store)

    def texts(**kw):
        return sorted(h.text for h in client.search("u1", "tennis", phase2="always", now=NOW, **kw))

    assert texts(filters=SearchFilters(categories=["semantic"])) == ["Tennis racket restrung"]
    assert texts(filters=SearchFilters(domains=["money"])) == ["Tennis club membership fee"]
    assert texts(filters=SearchFilters(required_tags=["TENNIS"])) == [
        "Old tennis tournament result",
        "Tennis lesson with coach Marco",
    ]
    assert texts(filters=SearchFilters(since=NOW - timedelta(days=30), until=NOW - timedelta(days=1))) == [
        "Tennis racket restrung"
    ]
    # A window before the hot horizon asks for the past: archived memories are searched in auto mode.
    past = client.search("u1", "tennis", filters=SearchFilters(until=NOW - timedelta(days=150)), now=NOW)
    assert past.phase2_reason == "window_before_hot_horizon"
    assert [h.text for h in past] == ["Old tennis tournament result"]


def test_limits_and_merge_order(conn, local_store):
    # Numbered notes: the write path would take "note 1" for a changed value of "note 0"; off here.
    client = make_client(
        conn,
        local_store,
        retrieval=RetrievalConfig(
            hot_similarity_threshold=0.0,
            archived_similarity_threshold=0.0,
            hot_limit=2,
            archived_limit=1,
            near_duplicate_threshold=1.0,
            near_duplicate_floor=1.0,
        ),
    )
    for i in range(4):
        client.add("u1", f"Garden note {i}: tomatoes need water", now=NOW)
        client.add("u1", f"Old garden note {i}: tomatoes planted", importance=0.0, now=OLD)
    _archive_old(conn, local_store)
    result = client.search("u1", "tomatoes garden", phase2="always", now=NOW)
    assert len(result.hot) == 2 and len(result.archived) == 1
    finals = [h.scores.final for h in result]
    assert finals == sorted(finals, reverse=True)
    assert len(client.search("u1", "tomatoes garden", limit=3, archived_limit=0, now=NOW)) == 2  # hot cap 2
    assert len(client.search("u1", "tomatoes garden", limit=1, phase2="always", now=NOW)) == 1


def test_search_hits_can_count_as_accessed(conn, local_store):
    client = make_client(
        conn,
        local_store,
        retrieval=RetrievalConfig(hot_similarity_threshold=0.0, archived_similarity_threshold=0.0),
    )
    hot = client.add("u1", "Sourdough starter fed on Sunday", now=NOW)
    old = client.add("u1", "Sourdough recipe from grandma", importance=0.0, now=OLD)
    _archive_old(conn, local_store)
    client.search("u1", "sourdough", phase2="always", now=NOW)  # not used: nothing counted
    assert conn.execute("SELECT access_count FROM memories WHERE id = %s", (hot.memory_id,)).fetchone() == {
        "access_count": 0
    }
    later = NOW + timedelta(hours=1)
    client.search("u1", "sourdough", phase2="always", record_access=True, now=later)
    row = conn.execute(
        "SELECT access_count, last_accessed_at FROM memories WHERE id = %s", (hot.memory_id,)
    ).fetchone()
    assert row == {"access_count": 1, "last_accessed_at": later}
    arch = conn.execute(
        "SELECT access_count, last_accessed_at FROM archived_memories WHERE original_id = %s",
        (old.memory_id,),
    ).fetchone()
    assert arch == {"access_count": 1, "last_accessed_at": later}


@pytest.mark.parametrize("user_id", ["", "   ", None])
def test_user_id_is_required(conn, user_id):
    with pytest.raises(InvalidInputError) as err:
        make_client(conn).search(user_id, "anything")
    assert err.value.field == "user_id"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": "  "}, "query"),
        ({"limit": -1}, "limit"),
        ({"phase2": "sometimes"}, "phase2"),
        ({"filters": {"categories": ["core"]}}, "filters"),
    ],
)
def test_bad_search_arguments_name_the_field(conn, kwargs, field):
    client = make_client(conn)
    with pytest.raises(InvalidInputError) as err:
        client.search("u1", kwargs.pop("query", "q"), **kwargs)
    assert err.value.field == field


def test_filter_validation():
    with pytest.raises(InvalidInputError, match="filters.categories"):
        SearchFilters(categories=["gossip"])
    with pytest.raises(InvalidInputError, match="filters.until"):
        SearchFilters(since=NOW, until=NOW - timedelta(days=1))
    with pytest.raises(InvalidInputError, match="filters.since"):
        SearchFilters(since=datetime(2025, 1, 1))


def test_a_query_embedder_of_another_model_is_refused(conn):
    make_client(conn).add("u1", "Plays the cello on Fridays", now=NOW)
    other = MemoryClient(conn, embedder=_RenamedEmbedder(), actor="test")
    with pytest.raises(EmbeddingMismatchError, match="embedder.model"):
        other.search("u1", "cello")


class _RenamedEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(TEST_DIM)
        self.model = "some-other-model"


def test_each_search_statement_has_an_include_superseded_twin_without_the_live_predicates():
    from memory_lib.retrieval import sql as search

    defaults = (
        search.HOT_SEARCH_SQL,
        search.ARCHIVED_SEARCH_SQL,
        search.BOTH_TIERS_SQL,
        search.HOT_SCOPED_SQL,
        search.ARCHIVED_SCOPED_SQL,
        search.BOTH_TIERS_SCOPED_SQL,
    )
    assert set(search.WITH_SUPERSEDED_SQL) == set(defaults)
    for sql in defaults:
        twin = search.WITH_SUPERSEDED_SQL[sql]
        assert "superseded_by IS NULL" in sql and "superseded_by IS NULL" not in twin  # tiers and BM25 df
