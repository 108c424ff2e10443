"""The LoCoMo data the locomo bench reads (conversations, turns, questions, evidence ids) and the names of
what it measures: cut-offs, settings, baselines, categories."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

import psycopg

KS = (5, 10, 20)
TOP = max(KS)
CUTOFF_DAYS = 30
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SETTINGS = ("all_hot", "tiered", "tiered_first_sentence", "hot_only", "phase3_auto", "phase3_always")
BASELINES = ("bm25", "dense", "rrf")
DB: TypeAlias = psycopg.Connection[Any]  # bench_connect's connections: autocommit, dict rows
# --cv: (RetrievalConfig.vector_weight, RetrievalConfig.context_weight) candidates
CV_GRID = tuple((wv, cw) for wv in (0.05, 0.1, 0.25, 0.5) for cw in (0.3, 0.5, 0.7, 1.0))
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


_SESSION = re.compile(r"session_(\d+)")


def parse_dia_ids(value: Any) -> list[str]:
    """Normalized ids ("D3:7") in an evidence entry; tolerant of "D:11:26", "D30:05", "D8:6; D9:17"."""
    if isinstance(value, list):
        return [i for v in value for i in parse_dia_ids(v)]
    if not isinstance(value, str):
        return []
    return [f"D{int(a)}:{int(b)}" for a, b in _DIA.findall(value)]


@dataclass(frozen=True)
class Turn:
    memory_id: uuid.UUID  # the id load_turns (the fixture loader) gives it; the client assigns its own
    dia_id: str
    content: str
    created_at: datetime


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: frozenset[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]
    now: datetime
    skipped_questions: int  # no evidence id that exists in the conversation
    unknown_evidence_ids: int


def _session_date(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def load_conversations(path: Path) -> list[Conversation]:
    samples = json.loads(path.read_text())
    out = []
    for s in samples:
        conv = s["conversation"]
        sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)))
        turns: list[Turn] = []
        last = None
        for n in sessions:
            date = _session_date(conv[f"session_{n}_date_time"])
            last = date if last is None or date > last else last
            for i, t in enumerate(conv[f"session_{n}"]):
                ids = parse_dia_ids(t.get("dia_id"))
                text = str(t.get("text") or "").strip()
                if t.get("blip_caption"):
                    text = f"{text} [shares {t['blip_caption']}]".strip()
                if not ids or not text:
                    continue
                content = f"{t.get('speaker', '?')}: {text}"
                turns.append(Turn(uuid.uuid4(), ids[0], content, date + timedelta(seconds=i)))
        known = {t.dia_id for t in turns}
        questions, skipped, unknown = [], 0, 0
        for qa in s.get("qa", ()):
            evidence = set(parse_dia_ids(qa.get("evidence", [])))
            unknown += len(evidence - known)
            evidence &= known
            if not evidence or not str(qa.get("question", "")).strip():
                skipped += 1
                continue
            questions.append(Question(qa["question"], int(qa.get("category", 0)), frozenset(evidence)))
        assert last is not None
        out.append(Conversation(s["sample_id"], turns, questions, last + timedelta(days=1), skipped, unknown))
    return out
