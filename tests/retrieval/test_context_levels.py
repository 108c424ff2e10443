"""Context assembly with summary levels: highest level first, trimmed lowest level first."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, ContextBudget
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.context import ContextItem, assemble_context
from testing.consolidation import insert_digest, insert_fact
from testing.constants import TEST_DIM
from testing.factories import archival_services

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
COUNTER = lambda t: len(t.split())  # noqa: E731 - every item below is 10 "tokens"


def _summary(name: str, level: int, days_ago: int) -> ContextItem:
    return ContextItem(
        f"{name} " + "w " * 9,
        "digest" if level > 1 else "archived",
        NOW - timedelta(days=days_ago),
        level=level,
    )


SUMMARIES = [
    _summary("l1-old", 1, 9),
    _summary("l2-new", 2, 40),
    _summary("l1-new", 1, 2),
    _summary("l3", 3, 400),
    _summary("l2-old", 2, 70),
]


def _names(ctx, part=None) -> list[str]:
    return [b.text.split()[0] for b in (ctx.part(part) if part else ctx.blocks)]


def test_summaries_go_highest_level_first_oldest_first_within_a_level():
    ctx = assemble_context(summaries=SUMMARIES, counter=COUNTER)
    assert _names(ctx) == ["l3", "l2-old", "l2-new", "l1-old", "l1-new"]
    assert [b.level for b in ctx.part("summaries")] == [3, 2, 2, 1, 1]


def test_the_summary_budget_keeps_the_highest_levels_then_the_newest():
    budget = ContextBudget(total=1000, summaries=30, recent_turns=100, snippets=100, reserve=0)
    ctx = assemble_context(summaries=SUMMARIES, budget=budget, counter=COUNTER)
    assert _names(ctx) == ["l3", "l2-old", "l2-new"]
    budget = budget.model_copy(update={"summaries": 20})
    assert _names(assemble_context(summaries=SUMMARIES, budget=budget, counter=COUNTER)) == ["l3", "l2-new"]


def test_trimming_goes_snippets_then_oldest_turns_then_lowest_level_oldest_summaries():
    snippets = [ContextItem(f"snip{i} " + "w " * 9, "hot") for i in range(2)]
    turns = [f"turn{i} " + "w " * 9 for i in range(2)]

    def names(max_tokens):
        return _names(
            assemble_context(
                summaries=SUMMARIES,
                recent_turns=turns,
                snippets=snippets,
                counter=COUNTER,
                max_tokens=max_tokens,
            )
        )

    full = ["l3", "l2-old", "l2-new", "l1-old", "l1-new"]
    assert names(90) == [*full, "snip0", "snip1", "turn0", "turn1"]
    assert names(80) == [*full, "snip0", "turn0", "turn1"]  # the worst snippet first
    assert names(70) == [*full, "turn0", "turn1"]
    assert names(60) == [*full, "turn1"]  # then the oldest turn
    assert names(50) == full
    assert names(40) == ["l3", "l2-old", "l2-new", "l1-new"]  # then the lowest level, oldest first
    assert names(30) == ["l3", "l2-old", "l2-new"]
    assert names(20) == ["l3", "l2-new"]
    assert names(10) == ["l3"]  # the highest level goes last
    assert names(0) == []


def test_a_bad_level_is_named():
    with pytest.raises(InvalidInputError, match="ContextItem.level"):
        ContextItem("x", "caller", level=0)


def test_build_context_puts_active_digests_first_then_archived_summaries_and_facts(conn, local_store):
    embedder = HashingEmbedder(TEST_DIM)
    client = MemoryClient(conn, embedder=embedder, object_store=local_store, actor="test")
    old = client.add(
        "u1",
        "Lunch with my sister Sarah at the harbour in Porto.",
        importance=0.1,
        now=NOW - timedelta(days=200),
    ).memory_id
    hot = client.add("u1", "Sarah visits Porto again next week.", now=NOW).memory_id
    other = client.add("u2", "Sarah is my landlord.", now=NOW).memory_id
    services = archival_services(local_store, embedder=embedder)
    run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=NOW, actor="test")

    def digest(user, level, start, end, text, ids):
        return insert_digest(
            conn,
            embedder,
            user_id=user,
            level=level,
            period_start=start,
            period_end=end,
            summary=text,
            source_memory_ids=ids,
        )

    digest("u1", 3, date(2025, 1, 1), date(2026, 1, 1), "2025: family lunches in Porto", [old])
    digest("u1", 2, date(2025, 11, 1), date(2025, 12, 1), "November 2025: lunch with Sarah", [old])
    digest("u1", 2, date(2026, 5, 1), date(2026, 6, 1), "May 2026: planning Sarah's visit", [hot])
    digest("u2", 3, date(2025, 1, 1), date(2026, 1, 1), "2025: moved flats, new landlord", [other])
    insert_fact(
        conn,
        embedder,
        user_id="u1",
        subject="Sarah",
        predicate="is",
        obj="the user's sister",
        valid_from=NOW - timedelta(days=200),
        source_memory_ids=[old],
    )

    ctx = client.build_context("u1", "Who is Sarah?", [{"role": "user", "content": "Who is Sarah?"}], now=NOW)
    summaries = ctx.part("summaries")
    assert [b.level for b in summaries] == [3, 2, 1]
    assert (
        summaries[0].text.startswith("[digest L3] 2025: family lunches")
        and "from 1 memories" in summaries[0].text
    )
    assert summaries[1].text.startswith("[digest L2] May 2026") and summaries[2].text.startswith("[archived]")
    assert (
        "November 2025" not in ctx.render() and "landlord" not in ctx.render()
    )  # covered by L3; another user's
    snippets = ctx.part("snippets")
    assert (
        snippets[0].text.startswith("[fact] Sarah is the user's sister (since ")
        and snippets[0].source == "fact"
    )
    assert [b.provenance and b.provenance.memory_id for b in snippets[1:]] == [hot]
    assert (
        ctx.render().index("[digest L3]") < ctx.render().index("[fact]") < ctx.render().index("user: Who is")
    )
