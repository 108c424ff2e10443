"""Add-only writes: distinct memories stay live by default; a memory is replaced only when that is known
(supersedes=, the LLM judge, the opt-in state rule), and any failure of the judge adds the memory."""

from __future__ import annotations

import importlib.util
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memory_assets.demo_data import generate_history
from memory_lib.client import MemoryClient
from memory_lib.core.config import LLMConfig, Settings, WriteConfig
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.write.near_duplicates import restatement, salient_tokens, state_change, thresholds_for
from testing.constants import TEST_DIM
from testing.fake_llm import FAKE_API_KEY
from testing.rows import one

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
ISSUE_EVENTS = [
    (
        "Tom asked Ada to review pull request #3290 for Project Heron before Thursday",
        "Tom asked Ada to review pull request #1086 for Project Atlas before Tuesday",
    ),
    (
        "Booked a hotel in Montreal for the conference in June",
        "Booked a hotel in Reykjavik for the conference in June",
    ),
    (
        "Meeting with Dr. Patel on Monday at 10am about the knee",
        "Meeting with Dr. Patel on Friday at 3pm about the shoulder",
    ),
    ("Ada's daughter Mia started piano lessons", "Ada's son Leo started piano lessons"),
]
STATE = ("Lives in Lisbon", "Lives in Porto")
HAS_LOCAL = importlib.util.find_spec("sentence_transformers") is not None
_MINILM = None


def _embedder(kind: str):
    global _MINILM
    if kind == "hashing":
        return HashingEmbedder(TEST_DIM)
    if _MINILM is None:
        from memory_lib.llm.embedding import LocalEmbedder

        _MINILM = LocalEmbedder()
    return _MINILM


EMBEDDERS = ["hashing", pytest.param("local", marks=pytest.mark.skipif(not HAS_LOCAL, reason="local extra"))]


def _client(url_or_conn, embedder, **write) -> MemoryClient:
    settings = Settings(write=WriteConfig(**({"judge": "off"} | write)))
    return MemoryClient(url_or_conn, embedder=embedder, settings=settings, actor="test")


def _live(conn, user: str) -> list[str]:
    rows = conn.execute(
        "SELECT content FROM memories WHERE user_id = %s AND superseded_by IS NULL ORDER BY created_at, id",
        (user,),
    )
    return [r["content"] for r in rows]


@pytest.fixture
def conn_for(make_conn):
    """A connection to a fresh database of the embedder's dimension."""
    return lambda embedder: make_conn(embedder.dim)


# --------------------------------------------------------------------------- the five pairs


@pytest.mark.parametrize("kind", EMBEDDERS)
def test_distinct_events_and_a_state_change_stay_live_by_default(conn_for, kind):
    embedder = _embedder(kind)
    conn = conn_for(embedder)
    client = _client(conn, embedder)
    for i, (old, new) in enumerate([*ISSUE_EVENTS, STATE]):
        user = f"u{i}"
        first = client.add(user, old, now=T0)
        second = client.add(user, new, now=T0 + timedelta(minutes=1))
        assert (first.outcome, second.outcome) == ("created", "created"), (old, new, second)
        assert _live(conn, user) == [old, new]


@pytest.mark.parametrize("kind", EMBEDDERS)
def test_a_state_change_supersedes_when_told(conn_for, kind):
    embedder = _embedder(kind)
    conn = conn_for(embedder)
    client = _client(conn, embedder)
    old = client.add("u", STATE[0], now=T0)
    new = client.add("u", STATE[1], supersedes=old.memory_id, now=T0 + timedelta(minutes=1))
    assert (new.outcome, new.previous_id, new.reason) == ("superseded", old.memory_id, "explicit")
    assert _live(conn, "u") == [STATE[1]]
    record = client.get("u", old.memory_id)
    assert record is not None and record.superseded_by == new.memory_id
    events = [(e.event_type, e.details.get("reason")) for e in client.history("u", old.memory_id)]
    assert ("superseded", "explicit") in events
    # The hidden version stays readable for audits, and search answers from the new one.
    assert [h.id for h in client.search("u", "where does the user live", limit=5).hits] == [new.memory_id]


