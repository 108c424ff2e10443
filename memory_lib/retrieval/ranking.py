"""Ranking, pure: fusion of the vector and full-text candidate lists of both tiers, and the final score.

The formula is in memory_lib/retrieval/search.py's docstring; `rank_candidates` applies it, `cut` takes
the best hits within the per-tier caps. No I/O: the plan hands the rows in.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from ..core.config import RetrievalConfig
from ..core.timescope import TimeWindow
from .sql import VectorArm
from .types import HitScores, Provenance, SearchHit, Source

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


def _id_keys(ids: Sequence[Any]) -> list[Any]:
    """Sort keys ordering ids as str(id) does: uuid.UUID's int when all are UUIDs (its lowercase hex
    is fixed-width, so the orders agree, without formatting a string per id), else str(id)."""
    if set(map(type, ids)) <= {uuid.UUID}:
        return [i.int for i in ids]
    return [str(i) for i in ids]


def _positions(
    rows: Sequence[Mapping[str, Any]], key: str, include: str | None, id_keys: Sequence[Any]
) -> dict[int, int]:
    """1-based rank of each row index by `key` descending (ties by memory id: id_keys[i] is row i's
    _id_keys), among rows where `include`."""
    if include:
        chosen = [i for i, r in enumerate(rows) if r[include]]
    else:
        chosen = [i for i, r in enumerate(rows) if r[key] is not None]
    keys = [(-float(rows[i][key]), id_keys[i]) for i in chosen]
    order = sorted(range(len(chosen)), key=keys.__getitem__)  # stable: as sorting `chosen` by key
    return {chosen[j]: pos for pos, j in enumerate(order, start=1)}


# The vector list's RRF weight when the config leaves it unset, by embedder kind. Chosen by leave-one-
# conversation-out cross-validation on LoCoMo's dev split through the user's path (`python -m bench
# locomo --cv`, with the default context_weight): the weight with the best recall@10 over all folds.
# The full-text list (BM25 with context) carries most of the ranking for both kinds; the vector list
# reorders and adds the memories that share no word with the question. A hashing (lexical) embedder's
# list mostly repeats full text, and its archived sign bits estimate cosines poorly (sparse vectors).
VECTOR_WEIGHT_BY_KIND: dict[str, float] = {"semantic": 0.25, "lexical": 0.05}


def _share(row: Mapping[str, Any]) -> float:
    """The share of the question's idf mass a full-text candidate carries (1 when the statement gives
    none: ts_rank_cd or explicit text queries). A match on one word of a five-word question gets a fifth
    of a full match's credit, so a strong vector match can outrank it."""
    share = row.get("text_share")
    return 1.0 if share is None else float(share)


def resolved_vector_weight(config: RetrievalConfig, embedder_kind: str | None) -> float:
    """config.vector_weight, or the weight for the embedder's kind (semantic when unknown)."""
    if config.vector_weight is not None:
        return config.vector_weight
    return VECTOR_WEIGHT_BY_KIND.get(embedder_kind or "semantic", VECTOR_WEIGHT_BY_KIND["semantic"])


