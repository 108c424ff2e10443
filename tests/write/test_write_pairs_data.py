"""Shape of bench/data/write_pairs.jsonl, the labelled pair set for the write path's merge/supersede rule."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "write_pairs.jsonl"

KEYS = {"id", "kind", "label", "old", "new", "slot"}
LABELS = {"distinct", "same", "update"}
# kind -> (allowed labels, minimum number of pairs)
KINDS = {
    "event": ({"distinct"}, 130),
    "near_template": ({"distinct"}, 40),
    "chitchat": ({"distinct"}, 30),
    "negation": ({"distinct", "update"}, 12),
    "state_change": ({"update"}, 45),
    "duplicate": ({"same"}, 30),
    "paraphrase": ({"same"}, 30),
}
EVENT_SLOTS = {"name", "number", "date", "time", "place", "object", "relation", "multi"}
SLOTS_AT_LEAST_12 = ("name", "number", "date", "time", "place", "object")
ISSUES = {
    "event-issue-1": (
        "Tom asked Ada to review pull request #3290 for Project Heron before Thursday",
        "Tom asked Ada to review pull request #1086 for Project Atlas before Tuesday",
        "event",
        "distinct",
        "multi",
    ),
    "event-issue-2": (
        "Booked a hotel in Montreal for the conference in June",
        "Booked a hotel in Reykjavik for the conference in June",
        "event",
        "distinct",
        "place",
    ),
    "event-issue-3": (
        "Meeting with Dr. Patel on Monday at 10am about the knee",
        "Meeting with Dr. Patel on Friday at 3pm about the shoulder",
        "event",
        "distinct",
        "multi",
    ),
    "event-issue-4": (
        "Ada's daughter Mia started piano lessons",
        "Ada's son Leo started piano lessons",
        "event",
        "distinct",
        "relation",
    ),
    "update-issue-1": ("Lives in Lisbon", "Lives in Porto", "state_change", "update", None),
}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    lines = DATA.read_text(encoding="utf-8").splitlines()
    assert lines, f"{DATA} is empty"
    parsed = []
    for n, line in enumerate(lines, 1):
        row = json.loads(line)
        assert isinstance(row, dict) and set(row) == KEYS, f"line {n}: keys {sorted(row)}"
        assert all(isinstance(row[k], str) for k in KEYS), f"line {n}: a value is not a string"
        assert row["id"] and row["old"].strip() and row["new"].strip(), f"line {n}: empty field"
        parsed.append(row)
    return parsed


def test_labels_and_kinds(rows):
    for row in rows:
        assert row["label"] in LABELS, row["id"]
        assert row["kind"] in KINDS, row["id"]
        assert row["label"] in KINDS[row["kind"]][0], row["id"]


def test_ids_and_pairs_unique(rows):
    ids = Counter(row["id"] for row in rows)
    assert [i for i, c in ids.items() if c > 1] == []
    pairs = Counter((row["old"], row["new"]) for row in rows)
    assert [p for p, c in pairs.items() if c > 1] == []


def test_counts_per_kind(rows):
    assert len(rows) >= 320
    counts = Counter(row["kind"] for row in rows)
    for kind, (_, minimum) in KINDS.items():
        assert counts[kind] >= minimum, (kind, counts[kind])


def test_event_slots(rows):
    slots = Counter(row["slot"] for row in rows if row["kind"] == "event")
    assert set(slots) <= EVENT_SLOTS, set(slots) - EVENT_SLOTS
    for slot in SLOTS_AT_LEAST_12:
        assert slots[slot] >= 12, (slot, slots[slot])


def test_issue_pairs_present(rows):
    by_id = {row["id"]: row for row in rows}
    for id_, (old, new, kind, label, slot) in ISSUES.items():
        row = by_id[id_]
        assert (row["old"], row["new"], row["kind"], row["label"]) == (old, new, kind, label), id_
        if slot is not None:
            assert row["slot"] == slot, id_
