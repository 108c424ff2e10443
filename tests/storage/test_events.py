"""memory_lib.storage.events is the audit log's one writer: every EventType is one the database accepts
(and every type the database accepts is an EventType), the clock rule holds for both shapes, an unknown
type is refused by name, and no other module of memory_lib spells the INSERT."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

import memory_lib
from memory_lib.core.errors import InvalidInputError
from memory_lib.core.plans import run_plan
from memory_lib.core.statuses import EventType
from memory_lib.storage import events

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def _one(op):
    return (yield op)


def _checked_types(conn) -> set[str]:
    definition = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint WHERE conname = 'memory_events_event_type_check'"
    ).fetchone()["d"]
    return set(re.findall(r"'(\w+)'::text", definition))


def test_the_enum_is_the_database_check(conn):
    assert _checked_types(conn) == {t.value for t in EventType}


def test_every_event_type_is_written_one_by_one_and_set_based(conn):
    user, ids = "u-events", [uuid.uuid4() for _ in EventType]
    for memory_id, kind in zip(ids, EventType, strict=True):
        assert run_plan(conn, _one(events.event(memory_id, user, kind, "test", NOW, {"i": kind.value}))) == 1
    rows = [(memory_id, user, {"set": kind.value}) for memory_id, kind in zip(ids, EventType, strict=True)]
    for kind in EventType:  # the set-based shape, one statement per type
        assert run_plan(conn, _one(events.events(kind, rows[:2], actor="test", now=NOW))) == 2
    stored = conn.execute(
        "SELECT event_type, details, occurred_at, actor FROM memory_events WHERE user_id = %s ORDER BY id",
        (user,),
    ).fetchall()
    assert [r["event_type"] for r in stored[: len(EventType)]] == [t.value for t in EventType]
    assert [r["details"] for r in stored[: len(EventType)]] == [{"i": t.value} for t in EventType]
    assert len(stored) == 3 * len(EventType)
    assert {r["occurred_at"] for r in stored} == {NOW}
    assert {r["actor"] for r in stored} == {"test"}


def test_without_a_now_the_event_is_at_the_database_clock(conn):
    before = conn.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
    memory_id = uuid.uuid4()
    run_plan(conn, _one(events.event(memory_id, "u-clock", EventType.UPDATED, "test", None, {})))
    run_plan(conn, _one(events.events(EventType.UPDATED, [(memory_id, "u-clock", {})], actor="t", now=None)))
    conn.execute(
        events.insert_select(
            "SELECT %(id)s::uuid AS memory_id, 'u-clock' AS user_id, '{}'::jsonb AS details"
        ),
        events.event_params(EventType.UPDATED, "t", None) | {"id": memory_id},
    )
    after = conn.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
    times = [
        r["occurred_at"]
        for r in conn.execute("SELECT occurred_at FROM memory_events WHERE memory_id = %s", (memory_id,))
    ]
    assert len(times) == 3 and all(before <= t <= after for t in times)


def test_an_unknown_event_type_is_refused_by_name():
    with pytest.raises(InvalidInputError, match="event_type.*'touched'"):
        events.event(uuid.uuid4(), "u", "touched", "test", NOW, {})
    with pytest.raises(InvalidInputError, match="event_type"):
        events.events("touched", [], actor="test", now=NOW)


def test_no_other_module_spells_the_insert():
    root = Path(memory_lib.__file__).parent
    spelled = [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*.py"))
        if re.search(r"insert\s+into\s+memory_events\b", p.read_text(), re.IGNORECASE)
    ]
    assert spelled == ["storage/events.py"]