@pytest.mark.parametrize("kind", EMBEDDERS)
def test_the_state_rule_supersedes_only_when_turned_on(conn_for, kind):
    embedder = _embedder(kind)
    conn = conn_for(embedder)
    on = _client(conn, embedder, state_rule=True)
    on.add("on", STATE[0], now=T0)
    result = on.add("on", STATE[1], now=T0 + timedelta(minutes=1))
    assert (result.outcome, result.reason) == ("superseded", "state_rule")
    assert _live(conn, "on") == [STATE[1]]
    for i, (old, new) in enumerate(ISSUE_EVENTS):  # the rule never takes an event for a state
        on.add(f"e{i}", old, now=T0)
        assert on.add(f"e{i}", new, now=T0 + timedelta(minutes=1)).outcome == "created"


def test_the_same_memory_again_is_merged_not_added(conn):
    client = _client(conn, HashingEmbedder(TEST_DIM))
    first = client.add("u", "User prefers cortado.", now=T0)
    again = client.add("u", "the user prefers a cortado", now=T0 + timedelta(minutes=1))
    assert (again.outcome, again.memory_id, again.reason) == ("merged", first.memory_id, "restatement")
    exact = client.add("u", "User  prefers cortado.", now=T0 + timedelta(minutes=2))
    assert (exact.outcome, exact.memory_id) == ("duplicate", first.memory_id)
    assert _live(conn, "u") == ["User prefers cortado."]


def test_supersedes_refuses_what_it_cannot_replace_and_writes_nothing(conn):
    client = _client(conn, HashingEmbedder(TEST_DIM))
    mine = client.add("u", "Lives in Lisbon", now=T0)
    other = client.add("v", "Lives in Madrid", now=T0)
    count = one(conn.execute("SELECT count(*) AS n FROM memories"))["n"]
    with pytest.raises(InvalidInputError, match="supersedes") as info:
        client.add("u", "Lives in Porto", supersedes=other.memory_id, now=T0)  # another user's: not found
    assert str(other.memory_id) in str(info.value)
    with pytest.raises(InvalidInputError, match="supersedes"):
        client.add("u", "Lives in Porto", supersedes="not-a-uuid", now=T0)  # type: ignore[arg-type]  # the wrong type is the input under test
    with pytest.raises(InvalidInputError, match="supersedes"):
        client.add("u", "Lives in Porto", supersedes=uuid.uuid4(), now=T0)
    client.update("u", mine.memory_id, "Lives in Faro", now=T0)
    with pytest.raises(InvalidInputError, match="superseded already"):
        client.add("u", "Lives in Porto", supersedes=mine.memory_id, now=T0)
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == count + 1  # the update only


# --------------------------------------------------------------------------- the LLM judge


def _judged(conn, fake, **write) -> MemoryClient:
    settings = Settings(
        llm=LLMConfig(base_url=fake.base_url, max_retries=0, anthropic_api_key=FAKE_API_KEY),
        write=WriteConfig(**write),
    )
    return MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")


def test_the_llm_judge_supersedes_a_changed_state_and_keeps_events_apart(conn, fake_llm):
    client = _judged(conn, fake_llm)  # judge 'auto': a key is set
    old = client.add("u", STATE[0], now=T0)
    assert fake_llm.judge_requests() == 0  # nothing close yet: no call
    new = client.add("u", STATE[1], now=T0 + timedelta(minutes=1))
    assert (new.outcome, new.previous_id, new.reason) == ("superseded", old.memory_id, "llm")
    assert new.judge is not None and new.judge["decision"] == "updates"
    assert fake_llm.judge_requests() == 1
    for i, (a, b) in enumerate(ISSUE_EVENTS):
        client.add(f"e{i}", a, now=T0)
        assert client.add(f"e{i}", b, now=T0 + timedelta(minutes=1)).outcome == "created"
    # Each answer is billed in the ledger, under its purpose.
    rows = conn.execute(
        "SELECT count(*) AS n, bool_and(outcome = 'ok') AS ok FROM llm_usage WHERE purpose = 'write_judge'"
    ).fetchone()
    assert rows["n"] == fake_llm.judge_requests() and rows["ok"]
    events = [e.details for e in client.history("u", old.memory_id) if e.event_type == "superseded"]
    assert events[0]["reason"] == "llm" and events[0]["judge"]["decision"] == "updates"


