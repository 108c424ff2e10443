"""What consolidation reads: a user's memories of a period (hot and archived), their fingerprint, and the
kinds of the names in them. Shared by digests (memory_lib.consolidation.digests), facts and key moments (memory_lib.consolidation.facts).

Invariants: every read is of ONE user (user_id in every WHERE); a memory is read from the tier it is in
now (hot content, or the archived row's level-1 summary); superseded memories are left out (their
successor says what is true). Periods are calendar months (level 2) or years (level 3), or longer
for higher levels, in a given IANA time zone (UTC by default), start inclusive, end exclusive.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal

from ..core.errors import InvalidInputError
from ..core.rows import Conn
from ..llm.extractive import DATE_PATTERN as _DATE  # the archive's own rules
from ..llm.extractive import extract_key_entities, split_sentences

__all__ = [
    "EntityKind",
    "SourceMemory",
    "entity_kinds",
    "period_entity_kinds",
    "fingerprint",
    "level_months",
    "load_period_memories",
    "month_start",
    "period_bounds",
    "user_months",
]

EntityKind = Literal["person", "project", "place", "date", "topic"]


# ------------------------------------------------------------------------------------------ periods


def level_months(level: int) -> int:
    """Months a level-`level` digest covers: 2 → 1 (a month), 3 → 12 (a year), 4 → 120 (a decade), …"""
    if not isinstance(level, int) or isinstance(level, bool) or level < 2:
        raise InvalidInputError("level", level, "must be an integer >= 2 (level 1 is a memory's own summary)")
    return 1 if level == 2 else 12 * 10 ** (level - 3)


def month_start(day: date) -> date:
    return date(day.year, day.month, 1)


def _add_months(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def period_bounds(level: int, day: date) -> tuple[date, date]:
    """The level's period containing `day`: [start, end). Years and decades are aligned to January 1."""
    span = level_months(level)
    first = day.year * 12 + day.month - 1
    start_index = first - first % span
    start = date(start_index // 12, start_index % 12 + 1, 1)
    return start, _add_months(start, span)


# ------------------------------------------------------------------------------------------ sources


@dataclass(frozen=True)
class SourceMemory:
    id: uuid.UUID
    user_id: str
    tier: Literal["hot", "archived"]
    text: str  # hot: the content; archived: the level-1 summary
    created_at: datetime
    updated_at: datetime
    importance: float
    domain: str | None
    entities: tuple[str, ...] = field(default=())


_PERIOD_SQL = """
SELECT id, user_id, 'hot' AS tier, content AS text, created_at, updated_at, importance_score AS importance,
       domain, NULL::text[] AS entities
FROM memories
WHERE user_id = %(user_id)s AND superseded_by IS NULL
  AND created_at >= (%(start)s::timestamp AT TIME ZONE %(tz)s) AND created_at < (%(end)s::timestamp AT TIME ZONE %(tz)s)
UNION ALL
SELECT original_id, user_id, 'archived', summary, original_created_at, original_updated_at, importance_score,
       original_domain, key_entities
FROM archived_memories
WHERE user_id = %(user_id)s AND original_superseded_by IS NULL
  AND original_created_at >= (%(start)s::timestamp AT TIME ZONE %(tz)s)
  AND original_created_at < (%(end)s::timestamp AT TIME ZONE %(tz)s)
ORDER BY created_at, id
"""


def load_period_memories(
    conn: Conn, user_id: str, start: date, end: date, *, tz: str = "UTC"
) -> list[SourceMemory]:
    """The user's current (not superseded) memories created in [start, end), oldest first, either tier."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id", user_id, "must be a non-empty string")
    rows = conn.execute(_PERIOD_SQL, {"user_id": user_id, "start": start, "end": end, "tz": tz}).fetchall()
    out = []
    for r in rows:
        entities = tuple(r["entities"]) if r["entities"] else tuple(extract_key_entities(r["text"], limit=20))
        out.append(
            SourceMemory(
                r["id"],
                r["user_id"],
                r["tier"],
                r["text"],
                r["created_at"],
                r["updated_at"],
                float(r["importance"]),
                r["domain"],
                entities,
            )
        )
    return out


def user_months(conn: Conn, *, tz: str = "UTC", user_id: str | None = None) -> list[tuple[str, date]]:
    """(user, month) pairs that have at least one current memory (hot or archived), in order."""
    rows = conn.execute(
        """SELECT DISTINCT user_id, date_trunc('month', created_at AT TIME ZONE %(tz)s)::date AS month FROM (
               SELECT user_id, created_at FROM memories WHERE superseded_by IS NULL
               UNION ALL
               SELECT user_id, original_created_at FROM archived_memories WHERE original_superseded_by IS NULL
           ) m WHERE %(user_id)s::text IS NULL OR user_id = %(user_id)s ORDER BY 1, 2""",
        {"tz": tz, "user_id": user_id},
    ).fetchall()
    return [(r["user_id"], r["month"]) for r in rows]


def fingerprint(
    builder: str, memories: Sequence[SourceMemory] = (), digests: Sequence[tuple[uuid.UUID, str]] = ()
) -> str:
    """sha256 over the builder and what a build covers: each memory's (tier, id, updated_at), each lower
    digest's (id, fingerprint). Archive, restore, an edit, a supersede or a forget changes it."""
    lines = [f"builder\t{builder}"]
    lines += sorted(f"m\t{m.tier}\t{m.id}\t{m.updated_at.isoformat()}" for m in memories)
    lines += sorted(f"d\t{i}\t{fp}" for i, fp in digests)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ------------------------------------------------------------------------------------------ entity kinds

# Offline rules: the words around a name say what it names. Only a hint (an LLM does better), but
# deterministic, and it needs no list of known people or places.
_PLACE_BEFORE = re.compile(
    r"\b(?:in|to|from|at|near|visit|visited|visiting|around|across)\s+(?:the\s+)?$", re.I
)
_PERSON_BEFORE = re.compile(
    r"(?:\bwith|\bby|\basked|\btold|\bmanager is|\bdoctor,|\bmet|\bcalled|\bemailed|\bthanked|\bfor|\bdear)\s+$",
    re.I,
)
_PERSON_AFTER = re.compile(
    r"^(?:'s|’s|\s+(?:said|asked|approved|noted|mentioned|wants|thinks|is|was|will|lives|works|prefers|plans|"
    r"booked|ran|finished|found|paid|moves|moved|met|called|emailed|wrote|went|flew|has|had)\b)"
)
_TOPIC_BEFORE = re.compile(r"\b(?:reading|read|book|watched|movie|film|album|rated)\s+$", re.I)
_PROJECT = re.compile(r"^(?:Project|Operation|Team)\s|\s(?:Project|Program|Initiative)$")
_UNIT_AFTER = re.compile(r"^\s?\d")  # "EUR 40", "Level 3": a unit or a label, not a name
_CURRENCY = re.compile(r"[A-Z]{3}")
_WEEKDAY = re.compile(r"^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)$")


def _cue_kind(text: str, entity: str) -> EntityKind | None:
    """The kind the words around `entity` in `text` say, or None when no occurrence has a cue."""
    for m in re.finditer(re.escape(entity), text):
        before, after = text[max(0, m.start() - 24) : m.start()], text[m.end() : m.end() + 16]
        if _UNIT_AFTER.match(after):
            return None
        if _TOPIC_BEFORE.search(before):
            return "topic"
        if _PLACE_BEFORE.search(before):
            return "place"
        if _PERSON_BEFORE.search(before) or _PERSON_AFTER.match(after):
            return "person"
    return None


def _form_kind(entity: str) -> EntityKind:
    words = entity.split()
    return "person" if len(words) >= 2 and all(w.isalpha() for w in words) and words[0] != "The" else "topic"


def _entity_cues(text: str, entities: list[str] | tuple[str, ...] | None) -> dict[str, EntityKind | None]:
    """Each name of `text` with its fixed kind (date, project), its cue kind, or None (no cue)."""
    out: dict[str, EntityKind | None] = {}
    for entity in entities if entities is not None else extract_key_entities(text, limit=30):
        if _DATE.fullmatch(entity) and not _WEEKDAY.match(entity):
            out[entity] = "date"
        elif (
            any(c.isdigit() for c in entity)
            or _WEEKDAY.match(entity)
            or not entity[:1].isupper()
            or _CURRENCY.fullmatch(entity)
        ):
            continue
        elif _PROJECT.search(entity):
            out[entity] = "project"
        else:
            out[entity] = _cue_kind(text, entity)
    return out


def entity_kinds(text: str, entities: list[str] | tuple[str, ...] | None = None) -> dict[str, EntityKind]:
    """The names and dates of `text` (extract_key_entities unless given) with their kind; identifiers
    with digits ("ORD-4417"), currency codes and weekdays are left out. Without a cue, a name's form decides
    (two capitalized words: a person; one: a topic)."""
    return {e: kind or _form_kind(e) for e, kind in _entity_cues(text, entities).items()}


def period_entity_kinds(memories: list[SourceMemory]) -> list[dict[str, EntityKind]]:
    """entity_kinds of each memory, with a name's kind voted over the period: a name that a cue calls a
    person in one memory ("Ada's manager") is a person in the memories without a cue too."""
    cues = [_entity_cues(m.text, m.entities) for m in memories]
    votes: dict[str, Counter[str]] = {}
    for per in cues:
        for entity, kind in per.items():
            if kind is not None:
                votes.setdefault(entity, Counter())[kind] += 1
    voted = {e: c.most_common(1)[0][0] for e, c in votes.items()}
    return [{e: kind or voted.get(e) or _form_kind(e) for e, kind in per.items()} for per in cues]  # type: ignore[misc]


def people_and_topics(
    memories: list[SourceMemory], kinds_per_memory: list[dict[str, EntityKind]] | None = None
) -> tuple[Counter[str], Counter[str]]:
    """Mentions per person and per topic (projects, places, other names, the memories' domains)."""
    people: Counter[str] = Counter()
    topics: Counter[str] = Counter()
    if kinds_per_memory is None:
        kinds_per_memory = period_entity_kinds(memories)
    for m, kinds in zip(memories, kinds_per_memory, strict=True):
        for entity, kind in kinds.items():
            if kind == "person":
                people[entity] += 1
            elif kind in ("project", "place", "topic"):
                topics[entity] += 1
        if m.domain:
            topics[m.domain] += 1
    return people, topics


def first_sentence(text: str, max_chars: int = 160) -> str:
    spans = split_sentences(text)
    sentence = text[spans[0][0] : spans[0][1]] if spans else text.strip()
    sentence = re.sub(r" \(also: .*\)$", "", sentence)
    return sentence if len(sentence) <= max_chars else sentence[: max_chars - 1].rstrip() + "…"
