"""Digests and facts from an LLM: the real Anthropic and OpenAI SDKs against the local fake server.

The answer must be JSON valid under the pydantic schema and cite only the period's memories; anything
else raises SummarizationError and writes nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest

from memory_lib.consolidation.digests import LLMDigestBuilder, build_level
from memory_lib.consolidation.facts import LLMFactExtractor, build_facts
from memory_lib.core.config import LLMConfig
from memory_lib.core.errors import SummarizationError
from memory_lib.core.models import NewMemory
from memory_lib.llm.client import llm_client
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.json_answers import JsonLLM, json_llm_from_settings
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.fake_llm import FAKE_API_KEY

EMB = HashingEmbedder(TEST_DIM)
JAN = date(2025, 1, 1)


def _llm(provider: str, fake) -> JsonLLM:
    url = fake.base_url if provider == "anthropic" else fake.openai_base_url
    return JsonLLM(llm_client(provider, FAKE_API_KEY, base_url=url, max_retries=0))


def _memories(conn) -> list:
    texts = [
        "Sarah Chen became Ada's manager and set up weekly 1:1s.",
        "Ada ran the Lisbon half marathon in 1:52.",
    ]
    return insert_memories(
        conn,
        [
            NewMemory(
                user_id="u1",
                content=t,
                embedding=EMB.embed([t])[0],
                embedding_model=EMB.model,
                created_at=datetime(2025, 1, 5 + i, tzinfo=UTC),
                importance_score=0.9,
            )
            for i, t in enumerate(texts)
        ],
        actor="test",
    )


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_llm_digest_and_facts_are_validated_json_with_provenance(conn, fake_llm, provider):
    sarah, _ = _memories(conn)
    llm = _llm(provider, fake_llm)
    fake_llm.summary_override = json.dumps(
        {
            "summary": "In January 2025 Ada got a new manager, Sarah Chen, and ran the Lisbon half marathon.",
            "keyTopics": ["running", "work"],
            "keyPeople": ["Sarah Chen"],
            "emotionalHighlights": [{"text": "Finished the half marathon", "memoryId": str(sarah)}],
        }
    )
    out = build_level(conn, 2, "u1", JAN, builder=LLMDigestBuilder(llm), embedder=EMB)
    assert out.status == "built"
    row = conn.execute("SELECT * FROM memory_digests WHERE user_id = 'u1'").fetchone()
    assert row["summarizer_kind"] == provider and row["summary"].startswith("In January 2025 Ada")
    assert row["body"]["keyPeople"] == ["Sarah Chen"] and row["body"]["counts"]["memories"] == 2
    assert fake_llm.count() == 1
    assert build_level(conn, 2, "u1", JAN, builder=LLMDigestBuilder(llm), embedder=EMB).status == "unchanged"
    assert fake_llm.count() == 1  # unchanged fingerprint: no call

    fake_llm.summary_override = (
        "```json\n"
        + json.dumps(
            {
                "facts": [
                    {
                        "kind": "person",
                        "subject": "Sarah Chen",
                        "predicate": "is manager of",
                        "object": "Ada",
                        "single_valued": True,
                        "memory_ids": [str(sarah)],
                        "confidence": 0.9,
                    }
                ]
            }
        )
        + "\n```"
    )
    facts = build_facts(conn, "u1", JAN, extractor=LLMFactExtractor(llm), embedder=EMB)
    assert facts.status == "built" and facts.inserted == 1
    fact = conn.execute("SELECT * FROM memory_facts").fetchone()
    assert (fact["subject"], fact["object"], fact["source_memory_ids"]) == ("Sarah Chen", "Ada", [sarah])
    assert (
        fact["extractor"] == f"{provider}:{llm.model}" and fact["single_valued"] and fact["confidence"] == 0.9
    )


@pytest.mark.parametrize(
    "answer,problem",
    [
        ("I'm sorry, I cannot do that.", "not JSON"),
        (json.dumps({"summary": "too short"}), "fails DigestAnswer"),
        (json.dumps(["a list"]), "not an object"),
        (
            json.dumps(
                {
                    "summary": "A long enough summary of the month.",
                    "emotionalHighlights": [
                        {"text": "x", "memoryId": "00000000-0000-4000-8000-000000000000"}
                    ],
                }
            ),
            "does not cover",
        ),
    ],
)
def test_a_bad_llm_answer_writes_nothing(conn, fake_llm, answer, problem):
    _memories(conn)
    fake_llm.summary_override = answer
    with pytest.raises(SummarizationError, match=problem):
        build_level(conn, 2, "u1", JAN, builder=LLMDigestBuilder(_llm("anthropic", fake_llm)), embedder=EMB)
    assert conn.execute("SELECT count(*) AS n FROM memory_digests").fetchone()["n"] == 0


def test_facts_citing_a_memory_outside_the_month_are_refused(conn, fake_llm):
    _memories(conn)
    fake_llm.summary_override = json.dumps(
        {
            "facts": [
                {
                    "kind": "other",
                    "subject": "Ada",
                    "predicate": "p",
                    "object": "o",
                    "memory_ids": ["00000000-0000-4000-8000-000000000000"],
                }
            ]
        }
    )
    with pytest.raises(SummarizationError, match="not in the request"):
        build_facts(conn, "u1", JAN, extractor=LLMFactExtractor(_llm("openai", fake_llm)), embedder=EMB)
    assert conn.execute("SELECT count(*) AS n FROM memory_facts").fetchone()["n"] == 0


def test_settings_choose_the_provider_or_offline():
    assert json_llm_from_settings(LLMConfig(provider="extractive", openai_api_key=FAKE_API_KEY)) is None
    assert json_llm_from_settings(LLMConfig()) is None  # auto without a key: offline
    llm = json_llm_from_settings(LLMConfig(openai_api_key=FAKE_API_KEY))
    assert llm is not None and llm.kind == "openai" and FAKE_API_KEY not in repr(llm)