def rank_candidates(
    rows: Sequence[Mapping[str, Any]],
    *,
    sources: Sequence[Source],
    config: RetrievalConfig,
    tags: Sequence[str],
    now: datetime,
    window: TimeWindow | None = None,
    embedder_kind: str | None = None,
    limit: int | None = None,
) -> list[SearchHit]:
    """Fuse and score the candidates of both tiers together (formula in the module docstring), best first.

    rows[i] comes from tier sources[i]. A vector-only candidate below its tier's optional cosine floor
    is dropped; a full-text match is always kept. Rows with the same original id (a memory seen hot and
    archived by a concurrent archival), and chunks of one parent, collapse to the better one. The order
    is sort_hits'. With `limit`, only the first `limit` hits of that list are built and returned.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    k = config.rrf_k
    wv, wt = resolved_vector_weight(config, embedder_kind), config.text_weight
    memory_ids = _id_keys([r["memory_id"] for r in rows])
    vec_pos = _positions(rows, "similarity", "in_vector", memory_ids)
    txt_pos = _positions(rows, "text_rank", None, memory_ids)
    rrf_max = (wv + wt) / (k + 1)
    hot_floor, archived_floor = config.hot_similarity_threshold, config.archived_similarity_threshold
    alpha, beta, gamma, delta = (
        config.alpha_similarity,
        config.beta_recency,
        config.gamma_tags,
        config.delta_time,
    )
    half_life, active_boost = config.recency_half_life_days, config.active_boost
    # Plain numbers per kept row; the dataclasses are built only for the hits returned.
    numbers: list[tuple[Any, ...]] = []
    keys: list[tuple[float, bool, float]] = []  # sort_hits' key but the id: -final, not hot, -recency
    for i, row in enumerate(rows):
        is_hot = sources[i] == "hot"
        similarity = float(row["similarity"])
        text_rank = row["text_rank"]
        floor = hot_floor if is_hot else archived_floor
        if floor is not None and similarity < floor and text_rank is None:
            continue
        vp, tp = vec_pos.get(i), txt_pos.get(i)
        rrf = (wv / (k + vp) if vp else 0.0) + (wt * _share(row) / (k + tp) if tp else 0.0)
        relevance = rrf / rrf_max
        recency = recency_decay(row["updated_at"], now, half_life)
        tags_score = tag_match(tags, _tags(row)) if tags else 0.0
        in_window = 1.0 if window is not None and window.contains(row["created_at"]) else 0.0
        boost = active_boost if is_hot else 1.0
        final = boost * (alpha * relevance + beta * recency + gamma * tags_score + delta * in_window)
        numbers.append(
            (i, similarity, text_rank, vp, tp, rrf, relevance, recency, tags_score, in_window, boost, final)
        )
        keys.append((-final, not is_hot, -recency))

    ids = _id_keys([(r := rows[n[0]])["archive_id"] or r["memory_id"] for n in numbers])  # SearchHit.id's
    out: list[SearchHit] = []
    seen: set[Any] = set()
    for j in sorted(range(len(numbers)), key=lambda j: (*keys[j], ids[j])):
        if len(out) == limit:
            break
        row = rows[numbers[j][0]]
        chunk = row.get("chunk") if isinstance(row.get("chunk"), dict) else None
        parent_id = uuid.UUID(chunk["parent_id"]) if chunk else None
        key = parent_id or row["memory_id"]
        if key in seen:  # the best hit of each memory, and of each long text's chunks
            continue
        seen.add(key)
        out.append(_hit(row, sources[numbers[j][0]], numbers[j], chunk, parent_id))
    return out


def _tags(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(row["tags"]) if isinstance(row["tags"], list) else ()


def _hit(
    row: Mapping[str, Any],
    source: Source,
    numbers: tuple[Any, ...],
    chunk: dict[str, Any] | None,
    parent_id: uuid.UUID | None,
) -> SearchHit:
    _, similarity, text_rank, vp, tp, rrf, relevance, recency, tags_score, in_window, boost, final = numbers
    scores = HitScores(
        similarity=similarity,
        text_rank=None if text_rank is None else float(text_rank),
        vector_position=vp,
        text_position=tp,
        rrf=rrf,
        hybrid_similarity=relevance,
        recency=recency,
        tag_match=tags_score,
        boost=boost,
        final=final,
        time_match=in_window,
    )
    return SearchHit(
        source,
        row["text"],
        scores,
        provenance_of(row, chunk, parent_id),
        superseded_by=row.get("superseded_by"),
    )


def provenance_of(
    row: Mapping[str, Any], chunk: Mapping[str, Any] | None = None, parent_id: uuid.UUID | None = None
) -> Provenance:
    """Where a search statement's row (ARCHIVED_SELECT's or the hot tier's columns) comes from; `chunk`
    and `parent_id` when the row is a chunk of a long text."""
    return Provenance(
        user_id=row["user_id"],
        memory_id=row["memory_id"],
        archive_id=row["archive_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        category=row["category"],
        domain=row["domain"],
        tags=_tags(row),
        storage_ref=row["storage_ref"],
        archived_at=row["archived_at"],
        parent_id=parent_id,
        chunk_index=chunk["index"] if chunk else None,
        chunk_count=chunk["count"] if chunk else None,
    )


def sort_hits(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """Best first; ties go to hot hits, then to the more recent, then by id (str order, deterministic)."""
    ids = _id_keys([h.id for h in hits])
    keys = [
        (-h.scores.final, h.source != "hot", -h.scores.recency, i) for h, i in zip(hits, ids, strict=True)
    ]
    return [hits[j] for j in sorted(range(len(hits)), key=keys.__getitem__)]


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


def candidate_pool(limit: int, config: RetrievalConfig) -> int:
    """How many candidates each arm of the hybrid search fetches before fusion."""
    return max(limit * config.candidates_per_hit, config.min_candidates)


def rerank_rows(
    rows: Sequence[dict[str, Any]], arm: VectorArm, query: np.ndarray, pool: int
) -> list[dict[str, Any]]:
    """With arm.rerank: every row's similarity from its compact vector; the best `pool` of the vector
    candidates stay vector candidates, the others only as full-text matches (or not at all)."""
    if arm.rerank is None:
        return list(rows)
    out = [r | {"similarity": arm.rerank(r["rerank"], query)} for r in rows]
    vec = sorted((r for r in out if r["in_vector"]), key=lambda r: (-r["similarity"], str(r["memory_id"])))
    for r in vec[pool:]:
        r["in_vector"] = False
    return [r for r in out if r["in_vector"] or r["text_rank"] is not None]
