"""Reactivation through associations: archived memories that hot hits link to.

A hot memory's `entity_links` name other memories by id. When some of those have been archived, a
search with `follow_links=True` surfaces them next to its hits: `SearchResult.associated`, each an
archived SearchHit whose `linked_from` is the hot hit that names it (label "[archived, linked from
<id>]"). They are not ranked with the hits (scores.final is 0, their similarity is the summary's
estimated cosine to the query) and do not count against `limit`; at most
`RetrievalConfig.associated_limit`, in the order of the hot hits that link to them. The caller's
hard filters apply to them as to any hit. Only the links stored in the database are followed: hot
→ archived. An archived memory's own links live in its backup object and are not searched.

Using one (record_access with its archive or original id) while a live hot memory of the same user
still links to it appends a row to `archive_link_uses`; the re-promotion rule (memory_lib.lifecycle.promotion,
"N uses in the window") counts those rows with the 'expanded' events, so an archived memory reached
through associations and used returns to the hot tier by the same rule, at the next expansion or the
nightly promotions sweep. A use of an archived memory no hot memory links to counts as before (its
access_count only).

Every statement names the user: links are followed to archive rows of the same user_id only, even
if a hot memory's entity_links name another user's memory id.

Default off: LoCoMo's turns carry no entity links, so `bench locomo` cannot show a gain, and
appended memories a caller did not ask for would change what `build_context` packs.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from ..core.plans import Plan, Sql
from .ranking import provenance_of, recency_decay, tag_match
from .search import search_plan
from .sql import ARCHIVED_FILTERS, ARCHIVED_SELECT, ARCHIVED_VECTORS
from .types import HitScores, SearchHit, SearchRequest, SearchResult

__all__ = ["LINK_USES_SQL", "linked_archives_plan", "search_with_links_plan"]

LINKED_ARCHIVES_SQL = f"""
    SELECT DISTINCT ON (a.id) m.id AS linked_from, array_position(%(hot_ids)s::uuid[], m.id) AS hot_rank,
           {ARCHIVED_SELECT},
           coalesce({ARCHIVED_VECTORS.similarity}, 0) AS similarity
    FROM memories m
    JOIN archived_memories a ON a.user_id = m.user_id AND a.original_id = ANY(m.entity_links)
    WHERE m.user_id = %(user_id)s AND a.user_id = %(user_id)s AND m.id = ANY(%(hot_ids)s::uuid[])
      AND a.original_superseded_by IS NULL {ARCHIVED_FILTERS}
    ORDER BY a.id, hot_rank"""

# One row per archived memory used (by archive id or original id) that a live hot memory of the same
# user links to; linked_from is the most recently updated such memory.
LINK_USES_SQL = """
    INSERT INTO archive_link_uses (archive_id, user_id, original_id, linked_from, used_at)
    SELECT a.id, a.user_id, a.original_id, l.id, %(now)s
    FROM archived_memories a
    CROSS JOIN LATERAL (
        SELECT m.id FROM memories m
        WHERE m.user_id = a.user_id AND m.entity_links @> ARRAY[a.original_id] AND m.superseded_by IS NULL
        ORDER BY m.updated_at DESC, m.id LIMIT 1
    ) l
    WHERE a.user_id = %(user_id)s AND (a.id = ANY(%(ids)s) OR a.original_id = ANY(%(ids)s))"""


def linked_archives_plan(request: SearchRequest, result: SearchResult) -> Plan[list[SearchHit]]:
    """The archived memories the result's hot hits link to, not already among its hits."""
    limit = request.config.associated_limit
    hot_ids = [h.provenance.memory_id for h in result.hits if h.source == "hot"]
    if not hot_ids or limit == 0:
        return []
    params = {
        "user_id": request.user_id,
        "hot_ids": hot_ids,
        "embedding": request.embedding,
        **request.filters.params(),
    }
    rows = yield Sql(LINKED_ARCHIVES_SQL, params)
    shown = {h.provenance.memory_id for h in result.hits}
    rows = sorted(
        (r for r in rows if r["memory_id"] not in shown),
        key=lambda r: (r["hot_rank"], -float(r["similarity"]), str(r["archive_id"])),
    )
    return [_hit(r, request) for r in rows[:limit]]


def _hit(row: dict[str, Any], request: SearchRequest) -> SearchHit:
    tags = tuple(row["tags"]) if isinstance(row["tags"], list) else ()
    scores = HitScores(
        similarity=float(row["similarity"]),
        text_rank=None,
        vector_position=None,
        text_position=None,
        rrf=0.0,
        hybrid_similarity=0.0,
        recency=recency_decay(row["updated_at"], request.now, request.config.recency_half_life_days),
        tag_match=tag_match(request.tags, tags),
        boost=1.0,
        final=0.0,
    )
    linked_from: uuid.UUID = row["linked_from"]
    return SearchHit("archived", row["text"], scores, provenance_of(row), linked_from=linked_from)


def search_with_links_plan(request: SearchRequest, *, follow_links: bool) -> Plan[SearchResult]:
    """search_plan, then (follow_links) the archived memories its hot hits link to, in the same snapshot."""
    result = yield from search_plan(request)
    if not follow_links:
        return result
    associated = yield from linked_archives_plan(request, result)
    return replace(result, associated=associated)
