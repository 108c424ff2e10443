"""Search phase 3 (digests and facts) and its escalation decision, through both clients and the real SDKs."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Literal

import psycopg
import pytest
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.client import AsyncMemoryClient
from memory_lib.core.config import LLMConfig, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError, NotFoundError
from memory_lib.llm.client import llm_client
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.escalation import HEURISTIC, LLMEvaluator
from testing.consolidation import insert_digest, insert_fact
from testing.constants import TEST_DIM
from testing.factories import archive_batch, make_client
from testing.fake_llm import FAKE_API_KEY

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
EMBEDDER = HashingEmbedder(TEST_DIM)


def _history(conn, store) -> dict[str, list[uuid.UUID]]:
    """alice: Sarah's memories archived, a few hot ones; bob: his own Sarah, archived."""
    client = make_client(conn, store)
    sarah = [
        client.add("alice", text, importance=0.1, now=OLD + timedelta(hours=i)).memory_id
        for i, text in enumerate(
            [
                "Had lunch with my sister Sarah, she just started a new job at Acme Robotics.",
                "Sarah moved from Acme Robotics to Globex in the spring, she is much happier there.",
            ]
        )
    ]
    hot = [
        client.add("alice", text, now=NOW - timedelta(days=i)).memory_id
        for i, text in enumerate(
            ["Booked the dentist for Tuesday morning.", "Garden tomatoes need compost and watering."]
        )
    ]
    bob = [client.add("bob", "My colleague Sarah runs the Berlin office.", importance=0.1, now=OLD).memory_id]
    archive_batch(conn, store, as_of=NOW)
    archived = {r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories")}
    assert set(sarah) | set(bob) <= archived and not set(hot) & archived
    return {"sarah": sarah, "hot": hot, "bob": bob}


def _facts(conn, ids) -> dict[str, uuid.UUID]:
    s1, s2 = ids["sarah"]
    return {
        "sister": insert_fact(
            conn,
            EMBEDDER,
            user_id="alice",
            subject="Sarah",
            predicate="is",
            obj="the user's sister",
            valid_from=OLD,
            source_memory_ids=[s1],
        ),
        "acme": insert_fact(
            conn,
            EMBEDDER,
            user_id="alice",
            subject="Sarah",
            predicate="works at",
            obj="Acme Robotics",
            valid_from=OLD,
            valid_to=OLD + timedelta(hours=1),
            source_memory_ids=[s1],
            kind="other",
        ),
        "globex": insert_fact(
            conn,
            EMBEDDER,
            user_id="alice",
            subject="Sarah",
            predicate="works at",
            obj="Globex",
            valid_from=OLD + timedelta(hours=1),
            source_memory_ids=[s2],
            kind="other",
        ),
        "bob": insert_fact(
            conn,
            EMBEDDER,
            user_id="bob",
            subject="Sarah",
            predicate="runs",
            obj="the Berlin office",
            valid_from=OLD,
            source_memory_ids=ids["bob"],
        ),
    }


def test_who_is_x_is_answered_from_facts_when_xs_memories_are_archived(conn, local_store):
    ids = _history(conn, local_store)
    facts = _facts(conn, ids)
    client = make_client(conn, local_store)  # default settings: the offline heuristic decides
    result = client.search("alice", "Who is Sarah?", now=NOW)

    esc = result.escalation
    assert esc is not None
    assert (esc.evaluator, esc.action, esc.refined_query) == (HEURISTIC, "search_facts", "Sarah")
    assert "who someone is" in esc.reason and esc.tiers_searched[-1] == "facts" and esc.fallback is None
    assert {h.kind for h in result.consolidated} == {"fact"}
    got = {h.id: h for h in result.consolidated}
    assert set(got) == {facts["sister"], facts["acme"], facts["globex"]}  # never bob's Sarah
    assert all(h.user_id == "alice" and h.label == "[fact]" for h in result.consolidated)
    # The current employer ranks above the closed one, which keeps its interval.
    order = [h.id for h in result.consolidated]
    assert order.index(facts["globex"]) < order.index(facts["acme"])
    acme = got[facts["acme"]]
    assert not acme.current and "(closed)" in acme.interval and "(closed)" in acme.labeled_text
    assert got[facts["globex"]].current and got[facts["globex"]].interval.startswith("since ")
    # Provenance: the archived memories, expanded to their verified originals.
    expansion = client.expand_digest("alice", got[facts["sister"]])
    [memory] = expansion.memories
    assert memory.memory_id == ids["sarah"][0] and memory.tier == "archived" and not expansion.missing
    assert memory.archive_id is not None
    original = client.expand("alice", memory.archive_id, now=NOW)
    assert "sister Sarah" in original.content


def test_default_settings_escalate_only_when_the_heuristic_says_so_and_say_so(conn, local_store):
    ids = _history(conn, local_store)
    _facts(conn, ids)
    insert_digest(
        conn,
        EMBEDDER,
        user_id="alice",
        level=2,
        period_start=date(2026, 5, 1),
        period_end=date(2026, 6, 1),
        summary="May 2026: dentist booked, garden tomatoes",
        source_memory_ids=ids["hot"],
    )
    client = make_client(conn, local_store)
    result = client.search("alice", "garden tomatoes compost", now=NOW)
    esc = result.escalation
    assert esc is not None
    assert (esc.evaluator, esc.action, result.consolidated) == (HEURISTIC, "return", [])
    assert "digests" not in esc.tiers_searched and "facts" not in esc.tiers_searched
    never = client.search("alice", "Who is Sarah?", phase3="never", now=NOW)
    assert never.escalation is not None
    assert (
        never.consolidated == []
        and never.escalation.action == "return"
        and never.escalation.evaluator == "caller"
    )
    always = client.search("alice", "garden tomatoes compost", phase3="always", now=NOW)
    assert always.escalation is not None
    assert always.escalation.tiers_searched[-2:] == ("digests", "facts")
    assert any(h.kind == "digest" for h in always.consolidated)
    with pytest.raises(InvalidInputError, match="phase3"):
        client.search("alice", "x", phase3="sometimes", now=NOW)  # type: ignore[arg-type]  # the wrong value is the input under test
    # Phase 1 strong (enough hot hits nearly restate the query): no evaluator is asked.
    strong = make_client(conn, local_store, settings=Settings(retrieval=RetrievalConfig(limit=1)))
    quick = strong.search("alice", "Booked the dentist for Tuesday morning.", now=NOW)
    assert quick.escalation is not None
    assert quick.phase2_reason is None and quick.escalation.evaluator == "quick-check"


def test_a_digest_expands_to_its_memories_never_another_users(conn, db_url, local_store):
    ids = _history(conn, local_store)
    # A bad row on purpose: one source id is bob's memory. Expansion must not read it.
    digest = insert_digest(
        conn,
        EMBEDDER,
        user_id="alice",
        level=2,
        period_start=date(2025, 11, 1),
        period_end=date(2025, 12, 1),
        summary="November 2025: lunch with sister Sarah, new job at Acme",
        source_memory_ids=[*ids["sarah"], ids["hot"][0], *ids["bob"]],
    )
    client = make_client(conn, local_store)
    result = client.search("alice", "what happened with Sarah in November 2025?", now=NOW)
    assert result.escalation is not None
    assert result.escalation.action == "search_cold" and "before the hot horizon" in result.escalation.reason
    [hit] = [h for h in result.consolidated if h.kind == "digest"]
    assert hit.id == digest and hit.label == "[digest]" and hit.level == 2
    expansion = client.expand_digest("alice", hit)
    assert [m.memory_id for m in expansion.memories] == [*ids["sarah"], ids["hot"][0]]
    assert [m.tier for m in expansion.memories] == ["archived", "archived", "hot"]
    assert expansion.missing == tuple(ids["bob"])
    assert all(m.archive_id for m in expansion.memories[:2]) and expansion.memories[2].archive_id is None
    with pytest.raises(NotFoundError):
        client.expand_digest("bob", digest)
    assert all(h.user_id == "bob" for h in client.search("bob", "Who is Sarah?", now=NOW).consolidated)

    async def scenario():
        aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
        await register_vector_async(aconn)
        try:
            aclient = AsyncMemoryClient(aconn, embedder=EMBEDDER, object_store=local_store, actor="test")
            found = await aclient.search("alice", "what happened with Sarah in November 2025?", now=NOW)
            return found, await aclient.expand_digest("alice", digest)
        finally:
            await aconn.close()

    a_result, a_expansion = asyncio.run(scenario())
    assert a_result.consolidated == result.consolidated and a_result.escalation == result.escalation
    assert a_expansion == expansion


# --------------------------------------------------------------------------- the LLM evaluator

ACTIONS = ["return", "search_warm", "search_cold", "search_facts"]


def _evaluator(provider: Literal["anthropic", "openai"], server) -> LLMEvaluator:
    url = server.base_url if provider == "anthropic" else server.openai_base_url
    return LLMEvaluator(llm_client(provider, FAKE_API_KEY, base_url=url, max_retries=0, timeout=5))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize("action", ACTIONS)
def test_the_llm_evaluators_json_decision_drives_escalation(conn, local_store, fake_llm, provider, action):
    ids = _history(conn, local_store)
    _facts(conn, ids)
    insert_digest(
        conn,
        EMBEDDER,
        user_id="alice",
        level=2,
        period_start=date(2025, 11, 1),
        period_end=date(2025, 12, 1),
        summary="November 2025: lunch with sister Sarah",
        source_memory_ids=ids["sarah"],
    )
    fake_llm.evaluator_decision = {
        "sufficient": action == "return",
        "reason": f"the test wants {action}",
        "action": action,
        "refinedQuery": "Sarah sister",
    }
    evaluator = _evaluator(provider, fake_llm)
    result = make_client(conn, local_store, evaluator=evaluator).search(
        "alice", "tell me about my family", now=NOW
    )
    esc = result.escalation
    assert esc is not None
    assert fake_llm.evaluation_requests() == 1
    assert (esc.evaluator, esc.action, esc.reason, esc.fallback) == (
        evaluator.name,
        action,
        f"the test wants {action}",
        None,
    )
    assert evaluator.name.startswith(provider + ":")
    kinds = {h.kind for h in result.consolidated}
    if action == "return":
        assert esc.tiers_searched == ("hot", "archived") and not kinds
    elif action == "search_warm":
        assert esc.tiers_searched == ("hot", "archived") and not kinds and esc.refined_query == "Sarah sister"
        assert set(ids["sarah"]) <= {h.provenance.memory_id for h in result.archived}
    elif action == "search_cold":
        assert esc.tiers_searched[-2:] == ("digests", "facts") and kinds == {"digest", "fact"}
    else:
        assert esc.tiers_searched[-1] == "facts" and kinds == {"fact"}
    assert all(h.user_id == "alice" for h in result.consolidated)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize(
    "answer",
    [
        "Sure! I think we should search deeper.",
        '{"sufficient": false, "reason": "x", "action": "search_everything"}',
        '{"sufficient": "no", "action": "return"',
    ],
)
def test_malformed_evaluator_json_falls_back_to_the_heuristic_and_says_so(
    conn, local_store, fake_llm, provider, answer
):
    ids = _history(conn, local_store)
    _facts(conn, ids)
    fake_llm.evaluator_decision = answer
    evaluator = _evaluator(provider, fake_llm)
    result = make_client(conn, local_store, evaluator=evaluator).search("alice", "Who is Sarah?", now=NOW)
    esc = result.escalation
    assert esc is not None
    assert esc.fallback is not None
    assert fake_llm.evaluation_requests() == 1
    assert esc.evaluator == HEURISTIC and esc.fallback.startswith(f"{evaluator.name} answered malformed JSON")
    assert esc.action == "search_facts" and {h.kind for h in result.consolidated} == {"fact"}


def test_a_failing_evaluator_falls_back_and_the_llm_evaluator_comes_from_settings(
    conn, local_store, fake_llm
):
    _history(conn, local_store)
    settings = Settings(
        retrieval=RetrievalConfig(phase3_evaluator="llm"),
        llm=LLMConfig(
            provider="openai", base_url=fake_llm.openai_base_url, max_retries=0, openai_api_key=FAKE_API_KEY
        ),
    )
    client = make_client(conn, local_store, settings=settings)
    result = client.search("alice", "Who is Sarah?", now=NOW)  # the fake's own answer for "who": search_facts
    assert result.escalation is not None
    assert result.escalation.evaluator == "openai:gpt-4o-mini" and result.escalation.action == "search_facts"
    fake_llm.fail_when_contains = "Sarah"
    try:
        failed = client.search("alice", "Who is Sarah?", now=NOW)
    finally:
        assert failed.escalation is not None
        assert failed.escalation.fallback is not None
        fake_llm.fail_when_contains = None
    assert failed.escalation.fallback is not None
    assert failed.escalation is not None
    assert failed.escalation.evaluator == HEURISTIC and "call failed" in failed.escalation.fallback
    assert "HTTP 500" in failed.escalation.fallback and FAKE_API_KEY not in failed.escalation.fallback
    with pytest.raises(InvalidInputError, match="phase3_evaluator"):
        make_client(
            conn,
            settings=Settings(
                retrieval=RetrievalConfig(phase3_evaluator="llm"), llm=LLMConfig(provider="extractive")
            ),
        )
