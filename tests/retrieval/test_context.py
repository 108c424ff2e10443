"""Token-budgeted context assembly: budgets never exceeded, trim order, duplicates, provenance."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, ContextBudget, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.context import ContextItem, approx_token_count, assemble_context
from memory_lib.retrieval.types import Provenance
from testing.constants import TEST_DIM
from testing.factories import archival_services

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def _prov(i: int) -> Provenance:
    return Provenance("u1", uuid.uuid4(), None, NOW - timedelta(days=i), NOW, "episodic", None, ())


def test_approx_token_count():
    assert approx_token_count("") == 0
    assert approx_token_count("hello world") == 4  # ceil(5/4) twice
    assert approx_token_count("ORD-4417, paid.") == 1 + 1 + 1 + 1 + 1 + 1  # ORD - 4417 , paid .
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert approx_token_count(text) == approx_token_count(text)
    assert approx_token_count(text) >= len(text) / 5


# --------------------------------------------------------------------------- property: budgets hold

WORDS = st.sampled_from(
    str.split("alpha beta gamma delta tea coffee Lisbon ORD-4417 42 the a , . ! loremipsumdolorsit")
)
TEXT = st.lists(WORDS, min_size=1, max_size=60).map(" ".join)


@st.composite
def budgets(draw) -> ContextBudget:
    summaries, recent, snippets, reserve = (draw(st.integers(0, 300)) for _ in range(4))
    slack = draw(st.integers(0, 200))
    return ContextBudget(
        total=summaries + recent + snippets + reserve + slack,
        summaries=summaries,
        recent_turns=recent,
        snippets=snippets,
        reserve=reserve,
    )


COUNTERS = st.sampled_from([approx_token_count, len, lambda t: len(t.split())])


@settings(max_examples=300, deadline=None)
@given(
    budget=budgets(),
    summary_texts=st.lists(TEXT, max_size=8),
    turn_texts=st.lists(TEXT, max_size=12),
    snippet_texts=st.lists(TEXT, max_size=8),
    max_tokens=st.none() | st.integers(0, 800),
    counter=COUNTERS,
)
def test_no_budget_is_ever_exceeded_and_provenance_is_kept(
    budget, summary_texts, turn_texts, snippet_texts, max_tokens, counter
):
    summaries = [
        ContextItem(t, "archived", NOW - timedelta(days=i), provenance=_prov(i))
        for i, t in enumerate(summary_texts)
    ]
    snippets = [
        ContextItem(t, "hot", NOW, score=1.0 - i / 100, provenance=_prov(i))
        for i, t in enumerate(snippet_texts)
    ]
    turns = [{"role": "user" if i % 2 else "assistant", "content": t} for i, t in enumerate(turn_texts)]
    ctx = assemble_context(
        summaries=summaries,
        recent_turns=turns,
        snippets=snippets,
        budget=budget,
        counter=counter,
        max_tokens=max_tokens,
    )
    by_part = ctx.tokens_by_part
    assert by_part["summaries"] <= budget.summaries
    assert by_part["recent_turns"] <= budget.recent_turns
    assert by_part["snippets"] <= budget.snippets
    assert ctx.total_tokens <= budget.total - budget.reserve
    if max_tokens is not None:
        assert ctx.total_tokens <= max_tokens
    for block in ctx.blocks:
        assert block.tokens == counter(block.text)
    # Provenance: every summary or snippet block is one of the inputs, with its provenance object.
    inputs = {id(item.provenance): item for item in summaries + snippets}
    for block in ctx.part("summaries") + ctx.part("snippets"):
        assert id(block.provenance) in inputs and inputs[id(block.provenance)].prompt_text == block.text
    # Recent turns are the newest ones, contiguous, in conversation order.
    kept = [b.text for b in ctx.part("recent_turns")]
    if kept and not ctx.part("recent_turns")[0].truncated:
        assert kept == turn_texts[len(turn_texts) - len(kept) :]
    # Summaries appear oldest first.
    created = [b.created_at for b in ctx.part("summaries")]
    assert None not in created
    assert created == sorted(c for c in created if c is not None)


# --------------------------------------------------------------------------- behaviour


def _items(prefix: str, n: int, *, source: str = "hot") -> list[ContextItem]:
    return [
        ContextItem(f"{prefix} {i} " + "word " * 9, source, NOW - timedelta(days=n - i), provenance=_prov(i))
        for i in range(n)
    ]


def test_trim_order_is_snippets_then_oldest_turns_then_oldest_summaries():
    counter = lambda t: len(t.split())  # noqa: E731 - each item below is 11 "tokens"
    summaries = _items("summary", 2, source="archived")
    turns = [f"turn {i} " + "word " * 9 for i in range(3)]
    snippets = _items("snippet", 2)
    full = assemble_context(summaries=summaries, recent_turns=turns, snippets=snippets, counter=counter)
    assert full.tokens_by_part == {"summaries": 22, "recent_turns": 33, "snippets": 22}

    def parts(max_tokens):
        ctx = assemble_context(
            summaries=summaries, recent_turns=turns, snippets=snippets, counter=counter, max_tokens=max_tokens
        )
        return [b.text.split()[0] + b.text.split()[1] for b in ctx.blocks]

    assert parts(66) == ["summary0", "summary1", "snippet0", "turn0", "turn1", "turn2"]  # worst snippet first
    assert parts(55) == ["summary0", "summary1", "turn0", "turn1", "turn2"]
    assert parts(44) == ["summary0", "summary1", "turn1", "turn2"]  # then the oldest turn
    assert parts(22) == ["summary0", "summary1"]
    assert parts(11) == ["summary1"]  # the oldest summary goes last
    assert parts(0) == []


def test_part_budgets_keep_the_best_snippets_newest_turns_and_newest_summaries():
    counter = lambda t: len(t.split())  # noqa: E731
    budget = ContextBudget(total=100, summaries=11, recent_turns=22, snippets=11, reserve=10)
    ctx = assemble_context(
        summaries=_items("summary", 3, source="archived"),
        recent_turns=[f"turn {i} " + "w " * 9 for i in range(4)],
        snippets=_items("snippet", 3),
        budget=budget,
        counter=counter,
    )
    assert [b.text.split()[1] for b in ctx.part("summaries")] == ["2"]
    assert [b.text.split()[1] for b in ctx.part("recent_turns")] == ["2", "3"]
    assert [b.text.split()[1] for b in ctx.part("snippets")] == ["0"]
    assert ctx.dropped_for_budget == 2 + 2 + 2


def test_near_duplicates_are_dropped_turns_first_then_snippets():
    turn = "User: my flat white order is ORD-4417"
    snippets = [ContextItem("My flat white order is ORD-4417!", "hot"), ContextItem("Lives in Porto", "hot")]
    summaries = [
        ContextItem("lives in Porto", "archived", NOW, label="[archived]"),
        ContextItem("Works as a nurse", "archived", NOW),
    ]
    ctx = assemble_context(summaries=summaries, recent_turns=[turn], snippets=snippets)
    assert [b.text for b in ctx.part("snippets")] == ["Lives in Porto"]
    assert [b.text for b in ctx.part("summaries")] == ["Works as a nurse"]
    assert ctx.dropped_duplicates == 2


def test_a_newest_turn_longer_than_its_budget_keeps_its_end():
    budget = ContextBudget(total=100, summaries=0, recent_turns=20, snippets=0, reserve=0)
    long_turn = " ".join(f"w{i}" for i in range(200)) + " final question?"
    ctx = assemble_context(recent_turns=["older turn", long_turn], budget=budget)
    [block] = ctx.part("recent_turns")
    assert block.truncated and block.text.startswith("…") and block.text.endswith("final question?")
    assert block.tokens <= 20


def test_bad_turns_are_named():
    with pytest.raises(InvalidInputError, match=r"recent_turns\[1\]"):
        assemble_context(recent_turns=["ok", 42])  # type: ignore[list-item]  # the wrong type is the input under test


# --------------------------------------------------------------------------- through the client


def test_build_context_packs_archived_summaries_and_hot_snippets_with_provenance(conn, local_store):
    settings = Settings(
        retrieval=RetrievalConfig(hot_similarity_threshold=0.2, archived_similarity_threshold=0.2)
    )
    client = MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, settings=settings, actor="test"
    )
    old = client.add(
        "u1",
        "Kayak trip on the Douro river with Tiago, rented two kayaks in Porto.",
        importance=0.1,
        now=NOW - timedelta(days=200),
    )
    hot = client.add("u1", "Planning another kayak trip in Porto next month", now=NOW)
    services = archival_services(local_store)
    run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=NOW, actor="test")
    turns = [
        {"role": "user", "content": "Any kayak plans?"},
        {"role": "assistant", "content": "Let me check."},
    ]
    ctx = client.build_context("u1", "kayak trip Porto", turns, ContextBudget(), phase2="always", now=NOW)
    [summary] = ctx.part("summaries")
    assert summary.provenance is not None
    assert summary.text.startswith("[archived] ") and summary.source == "archived"
    assert summary.provenance.memory_id == old.memory_id and summary.provenance.storage_ref
    [snippet] = ctx.part("snippets")
    assert snippet.provenance is not None
    assert snippet.provenance.memory_id == hot.memory_id and snippet.source == "hot"
    assert [b.role for b in ctx.part("recent_turns")] == ["user", "assistant"]
    assert ctx.total_tokens <= ContextBudget().total - ContextBudget().reserve
    assert "[archived]" in ctx.render() and "user: Any kayak plans?" in ctx.render()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=budgets())
def test_build_context_respects_any_budget(conn, budget):
    client = MemoryClient(
        conn,
        embedder=HashingEmbedder(TEST_DIM),
        settings=Settings(retrieval=RetrievalConfig(hot_similarity_threshold=0.0)),
        actor="test",
    )
    user = f"u-{uuid.uuid4().hex[:6]}"
    for i in range(6):
        client.add(user, f"Garden log {i}: " + "tomatoes basil compost watering " * (i + 1), now=NOW)
    ctx = client.build_context(
        user, "tomatoes garden", ["how is the garden?"] * 3, budget, phase2="never", now=NOW
    )
    assert ctx.tokens_by_part["snippets"] <= budget.snippets
    assert ctx.tokens_by_part["recent_turns"] <= budget.recent_turns
    assert ctx.total_tokens <= budget.total - budget.reserve
