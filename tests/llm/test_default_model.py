"""The default LLM model: the cheapest current Haiku of the price table, named in one place (llm settings),
and one setting changes it for the summarizer and the reranker alike. Real SDKs against the fake server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory_lib.core.config import (
    DEFAULT_ANTHROPIC_MODEL,
    DEFAULT_OPENAI_MODEL,
    LLMConfig,
    Settings,
)
from memory_lib.core.pricing import DEFAULT_PRICES, Usage, cost_usd, price_for
from memory_lib.llm.summarize import (
    AnthropicSummarizer,
    OpenAISummarizer,
    SummaryInput,
    summarizer_from_settings,
)
from memory_lib.retrieval.rerank import LLMReranker, rerank_client, reranker_from_settings
from testing.factories import ranked_hot_hits
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer

# One summary request as the fake server measures them (prompt ~300 tokens, answer ~80): the shape that
# decides which model is cheapest for this workload.
SUMMARY_USAGE = Usage(300, 80)
KEYS = {"ANTHROPIC_API_KEY": FAKE_API_KEY, "OPENAI_API_KEY": FAKE_API_KEY}


def _cost(model: str, *, batch: bool) -> float:
    cost = cost_usd(DEFAULT_PRICES, model, SUMMARY_USAGE, batch=batch)
    assert cost is not None
    return cost


@pytest.mark.parametrize("batch", [False, True])
def test_default_anthropic_model_is_the_cheapest_haiku_of_the_price_table(batch: bool):
    haikus = [m for m in DEFAULT_PRICES if m.startswith("claude-") and "haiku" in m]
    assert len(haikus) >= 2  # a comparison, not a table of one
    cheapest = min(haikus, key=lambda m: _cost(m, batch=batch))
    assert cheapest == DEFAULT_ANTHROPIC_MODEL
    # Strictly cheapest: a tie would leave the choice to dict order.
    assert all(_cost(m, batch=batch) > _cost(cheapest, batch=batch) for m in haikus if m != cheapest)


def test_every_default_names_the_configured_model_and_is_priced():
    assert LLMConfig().anthropic_model == DEFAULT_ANTHROPIC_MODEL == Settings().llm.anthropic_model
    assert LLMConfig().openai_model == DEFAULT_OPENAI_MODEL
    assert AnthropicSummarizer(FAKE_API_KEY).model == DEFAULT_ANTHROPIC_MODEL
    assert OpenAISummarizer(FAKE_API_KEY).model == DEFAULT_OPENAI_MODEL
    assert LLMReranker(rerank_client("anthropic", FAKE_API_KEY)).model == DEFAULT_ANTHROPIC_MODEL
    assert LLMReranker(rerank_client("openai", FAKE_API_KEY)).model == DEFAULT_OPENAI_MODEL
    # A default without a price would report "unknown price" on every night.
    assert price_for(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL) is not None
    assert price_for(DEFAULT_PRICES, DEFAULT_OPENAI_MODEL) is not None


def _hits():
    texts = ["Bought oat milk at the corner shop", "Grandma's sourdough recipe: starter, flour, water, salt"]
    return ranked_hot_hits(texts, datetime(2025, 6, 1, tzinfo=UTC))


def _models_sent(server: FakeLLMServer, path: str) -> list[str]:
    return [r.body["model"] for r in server.requests if r.path == path]


def _summarize_and_rerank(settings: Settings) -> None:
    summarizer = summarizer_from_settings(settings.llm)
    summarizer.summarize(SummaryInput("The user booked a flight to Lisbon for May 3.", datetime.now(UTC)))
    reranker = reranker_from_settings(settings)
    assert reranker is not None
    reranker.rerank("sourdough recipe", _hits())


@pytest.mark.parametrize(
    ("provider", "variable", "path", "default"),
    [
        ("anthropic", "MEMORY_ARCHIVE_LLM__ANTHROPIC_MODEL", "/v1/messages", DEFAULT_ANTHROPIC_MODEL),
        ("openai", "MEMORY_ARCHIVE_LLM__OPENAI_MODEL", "/v1/chat/completions", DEFAULT_OPENAI_MODEL),
    ],
)
def test_one_setting_changes_the_model_of_summarizer_and_reranker(
    fake_llm: FakeLLMServer, provider: str, variable: str, path: str, default: str
):
    env = {
        "MEMORY_ARCHIVE_SUMMARIZER": provider,
        "MEMORY_ARCHIVE_RETRIEVAL__RERANK": provider,
        "MEMORY_ARCHIVE_LLM_BASE_URL": fake_llm.base_url,
        **KEYS,
    }
    _summarize_and_rerank(Settings.from_env(env))
    assert _models_sent(fake_llm, path) == [default, default]

    fake_llm.reset()
    _summarize_and_rerank(Settings.from_env({**env, variable: "some-other-model"}))
    assert _models_sent(fake_llm, path) == ["some-other-model", "some-other-model"]

    # The reranker's own setting, when set, wins for the reranker only.
    fake_llm.reset()
    _summarize_and_rerank(
        Settings.from_env(
            {**env, variable: "some-other-model", "MEMORY_ARCHIVE_RETRIEVAL__RERANK_MODEL": "rerank-model"}
        )
    )
    assert _models_sent(fake_llm, path) == ["some-other-model", "rerank-model"]
