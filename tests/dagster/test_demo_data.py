"""The demo history is deterministic and shaped like a real agent's memory."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from memory_assets.demo_data import generate_history

END = datetime(2026, 11, 1, tzinfo=UTC)


def test_same_arguments_same_history():
    a = list(generate_history(end=END, days=30))
    b = list(generate_history(end=END, days=30))
    assert a == b
    assert list(generate_history(end=END, days=30, seed=8)) != a


def test_shape_of_eighteen_months():
    mems = list(generate_history(end=END))
    per_day = Counter((m.created_at.date()) for m in mems if m.category != "core")
    assert len(per_day) == 540
    assert min(per_day.values()) >= 50 and max(per_day.values()) <= 100
    assert len({m.user_id for m in mems}) == 4
    assert min(m.created_at for m in mems) >= END - timedelta(days=540)
    assert len({m.id for m in mems}) == len(mems)
    # Names, numbers and dates appear in the text.
    assert sum(bool(re.search(r"\d", m.content)) for m in mems) / len(mems) > 0.8
    assert sum(bool(re.search(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b", m.content)) for m in mems) / len(mems) > 0.3
    # Hot / warm / cold: most memories are routine and cold, a minority matters.
    imp = [m.importance_score for m in mems]
    cold = sum(i <= 0.3 for i in imp) / len(imp)
    hot = sum(i >= 0.6 for i in imp) / len(imp)
    assert 0.45 < cold < 0.8 and 0.05 < hot < 0.3
    # Old, unimportant memories are rarely used lately; core facts are used often.
    core = [m for m in mems if m.category == "core"]
    assert core and all(m.access_count >= 20 for m in core)
    recent = END - timedelta(days=30)
    stale_cold = [m for m in mems if m.importance_score <= 0.3 and m.created_at < END - timedelta(days=120)]
    assert (
        sum(bool(m.last_accessed_at and m.last_accessed_at > recent) for m in stale_cold) / len(stale_cold)
        < 0.2
    )


def test_scales_past_100k():
    n = sum(1 for _ in generate_history(end=END, days=1400, per_day=(70, 90)))
    assert n > 100_000


@pytest.mark.parametrize("kwargs", [{"days": 0}, {"users": 9}, {"per_day": (10, 5)}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        list(generate_history(end=END, **kwargs))
