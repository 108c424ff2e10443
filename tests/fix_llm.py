"""The LLM fixtures: a local HTTP server speaking the Anthropic and OpenAI APIs to the real SDKs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testing.fake_llm import FAKE_API_KEY, FakeLLMServer


@pytest.fixture(scope="module")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    """A local HTTP server speaking the Anthropic and OpenAI APIs to the real SDKs."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer) -> FakeLLMServer:
    fake_llm_server.reset()
    return fake_llm_server


@pytest.fixture
def llm_keys(monkeypatch: pytest.MonkeyPatch) -> str:
    """The fake server's API key as ANTHROPIC_API_KEY and OPENAI_API_KEY, for code that reads them from the
    environment (the Dagster summarizer resource); pair it with `fake_llm`."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_API_KEY)
    return FAKE_API_KEY