@pytest.mark.parametrize(
    "fault",
    [
        {"judge_decision": "this is not JSON"},
        {"judge_decision": {"decision": "updates"}},  # no target
        {"judge_decision": {"decision": "updates", "target": 7}},  # not one of the memories shown
        {"judge_decision": {"decision": "replace", "target": 1}},  # not a decision
        {"fail_when_contains": "Porto"},  # the provider fails
    ],
    ids=["not-json", "no-target", "unknown-target", "bad-decision", "provider-error"],
)
def test_a_failed_or_malformed_judgement_adds_the_memory(conn, fake_llm, fault):
    client = _judged(conn, fake_llm)
    for name, value in fault.items():
        setattr(fake_llm, name, value)
    client.add("u", STATE[0], now=T0)
    result = client.add("u", STATE[1], now=T0 + timedelta(minutes=1))
    assert result.outcome == "created"
    assert result.judge is not None and result.judge["error"]
    assert _live(conn, "u") == list(STATE)
    assert fake_llm.judge_requests() >= 1
    created = [e.details for e in client.history("u", result.memory_id) if e.event_type == "created"]
    assert created[0]["judge"]["error"]


def test_the_async_client_asks_the_judge_and_supersedes_like_the_sync_one(db_url, conn, fake_llm):
    import asyncio

    from memory_lib.client import AsyncMemoryClient

    async def scenario():
        settings = Settings(
            llm=LLMConfig(base_url=fake_llm.base_url, max_retries=0, anthropic_api_key=FAKE_API_KEY)
        )
        client = await AsyncMemoryClient.connect(
            db_url, embedder=HashingEmbedder(TEST_DIM), settings=settings
        )
        async with client:
            old = await client.add("u", STATE[0], now=T0)
            new = await client.add("u", STATE[1], now=T0 + timedelta(minutes=1))
            told = await client.add(
                "u", "Lives in Faro", supersedes=new.memory_id, now=T0 + timedelta(minutes=2)
            )
            return old, new, told

    old, new, told = asyncio.run(scenario())
    assert (new.outcome, new.previous_id, new.reason) == ("superseded", old.memory_id, "llm")
    assert (told.outcome, told.previous_id, told.reason) == ("superseded", new.memory_id, "explicit")
    assert fake_llm.judge_requests() == 1  # the caller said what it replaces: no judge
    assert _live(conn, "u") == ["Lives in Faro"]


def test_a_judged_duplicate_that_changes_a_number_is_not_merged(conn, fake_llm):
    client = _judged(conn, fake_llm)
    fake_llm.judge_decision = {"decision": "duplicate", "target": 1, "reason": "same"}
    client.add("u", "Invoice 2291 was paid", now=T0)
    result = client.add("u", "Invoice 2297 was paid", now=T0 + timedelta(minutes=1))
    assert result.outcome == "created"
    assert len(_live(conn, "u")) == 2


def test_judge_llm_without_a_key_is_an_error_naming_the_setting(conn, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="write.judge"):
        MemoryClient(
            conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(write=WriteConfig(judge="llm"))
        )
    # 'auto' without a key: no judge, add-only
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings())
    assert client._parts.judge is None


# --------------------------------------------------------------------------- realistic volume


def test_demo_history_written_with_add_stays_live(conn):
    """1,000 records of the demo's generator through `add` with the defaults: >= 99% stay live, and
    nothing is superseded (only exact repeats and restatements merge)."""
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    records = list(generate_history(end=T0, days=40, per_day=(24, 26), users=4, seed=11))[:1000]
    assert len(records) == 1000
    outcomes = [client.add(m.user_id, m.content, now=m.created_at).outcome for m in records]
    distinct = len({(m.user_id, " ".join(m.content.casefold().split())) for m in records})
    live = one(conn.execute("SELECT count(*) AS n FROM memories WHERE superseded_by IS NULL"))["n"]
    assert outcomes.count("superseded") == 0
    assert live >= 0.99 * distinct, (live, distinct, {o: outcomes.count(o) for o in set(outcomes)})


