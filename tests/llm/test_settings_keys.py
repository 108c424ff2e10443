"""The API keys are settings: Settings.from_env reads ANTHROPIC_API_KEY / OPENAI_API_KEY (and the vendors'
base-URL variables), never shows a key, and nothing below it reads the environment: a client built from
explicit Settings uses their key and provider whatever the environment says. Real SDKs, fake server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_lib.client import MemoryClient
from memory_lib.core.config import EmbeddingConfig, LLMConfig, RetrievalConfig, Settings, WriteConfig
from memory_lib.core.errors import ConfigError
from memory_lib.llm.embedding import HashingEmbedder, embedder_from_settings
from memory_lib.llm.json_answers import json_llm_from_settings
from memory_lib.llm.summarize import SummaryInput, summarizer_from_settings
from memory_lib.retrieval.escalation import evaluator_from_settings
from memory_lib.retrieval.rerank import reranker_from_settings
from testing.constants import TEST_DIM
from testing.factories import ranked_hot_hits
from testing.fake_llm import FakeLLMServer

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
EXPLICIT = "explicit-settings-key"
ENVIRONMENT = "sk-ant-the-environments-key-0000"


def test_the_keys_are_read_from_the_vendors_variables_and_never_shown():
    s = Settings.from_env(
        {
            "ANTHROPIC_API_KEY": " sk-ant-one ",
            "OPENAI_API_KEY": "sk-two",
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        }
    )
    assert s.llm.anthropic_api_key is not None and s.llm.anthropic_api_key.get_secret_value() == "sk-ant-one"
    assert s.llm.openai_api_key is not None and s.llm.openai_api_key.get_secret_value() == "sk-two"
    # OPENAI_API_KEY and OPENAI_BASE_URL are the embedder's too.
    assert (
        s.embedding.openai_api_key is not None and s.embedding.openai_api_key.get_secret_value() == "sk-two"
    )
    assert (s.llm.openai_base_url, s.embedding.openai_base_url) == ("http://127.0.0.1:9/v1",) * 2
    for shown in (repr(s), str(s), repr(s.llm), repr(s.embedding)):
        assert "sk-ant-one" not in shown and "sk-two" not in shown
    # The embedder's own variable wins for the embedder only.
    own = Settings.from_env(
        {"OPENAI_API_KEY": "sk-two", "MEMORY_ARCHIVE_EMBEDDING__OPENAI_API_KEY": "sk-emb"}
    )
    assert (
        own.embedding.openai_api_key is not None
        and own.embedding.openai_api_key.get_secret_value() == "sk-emb"
    )
    assert own.llm.openai_api_key is not None and own.llm.openai_api_key.get_secret_value() == "sk-two"
    # Unset, empty or blank: no key.
    blank = Settings.from_env({"ANTHROPIC_API_KEY": "   ", "OPENAI_API_KEY": ""})
    assert (blank.llm.anthropic_api_key, blank.llm.openai_api_key, blank.embedding.openai_api_key) == (
        None,
    ) * 3
    assert Settings().llm.anthropic_api_key is None


def test_two_names_of_one_key_are_refused_without_showing_either():
    with pytest.raises(ConfigError) as err:
        Settings.from_env(
            {"ANTHROPIC_API_KEY": "sk-ant-aaaa", "MEMORY_ARCHIVE_LLM__ANTHROPIC_API_KEY": "sk-ant-bbbb"}
        )
    assert "both set llm.anthropic_api_key" in str(err.value)
    assert "aaaa" not in str(err.value) and "bbbb" not in str(err.value)


def test_a_client_built_with_explicit_settings_reads_no_environment(
    conn, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
):
    # An environment that would pick another provider, key and server, were it read.
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENVIRONMENT)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("OPENAI_API_KEY", ENVIRONMENT)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MEMORY_ARCHIVE_SUMMARIZER", "anthropic")
    settings = Settings(
        llm=LLMConfig(base_url=fake_llm.openai_base_url, max_retries=0, openai_api_key=EXPLICIT),  # auto
        retrieval=RetrievalConfig(phase3_evaluator="llm", rerank="openai"),
        write=WriteConfig(judge="llm"),
        embedding=EmbeddingConfig(dim=TEST_DIM),  # auto, no key of its own: hashing
    )
    assert isinstance(embedder_from_settings(settings.embedding), HashingEmbedder)

    # Every LLM role built from these settings: OpenAI (auto, with the settings' key), at the fake server.
    summary = summarizer_from_settings(settings.llm).summarize(SummaryInput("The user likes green tea.", T0))
    assert summary.kind == "openai"
    json_llm = json_llm_from_settings(settings.llm)
    assert json_llm is not None and json_llm.kind == "openai"
    evaluator = evaluator_from_settings(settings.retrieval.phase3_evaluator, settings.llm)
    assert evaluator.name == "openai:gpt-4o-mini"
    reranker = reranker_from_settings(settings)
    assert reranker is not None
    reranker.rerank("sourdough", ranked_hot_hits(["sourdough starter", "oat milk"], T0))
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")
    client.add("u", "Lives in Lisbon", now=T0)
    judged = client.add("u", "Lives in Porto", now=T0 + timedelta(minutes=1))
    assert judged.judge is not None and judged.judge["model"] == "gpt-4o-mini"

    sent = [r for r in fake_llm.requests if r.path == "/v1/chat/completions"]
    assert len(sent) == 3 and fake_llm.judge_requests() == 1  # summary, rerank, judge
    assert {r.headers.get("authorization") for r in sent} == {f"Bearer {EXPLICIT}"}
    assert not any(r.path == "/v1/messages" for r in fake_llm.requests)
