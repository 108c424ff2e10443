"""rank_candidates and sort_hits against a plain reference of the ranking (every row scored, every hit
built, one sort, then one hit per memory): the same hits, the same order, the same scores bit for bit;
`limit=k` gives the first k. Pure: no database."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_lib.core.config import RetrievalConfig
from memory_lib.core.timescope import TimeWindow
from memory_lib.retrieval.ranking import (
    rank_candidates,
    recency_decay,
    resolved_vector_weight,
    sort_hits,
    tag_match,
)
from memory_lib.retrieval.types import HitScores, Provenance, SearchHit

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
NAN = float("nan")

# --------------------------------------------------------------------------- the reference


def _ref_positions(rows: Sequence[Mapping[str, Any]], key: str, include: str | None) -> dict[int, int]:
    chosen = [i for i, r in enumerate(rows) if (r[include] if include else r[key] is not None)]
    chosen.sort(key=lambda i: (-float(rows[i][key]), str(rows[i]["memory_id"])))
    return {i: pos for pos, i in enumerate(chosen, start=1)}


def _ref_share(row: Mapping[str, Any]) -> float:
    share = row.get("text_share")
    return 1.0 if share is None else float(share)


def _ref_sort_hits(hits: Sequence[SearchHit]) -> list[SearchHit]:
    return sorted(hits, key=lambda h: (-h.scores.final, h.source != "hot", -h.scores.recency, str(h.id)))


def _ref_rank(rows, *, sources, config, tags, now, window=None, embedder_kind=None) -> list[SearchHit]:
    k = config.rrf_k
    wv, wt = resolved_vector_weight(config, embedder_kind), config.text_weight
    vec_pos = _ref_positions(rows, "similarity", "in_vector")
    txt_pos = _ref_positions(rows, "text_rank", None)
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
        rrf = (wv / (k + vp) if vp else 0.0) + (wt * _ref_share(row) / (k + tp) if tp else 0.0)
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
        hits.append(
            SearchHit(source, row["text"], scores, provenance, superseded_by=row.get("superseded_by"))
        )
    seen: set[Any] = set()
    unique = []
    for hit in _ref_sort_hits(hits):
        key = hit.provenance.parent_id or hit.provenance.memory_id
        if key not in seen:
            seen.add(key)
            unique.append(hit)
    return unique


def _exact(hits: Sequence[SearchHit]) -> list[str]:
    """Each hit as its repr: every field, floats to the last bit (0.0 and -0.0 differ, NaN compares)."""
    return [repr(h) for h in hits]


# --------------------------------------------------------------------------- candidates with many ties


@st.composite
def candidates(draw) -> dict[str, Any]:
    """Rows drawn from small pools, so scores, recency and ids tie: a memory seen hot and archived,
    chunks of one parent, vector-only rows around a floor, rows without text rank or share."""
    ids = draw(st.lists(st.integers(0, 2**128 - 1), min_size=8, max_size=8, unique=True))
    uuids = [uuid.UUID(int=i) for i in ids]
    id_kind = draw(st.sampled_from(["uuid", "uuid", "uuid", "str", "mixed"]))

    def an_id(n: int) -> Any:
        if id_kind == "str" or (id_kind == "mixed" and n % 3 == 0):
            return f"m-{n}"
        return uuids[n]

    rows, sources = [], []
    for _ in range(draw(st.integers(0, 30))):
        source = draw(st.sampled_from(["hot", "archived"]))
        memory = draw(st.integers(0, 4))
        chunk = draw(
            st.sampled_from([None, None, {}, "not a chunk"])
            | st.builds(
                lambda p, i: {"parent_id": str(uuids[5 + p]), "index": i, "count": 3},
                st.integers(0, 2),
                st.integers(0, 2),
            )
        )
        row = {
            "user_id": "u1",
            "memory_id": an_id(memory),
            "archive_id": an_id(draw(st.integers(0, 7))) if source == "archived" else None,
            "text": f"memory {memory}",
            "created_at": NOW - timedelta(days=draw(st.sampled_from([0, 3, 40]))),
            "updated_at": NOW - timedelta(days=draw(st.sampled_from([0, 0, 10, 30, -2]))),
            "category": "episodic",
            "domain": None,
            "tags": draw(st.sampled_from([None, [], ["a"], ["a", "b"], ["c"]])),
            "storage_ref": None,
            "archived_at": NOW if source == "archived" else None,
            "chunk": chunk,
            "superseded_by": draw(st.sampled_from([None, uuids[7]])),
            "similarity": draw(st.sampled_from([0.1, 0.5, 0.5, 0.65, 0.9, NAN])),
            "in_vector": draw(st.booleans()),
            "text_rank": draw(st.sampled_from([None, None, 0.2, 0.2, 3.5])),
        }
        share = draw(st.sampled_from(["absent", None, 0.5, 1.0, 1.0, NAN]))
        if share != "absent":
            row["text_share"] = share
        rows.append(row)
        sources.append(source)
    config = RetrievalConfig(
        beta_recency=draw(st.sampled_from([0.0, 0.0, 0.2])),
        gamma_tags=draw(st.sampled_from([0.0, 0.1])),
        delta_time=draw(st.sampled_from([0.0, 0.1])),
        active_boost=draw(st.sampled_from([1.0, 1.0, 1.3])),
        vector_weight=draw(st.sampled_from([None, 0.0, 0.25])),
        text_weight=draw(st.sampled_from([1.0, 0.5])),
        hot_similarity_threshold=draw(st.sampled_from([None, 0.5])),
        archived_similarity_threshold=draw(st.sampled_from([None, 0.6])),
    )
    return {
        "rows": rows,
        "sources": sources,
        "config": config,
        "tags": draw(st.sampled_from([[], ["a"], ["a", "b"]])),
        "now": NOW,
        "window": draw(st.sampled_from([None, TimeWindow(NOW - timedelta(days=7), NOW, "last week")])),
        "embedder_kind": draw(st.sampled_from([None, "semantic", "lexical"])),
    }


@settings(max_examples=200, deadline=None)
@given(call=candidates())
def test_rank_candidates_equals_the_reference_and_limit_gives_its_prefix(call):
    expected = _exact(_ref_rank(**call))
    ranked = rank_candidates(**call)
    assert _exact(ranked) == expected
    for k in sorted({0, 1, len(ranked) // 2, len(ranked) - 1, len(ranked) + 1} - {-1}):
        assert _exact(rank_candidates(**call, limit=k)) == expected[:k]


@settings(max_examples=100, deadline=None)
@given(call=candidates(), seed=st.integers(0, 2**32 - 1))
def test_sort_hits_equals_the_reference(call, seed):
    hits = rank_candidates(**call)  # one per memory: add the duplicates back, in any order
    hits += _ref_rank(**call | {"rows": call["rows"][::-1], "sources": call["sources"][::-1]})
    random.Random(seed).shuffle(hits)
    assert _exact(sort_hits(hits)) == _exact(_ref_sort_hits(hits))


def test_ties_follow_the_tier_then_recency_then_the_id() -> None:
    """The cases the property draws by chance, spelled out: equal scores, equal recency, one memory seen
    hot and archived, two chunks of one parent."""
    a, b, c, parent = (uuid.UUID(int=n) for n in (1, 3, 2, 9))
    hot_a = {"memory_id": a, "updated_at": NOW - timedelta(days=5)}
    archived_a = {"memory_id": a, "archive_id": uuid.uuid4()}  # seen hot and archived
    fresh_b = {"memory_id": b}
    old_c = {"memory_id": c, "updated_at": NOW - timedelta(days=5)}
    chunk = {"parent_id": str(parent), "index": 0, "count": 2}
    chunks = [{"memory_id": uuid.UUID(int=n), "chunk": chunk | {"index": n - 7}} for n in (8, 7)]
    base: dict[str, Any] = {
        "user_id": "u1",
        "archive_id": None,
        "text": "t",
        "created_at": NOW,
        "updated_at": NOW,
        "category": "episodic",
        "domain": None,
        "tags": None,
        "storage_ref": None,
        "archived_at": None,
        "similarity": 0.5,
        "in_vector": True,
        "text_rank": None,
    }
    each: list[dict[str, Any]] = [old_c, archived_a, fresh_b, hot_a, *chunks]
    rows = [base | r for r in each]
    sources = ["hot", "archived", "hot", "hot", "archived", "archived"]
    # No vector weight: every row scores 0 and only the tie-breaks order them.
    call: dict[str, Any] = {
        "sources": sources,
        "config": RetrievalConfig(vector_weight=0.0),
        "tags": [],
        "now": NOW,
    }
    hits = rank_candidates(rows, **call)
    assert _exact(hits) == _exact(_ref_rank(rows, **call))
    assert [(h.source, h.provenance.memory_id) for h in hits] == [
        ("hot", b),  # hot and fresh
        ("hot", a),  # hot, older; a < c; its archived copy collapses into it
        ("hot", c),
        ("archived", uuid.UUID(int=7)),  # the parent's best chunk: the smaller id
    ]
    assert [h.provenance.parent_id for h in hits] == [None, None, None, parent]
