"""The LoCoMo data the locomo bench reads (conversations, turns, questions, evidence ids) and the names of
what it measures: cut-offs, settings, baselines, categories."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

import psycopg

from .common import LOCOMO_DEFAULT, REALTALK_DEFAULT

KS = (5, 10, 20)
TOP = max(KS)
CUTOFF_DAYS = 30
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
REALTALK_CATEGORY_NAMES = {1: "multi-answer", 2: "temporal", 3: "inference"}
SETTINGS = ("all_hot", "tiered", "tiered_first_sentence", "hot_only", "phase3_auto", "phase3_always")
BASELINES = ("bm25", "dense", "rrf")
DB: TypeAlias = psycopg.Connection[Any]  # bench_connect's connections: autocommit, dict rows
# --cv: (RetrievalConfig.vector_weight, RetrievalConfig.context_weight) candidates
CV_GRID = tuple((wv, cw) for wv in (0.05, 0.1, 0.25, 0.5) for cw in (0.3, 0.5, 0.7, 1.0))
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*[:;]\s*(\d+)")
# A range of turns, "D12:3-D12:5" or "D12:3-5": every turn between, both ends included.
_RANGE = re.compile(r"D\s*(\d+)\s*:\s*(\d+)\s*-\s*(?:D\s*(\d+)\s*:\s*)?(\d+)")


_SESSION = re.compile(r"session_(\d+)")


def parse_dia_ids(value: Any) -> list[str]:
    """Normalized ids ("D3:7") in an evidence entry; tolerant of "D:11:26", "D30:05", "D8:6; D9:17"."""
    if isinstance(value, list):
        return [i for v in value for i in parse_dia_ids(v)]
    if not isinstance(value, str):
        return []
    return [f"D{int(a)}:{int(b)}" for a, b in _DIA.findall(value)]


def parse_evidence(value: Any, order: Sequence[str]) -> list[str]:
    """parse_dia_ids, with ranges ("D12:3-D12:5", "D12:3-5") expanded to every turn between their ends in
    the conversation's turn order `order` (a range with an end not in the conversation: its ends only)."""
    if isinstance(value, list):
        return [i for v in value for i in parse_evidence(v, order)]
    if not isinstance(value, str):
        return []
    position = {d: i for i, d in enumerate(order)}
    out: list[str] = []
    for part in _RANGE.split(value)[::5]:  # the text between ranges
        out += parse_dia_ids(part)
    for d, first, d2, last in _RANGE.findall(value):
        a, b = f"D{int(d)}:{int(first)}", f"D{int(d2 or d)}:{int(last)}"
        if a in position and b in position and position[a] <= position[b]:
            out += order[position[a] : position[b] + 1]
        else:
            out += [a, b]
    return out


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


def _questions(qas: Sequence[dict[str, Any]], turns: list[Turn]) -> tuple[list[Question], int, int]:
    """The questions with at least one evidence turn in the conversation (unknown ids dropped), how many
    were skipped, how many evidence ids were unknown."""
    order = [t.dia_id for t in turns]
    known = set(order)
    questions, skipped, unknown = [], 0, 0
    for qa in qas:
        evidence = set(parse_evidence(qa.get("evidence", []), order))
        unknown += len(evidence - known)
        evidence &= known
        if not evidence or not str(qa.get("question", "")).strip():
            skipped += 1
            continue
        questions.append(Question(qa["question"], int(qa.get("category", 0)), frozenset(evidence)))
    return questions, skipped, unknown


def _turn(t: dict[str, Any], text_key: str, created_at: datetime) -> Turn | None:
    """A dialogue turn as the bench writes it, "<speaker>: <text>" plus its image's caption; None when it
    has no dia_id or no text."""
    ids = parse_dia_ids(t.get("dia_id"))
    text = str(t.get(text_key) or "").strip()
    if t.get("blip_caption"):
        text = f"{text} [shares {t['blip_caption']}]".strip()
    if not ids or not text:
        return None
    return Turn(uuid.uuid4(), ids[0], f"{t.get('speaker', '?')}: {text}", created_at)


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
                if (turn := _turn(t, "text", date + timedelta(seconds=i))) is not None:
                    turns.append(turn)
        questions, skipped, unknown = _questions(s.get("qa", ()), turns)
        assert last is not None
        out.append(Conversation(s["sample_id"], turns, questions, last + timedelta(days=1), skipped, unknown))
    return out


def _message_time(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%d.%m.%Y, %H:%M:%S").replace(tzinfo=UTC)


def load_realtalk(directory: Path) -> list[Conversation]:
    """REALTALK's chats (one `Chat_*.json` per conversation, LoCoMo's format without the `conversation`
    wrapper): every message "<speaker>: <clean_text>" (plus its image's caption) written at its own time,
    `now` a day after the last message."""
    out = []
    for path in sorted(directory.glob("Chat_*.json"), key=lambda p: int(p.stem.split("_")[1])):
        chat = json.loads(path.read_text())
        sessions = sorted(int(m.group(1)) for k in chat if (m := _SESSION.fullmatch(k)))
        turns: list[Turn] = []
        for n in sessions:
            for t in chat[f"session_{n}"]:
                if (turn := _turn(t, "clean_text", _message_time(t["date_time"]))) is not None:
                    turns.append(turn)
        conv_id = "_".join(path.stem.split("_")[:2]).lower()
        questions, skipped, unknown = _questions(chat.get("qa", ()), turns)
        now = max(t.created_at for t in turns) + timedelta(days=1)
        out.append(Conversation(conv_id, turns, questions, now, skipped, unknown))
    return out


@dataclass(frozen=True)
class Dataset:
    """A conversation benchmark the locomo bench runs: where its data is, how to read it, its question
    categories, and the archival cut-off that leaves a similar share hot (LoCoMo spans months, REALTALK's
    chats three weeks: 30 days archives 79% of LoCoMo's memories, 7 days 74% of REALTALK's)."""

    name: str
    title: str
    default_path: Path
    load: Callable[[Path], list[Conversation]]
    categories: dict[int, str]
    cutoff_days: int
    source: str  # where a user gets the data (never copied into this project)


DATASETS = {
    "locomo": Dataset(
        "locomo",
        "LoCoMo",
        LOCOMO_DEFAULT,
        load_conversations,
        CATEGORY_NAMES,
        CUTOFF_DAYS,
        "data/locomo10.json from snap-research/LoCoMo (CC BY-NC 4.0)",
    ),
    "realtalk": Dataset(
        "realtalk",
        "REALTALK",
        REALTALK_DEFAULT,
        load_realtalk,
        REALTALK_CATEGORY_NAMES,
        7,
        "data/Chat_*.json from danny911kr/REALTALK (no licence stated: evaluation only), in one directory",
    ),
}
