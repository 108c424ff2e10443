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


def _positions(rows: Sequence[Mapping[str, Any]], key: str, include: str | None) -> dict[int, int]:
    """1-based rank of each row index by `key` descending (ties by memory id), among rows where `include`."""
    chosen = [i for i, r in enumerate(rows) if (r[include] if include else r[key] is not None)]
    chosen.sort(key=lambda i: (-float(rows[i][key]), str(rows[i]["memory_id"])))
    return {i: pos for pos, i in enumerate(chosen, start=1)}


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
        rrf = (wv / (k + vp) if vp else 0.0) + (wt * _share(row) / (k + tp) if tp else 0.0)
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
    return sorted(hits, key=lambda h: (-h.scores.final, h.source != "hot", -h.scores.recency, str(h.id)))


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
