"""Context in the full-text arm: the memory written just before or after one of the best matches gains a
share of its score (RetrievalConfig.context_weight), within the context window, never across users and
never between memories written at the same instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
    late = client.add("u1", ANSWER, now=NOW + timedelta(hours=2)).memory_id  # outside the 30-minute window
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