# --------------------------------------------------------------------------- the rules themselves


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("User prefers cortado.", "the user prefers a cortado"),
        ("Ada's flight leaves at 7:40", "ada's flight leaves at 7:40."),
        ("Joanna: Thanks, Nate! Your support means a lot.", "Joanna: Thanks Nate! Your support means a lot."),
    ],
)
def test_restatements(old, new):
    assert restatement(0.0, old, new, thresholds_for("hashing-lexical-64", "lexical"))


def test_a_paraphrase_merges_only_above_a_semantic_embedders_threshold():
    old, new = "Ada flies to Oslo at 7:40 on 12 March", "On 12 March Ada's flight to Oslo leaves at 7:40"
    minilm = thresholds_for("all-MiniLM-L6-v2", "semantic")
    assert restatement(0.97, old, new, minilm)
    assert not restatement(0.90, old, new, minilm)
    assert not restatement(0.99, old, new, thresholds_for("hashing-lexical-64", "lexical"))  # no cosine test


@pytest.mark.parametrize(
    ("old", "new"),
    [
        *ISSUE_EVENTS,
        ("Ada's flight to Oslo", "Ada's flight from Oslo"),
        ("User likes cilantro", "User does not like cilantro"),
        ("Alice owes Bob 5 EUR", "Bob owes Alice 5 EUR"),
        ("Ana is vegetarian", "Ana was vegetarian"),
        ("Joanna: See ya Nate!", "Nate: See you later Joanna!"),  # another speaker
        ("Not today, maybe next week", "Not today, maybe next month"),
        ("Helped my nephew with his homework", "Helped my cousin with his homework"),
    ],
)
def test_not_restatements_even_at_a_high_cosine(old, new):
    assert not restatement(0.99, old, new, thresholds_for("all-MiniLM-L6-v2", "semantic"))


def test_salient_tokens_keep_names_numbers_dates_and_negations():
    assert salient_tokens("Meeting with Dr. Patel on Monday at 10am, not Tuesday") == {
        "meeting",
        "dr",
        "patel",
        "monday",
        "10am",
        "not",
        "tuesday",
    }
    assert salient_tokens("The user doesn't eat meat") == {"not"}


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("Lives in Lisbon", "Lives in Porto", "porto"),
        ("Lives in Lisbon", "Moved to Porto last month", "porto last month"),
        ("Ada works at Acme", "Ada works at Globex now", "globex"),
        (
            "User prefers a cortado in the morning",
            "User prefers a flat white in the morning",
            "flat white in the morning",
        ),
        ("Ada works at Acme", "Rui works at Globex", None),  # another subject
        ("Booked a hotel in Montreal", "Booked a hotel in Reykjavik", None),  # no state predicate
        ("Lives in Lisbon", "lives in Lisbon.", None),  # the same value
    ],
)
def test_state_change(old, new, changed):
    fact = state_change(old, new)
    assert (fact.value if fact else None) == changed


@pytest.mark.parametrize("kind", EMBEDDERS)
def test_the_shipped_thresholds_merge_no_distinct_pair_of_the_labelled_set(kind):
    """bench/data/write_pairs.jsonl: with the shipped thresholds, no distinct pair is a restatement."""
    import json
    from pathlib import Path

    import numpy as np

    path = Path(__file__).resolve().parents[2] / "bench" / "data" / "write_pairs.jsonl"
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    embedder = HashingEmbedder(1536) if kind == "hashing" else _embedder(kind)
    a, b = embedder.embed([p["old"] for p in pairs]), embedder.embed([p["new"] for p in pairs])
    cos = (np.asarray(a) * np.asarray(b)).sum(axis=1)
    shipped = thresholds_for(embedder.model, embedder.kind)
    merged = [
        p["id"] for p, c in zip(pairs, cos, strict=True) if restatement(float(c), p["old"], p["new"], shipped)
    ]
    distinct = {p["id"] for p in pairs if p["label"] == "distinct"}
    assert not distinct & set(merged)
    assert {p["id"] for p in pairs if p["kind"] == "duplicate"} & set(
        merged
    )  # the rule still merges something
