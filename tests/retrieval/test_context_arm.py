"""Context in the full-text arm: the memories written shortly before or after one of the best matches (up to
RetrievalConfig.context_neighbours each side) gain a share of its score (context_weight, times context_decay
per step away), within the context window, never across users and never between memories written at the
same instant. And the full-text score itself: a long memory is not ranked below a short one with the same
query words (no length normalization)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_lib.client import MemoryClient
from memory_lib.core.config import RetrievalConfig
from testing.factories import make_client

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
QUESTION = "Where did Caroline go hiking?"
ASKED = "Caroline: I went hiking last weekend, guess where!"
ANSWER = "Melanie: The Dolomites? Those photos of the Tre Cime looked amazing."


def _filler(client: MemoryClient, user: str) -> None:
    for i in range(30):
        client.add(
            user,
            f"Note {i} about groceries, invoices and the weekly team meeting.",
            now=NOW - timedelta(days=i + 2),
        )


def _rank(client: MemoryClient, user: str, memory_id) -> int | None:
    ids = [h.provenance.memory_id for h in client.search(user, QUESTION, now=NOW + timedelta(days=1)).hits]
    return ids.index(memory_id) + 1 if memory_id in ids else None


def test_the_turn_after_a_match_is_found_by_context_and_only_with_context(conn):
    client = make_client(conn)
    _filler(client, "u1")
    asked = client.add("u1", ASKED, now=NOW).memory_id
    answer = client.add("u1", ANSWER, now=NOW + timedelta(seconds=20)).memory_id
    hit = next(
        h
        for h in client.search("u1", QUESTION, now=NOW + timedelta(days=1)).hits
        if h.provenance.memory_id == answer
    )
    matched = next(
        h
        for h in client.search("u1", QUESTION, now=NOW + timedelta(days=1)).hits
        if h.provenance.memory_id == asked
    )
    # the answer shares no word with the question: its full-text score is the context share of the match's
    assert matched.scores.text_rank is not None
    assert hit.scores.text_rank == RetrievalConfig().context_weight * matched.scores.text_rank
    rank = _rank(client, "u1", answer)
    assert rank is not None and rank <= 3
    off = make_client(conn, retrieval=RetrievalConfig(context_weight=0.0))
    assert (
        next(
            h
            for h in off.search("u1", QUESTION, now=NOW + timedelta(days=1)).hits
            if h.provenance.memory_id == answer
        ).scores.text_rank
        is None
    )


def test_no_context_across_the_window_the_same_instant_or_users(conn):
    client = make_client(conn)
    _filler(client, "u1")
    client.add("u1", ASKED, now=NOW)
    late = client.add("u1", ANSWER, now=NOW + timedelta(hours=2)).memory_id  # outside the 60-minute window
    assert all(
        h.scores.text_rank is None
        for h in client.search("u1", QUESTION, now=NOW + timedelta(days=1)).hits
        if h.provenance.memory_id == late
    )
    client.add("u2", ASKED, now=NOW)
    batch = client.add("u2", ANSWER, now=NOW).memory_id  # the same instant: a batch, not a conversation
    other = client.add("u3", ANSWER, now=NOW + timedelta(seconds=20)).memory_id  # another user
    for user, memory_id in (("u2", batch), ("u3", other)):
        hits = client.search(user, QUESTION, now=NOW + timedelta(days=1)).hits
        assert all(h.scores.text_rank is None for h in hits if h.provenance.memory_id == memory_id)


def test_a_burst_gives_context_to_several_messages_decaying_by_step(conn):
    """Real chat comes in bursts: the answer is often a few messages after the one that shares the
    question's words. Each of the next context_neighbours messages gains context, less with each step;
    the one after them gains none."""
    cfg = RetrievalConfig()
    client = make_client(conn)
    _filler(client, "u1")
    asked = client.add("u1", ASKED, now=NOW).memory_id
    burst = [
        client.add(
            "u1", f"Melanie: message {word} of the burst", now=NOW + timedelta(seconds=10 * (i + 1))
        ).memory_id
        for i, word in enumerate(("one", "two", "three", "four", "five", "six"))
    ]
    hits = {
        h.provenance.memory_id: h
        for h in client.search("u1", QUESTION, limit=20, now=NOW + timedelta(days=1)).hits
    }
    match = hits[asked].scores.text_rank
    assert match is not None
    for step, memory_id in enumerate(burst[: cfg.context_neighbours], start=1):
        expected = cfg.context_weight * match * cfg.context_decay ** (step - 1)
        assert hits[memory_id].scores.text_rank == pytest.approx(expected, rel=1e-9), step
    beyond = hits.get(burst[cfg.context_neighbours])
    assert beyond is None or beyond.scores.text_rank is None
    narrow = make_client(conn, retrieval=RetrievalConfig(context_neighbours=1))
    found = {
        h.provenance.memory_id: h
        for h in narrow.search("u1", QUESTION, limit=20, now=NOW + timedelta(days=1)).hits
    }
    assert found[burst[0]].scores.text_rank is not None
    assert burst[1] not in found or found[burst[1]].scores.text_rank is None


def test_a_long_memory_scores_as_a_short_one_with_the_same_query_words(conn):
    """No length normalization: a greeting that names someone does not outrank the message that says
    something about them with the same words."""
    client = make_client(conn, retrieval=RetrievalConfig(context_weight=0.0))
    _filler(client, "u1")
    short = client.add("u1", "Any news about the kayak, Kate?", now=NOW).memory_id
    long = client.add(
        "u1",
        "Kate: I finally took the kayak out on the lake this morning, paddled to the island with my brother "
        "and we stayed until sunset, it was cold but absolutely worth it",
        now=NOW + timedelta(hours=3),
    ).memory_id
    hits = {
        h.provenance.memory_id: h
        for h in client.search("u1", "Where did Kate take her kayak?", now=NOW + timedelta(days=1)).hits
    }
    assert hits[short].scores.text_rank == pytest.approx(hits[long].scores.text_rank, abs=0.01)
