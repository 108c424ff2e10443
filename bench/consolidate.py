"""An offline, rule-based consolidation of a LoCoMo conversation for the locomo bench's phase-3 figures.

The digests branch's builders (issue 13 items 1-3) were not available when this was written, so the
bench builds its own rows in sql/016's tables, simply and offline (labelled `bench-offline-rules`):

* level 2, one digest per calendar month: "<Month YYYY>. People: … Topics: … Highlights: …", where
  people/topics are the month's most frequent names and entities (memory_lib.summarize's extractor)
  and highlights the first sentences of the month's most informative turns; sources: the month's turns;
* level 3, one digest per year from its months' digests (topics and people merged);
* facts: every first-person clause "<Speaker>: I <verb> <object>" of a turn becomes
  (speaker, verb, object), valid from the turn's time, sourced to that turn. No supersession.

Real builders (LLM digests, a schema'd fact extractor) will do better or worse: these figures measure
the search path with crude rows, not the builders.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import date
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from memory_lib.consolidated_search import ConsolidatedHit
from memory_lib.summarize import extract_key_entities, split_sentences

BUILDER = "bench-offline-rules"
_VERBS = ("went|got|made|took|ran|began|bought|saw|met|joined|started|won|lost|found|gave|painted|wrote|read|"
          "adopted|visited|moved|signed|left|tried|did|love|like|enjoy|want|plan|volunteer|attended|\\w+ed")  # fmt: skip
_CLAUSE = re.compile(rf"\b(?:I|We)\s+(?:just\s+|recently\s+|finally\s+|also\s+|actually\s+|really\s+)?"
                     rf"(?:have\s+|had\s+|'ve\s+)?({_VERBS})\s+([^.!?;]{{3,90}})", re.IGNORECASE)  # fmt: skip


def _month(d: Any) -> date:
    return date(d.year, d.month, 1)


def _next(d: date, months: int = 1) -> date:
    y, m = divmod(d.month - 1 + months, 12)
    return date(d.year + y, m + 1, 1)


def _digest_text(label: str, people: list[str], topics: list[str], highlights: list[str]) -> str:
    return f"{label}. People: {', '.join(people) or '-'}. Topics: {', '.join(topics) or '-'}. " \
           f"Highlights: {' '.join(highlights) or '-'}"  # fmt: skip


def facts_of(speaker_text: str) -> list[tuple[str, str, str]]:
    """(subject, predicate, object) of each first-person clause of a "<Speaker>: text" turn."""
    speaker, _, text = speaker_text.partition(": ")
    out = []
    for m in _CLAUSE.finditer(text):
        obj = " ".join(m.group(2).split()[:12]).strip(" ,")
        if obj:
            out.append((speaker or "user", m.group(1).lower(), obj))
    return out


def build(conn: psycopg.Connection, user_id: str, turns: list[Any], embedder: Any) -> dict[str, int]:
    """Monthly and yearly digests and facts for `turns` (bench.locomo.Turn) of `user_id`; returns counts."""
    by_month: dict[date, list[Any]] = defaultdict(list)
    for t in turns:
        by_month[_month(t.created_at)].append(t)
    months: list[tuple[date, str, list[Any], Counter[str]]] = []
    for start, ts in sorted(by_month.items()):
        entities: Counter[str] = Counter()
        scored = []
        for t in ts:
            found = extract_key_entities(t.content, limit=20)
            entities.update(found)
            spans = split_sentences(t.content)
            scored.append((len(found), t.content[spans[0][0]:spans[0][1]] if spans else t.content))
        speakers = Counter(t.content.partition(": ")[0] for t in ts)
        people = [p for p, _ in speakers.most_common(4)]
        topics = [e for e, _ in entities.most_common(12) if e not in speakers][:8]
        highlights = [s for _, s in sorted(scored, key=lambda x: -x[0])[:5]]
        months.append((start, _digest_text(start.strftime("%B %Y"), people, topics, highlights), ts, entities))
    rows: list[tuple[Any, ...]] = [(2, start, _next(start), text, [t.memory_id for t in ts]) for start, text, ts, _ in months]
    for year in sorted({m[0].year for m in months}):
        ms = [m for m in months if m[0].year == year]
        merged: Counter[str] = Counter()
        for m in ms:
            merged.update(m[3])
        text = _digest_text(str(year), [], [e for e, _ in merged.most_common(12)],
                            [m[0].strftime("%B") + ": " + ", ".join(e for e, _ in m[3].most_common(3)) for m in ms])  # fmt: skip
        rows.append((3, date(year, 1, 1), date(year + 1, 1, 1), text, [t.memory_id for m in ms for t in m[2]]))
    vecs = np.asarray(embedder.embed([r[3] for r in rows]), dtype=np.float32)
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO memory_digests (user_id, level, period_start, period_end, summary, body, embedding,
                   embedding_model, source_memory_ids, source_fingerprint, summarizer_kind, summary_model)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'bench', %s, 'none')""",
            [(user_id, lvl, s, e, text, Jsonb({}), v, embedder.model, ids, BUILDER)
             for (lvl, s, e, text, ids), v in zip(rows, vecs, strict=True)],
        )  # fmt: skip
    facts = [(t, f) for t in turns for f in facts_of(t.content)]
    if facts:
        fvecs = np.asarray(embedder.embed([" ".join(f) for _, f in facts]), dtype=np.float32)
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO memory_facts (user_id, kind, subject, predicate, object, valid_from, source_memory_ids,
                       extractor, embedding, embedding_model) VALUES (%s, 'other', %s, %s, %s, %s, %s, %s, %s, %s)""",
                [(user_id, s, p, o, t.created_at, [t.memory_id], BUILDER, v, embedder.model)
                 for (t, (s, p, o)), v in zip(facts, fvecs, strict=True)],
            )  # fmt: skip
    return {"digests_l2": len(months), "digests_l3": len(rows) - len(months), "facts": len(facts)}


def provenance_list(consolidated: list[ConsolidatedHit]) -> list[Any]:
    """Phase 3's hits as memory ids, best first: a fact's sources. A digest covers a whole month or year:
    counting its turns as found would inflate recall, so digests add nothing here."""
    out: list[Any] = []
    for hit in consolidated:
        if hit.kind == "fact":
            out += [i for i in hit.source_memory_ids if i not in out]
    return out
