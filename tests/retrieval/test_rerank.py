"""Optional reranking: the LLM reranker through the real SDKs against the fake server, and its guards."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory_lib.core.config import RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.retrieval.rerank import (
    CrossEncoderReranker,
    LLMReranker,
    RerankError,
    apply_order,
    parse_order,
    render_rerank_prompt,
    rerank_client,
    reranker_from_settings,
)
from testing.factories import ranked_hot_hits
from testing.fake_llm import FAKE_API_KEY

NOW = datetime(2025, 6, 1, tzinfo=UTC)
TEXTS = [
    "Bought oat milk at the corner shop",
    "Fed the sourdough starter with rye flour",
    "Grandma's sourdough recipe: starter, flour, water, salt, a long cold proof",
    "Dentist appointment moved to Tuesday",
]


def _hits():
    return ranked_hot_hits(TEXTS, NOW)


def test_parse_order_always_gives_a_permutation():
    assert parse_order("3, 1, 2", 3) == [2, 0, 1]
    assert parse_order("Passage 2 is best, then 2 again, then 9 and 0", 3) == [1, 0, 2]
    assert parse_order("", 2) == [0, 1]
    with pytest.raises(RerankError):
        apply_order(_hits(), [0, 0, 1, 2])


def test_prompt_numbers_the_passages_and_keeps_them_data():
    prompt = render_rerank_prompt("sourdough?", ["a\n b", "c"])
    assert "<question>sourdough?</question>" in prompt and "[1] a b\n[2] c" in prompt


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_llm_reranker_reorders_through_the_sdk(provider, fake_llm):
    base = fake_llm.base_url if provider == "anthropic" else fake_llm.openai_base_url
    reranker = LLMReranker(rerank_client(provider, FAKE_API_KEY, base_url=base, max_retries=0))
    hits = _hits()
    assert [h.text for h in hits] == TEXTS  # fused order: by cosine
    ranked = reranker.rerank("grandma's sourdough starter recipe", hits)
    # The fake model orders by words shared with the question: the recipe first, the starter next.
    assert [h.text for h in ranked][:2] == [TEXTS[2], TEXTS[1]]
    assert sorted(h.provenance.memory_id for h in ranked) == sorted(h.provenance.memory_id for h in hits)
    assert fake_llm.count("/v1/messages" if provider == "anthropic" else "/v1/chat/completions") == 1
    assert FAKE_API_KEY not in repr(reranker)


def test_llm_failure_is_a_rerank_error_without_the_key(fake_llm):
    fake_llm.fail_fraction, fake_llm.fail_status = 1.0, 400
    reranker = LLMReranker(
        rerank_client("anthropic", FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=0)
    )
    with pytest.raises(RerankError, match="HTTP 400") as err:
        reranker.rerank("sourdough", _hits())
    assert FAKE_API_KEY not in str(err.value)


def test_rerank_is_off_by_default_and_needs_its_key():
    assert RetrievalConfig().rerank == "off"
    assert reranker_from_settings(Settings()) is None
    with pytest.raises(InvalidInputError) as err:
        reranker_from_settings(Settings(retrieval=RetrievalConfig(rerank="anthropic")))
    assert err.value.field == "ANTHROPIC_API_KEY"
    with pytest.raises(InvalidInputError):
        rerank_client("mistral", FAKE_API_KEY)


def test_cross_encoder_absent_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RerankError, match="not installed locally"):
        CrossEncoderReranker("cross-encoder/not-a-cached-model")
