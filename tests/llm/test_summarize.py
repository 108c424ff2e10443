"""Summarizers through the real anthropic/openai SDKs against a local fake API, and the offline fallback."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_lib.core.config import LLMConfig, Settings
from memory_lib.core.errors import InvalidInputError, SummarizationError
from memory_lib.llm.extractive import _content_words
from memory_lib.llm.summarize import (
    SUMMARY_PROMPT,
    AnthropicSummarizer,
    ExtractiveSummarizer,
    OpenAISummarizer,
    PaidSummarizationError,
    SummaryInput,
    estimate_cost_usd,
    extract_key_entities,
    parse_summary_output,
    render_summary_prompt,
    summarizer_from_settings,
)
from memory_lib.llm.transport import RateLimiter
from testing.fake_answers import count_tokens, fake_domain, fake_entities, fake_summary
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer

PROVIDERS = ["anthropic", "openai"]
ROUTE = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
# List USD per MTok of the default models (claude-haiku-5-5, gpt-4o-mini), as the providers publish them.
PRICE = {"anthropic": (0.10, 0.50), "openai": (0.15, 0.60)}
WHEN = datetime(2024, 3, 4, 9, 30, tzinfo=UTC)
MEMORY = (
    "Maria Lopez moved to Lisbon on March 3, 2024. She leads Project Atlas at Acme Corp. "
    "Her order ORD-4417 of $1,200 is still open. She prefers tea over coffee."
)


def item(content: str = MEMORY) -> SummaryInput:
    return SummaryInput(content=content, created_at=WHEN, domain="personal", category="fact")


def make(provider: str, server: FakeLLMServer, **kwargs):
    kwargs.setdefault("retry_wait_base", 0.001)
    kwargs.setdefault("retry_wait_max", 0.01)  # real backoff, tiny waits
    cls = AnthropicSummarizer if provider == "anthropic" else OpenAISummarizer
    return cls(FAKE_API_KEY, base_url=server.base_url, **kwargs)


# -- LLM summarizers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_summary_entities_and_domain_in_one_call_with_usage_and_cost(provider: str, fake_llm: FakeLLMServer):
    summarizer = make(provider, fake_llm)
    summary = summarizer.summarize(item())

    assert summary.text == fake_summary(MEMORY)
    assert summary.kind == provider
    assert summary.model == summarizer.model
    # Entities and domain come from the same answer, typed, not from the regex extractor.
    assert [[e.name, e.type] for e in summary.entities] == fake_entities(MEMORY)
    assert summary.domain_guess == fake_domain(MEMORY)
    [request] = fake_llm.requests
    assert fake_llm.count() == 1
    # Usage is the server's: computed from the prompt and the answer, not constants.
    answer = json.dumps(
        {"summary": fake_summary(MEMORY), "entities": fake_entities(MEMORY), "domain": fake_domain(MEMORY)}
    )
    assert summary.input_tokens == fake_llm.input_tokens_for(request.body) > count_tokens(MEMORY)
    assert summary.output_tokens == count_tokens(answer)
    price_in, price_out = PRICE[provider]
    expected = (summary.input_tokens * price_in + summary.output_tokens * price_out) / 1e6
    assert summary.cost_usd == pytest.approx(expected)
    assert summary.cost_usd > 0 and summary.priced and summary.mode == "sync"

    assert request.path == ROUTE[provider]
    assert request.body["model"] == summarizer.model
    prompt = request.body["messages"][0]["content"]
    assert MEMORY in prompt and WHEN.isoformat() in prompt and "2-3 sentences" in prompt
    max_tokens_field = "max_tokens" if provider == "anthropic" else "max_completion_tokens"
    assert request.body[max_tokens_field] == 400


@pytest.mark.parametrize("provider", PROVIDERS)
def test_malformed_json_is_a_paid_error_for_that_memory(provider: str, fake_llm: FakeLLMServer):
    fake_llm.malformed_json_when_contains = "ORD-4417"
    summarizer = make(provider, fake_llm)
    with pytest.raises(PaidSummarizationError, match="malformed summary JSON") as raised:
        summarizer.summarize(item())
    spent = raised.value.spent
    assert spent.input_tokens == fake_llm.input_tokens_for(fake_llm.requests[0].body)
    assert spent.output_tokens > 0 and spent.cost_usd > 0  # billed, so the ledger must see it
    assert fake_llm.count() == 1  # a bad answer is not retried
    assert summarizer.summarize(item("Maria Lopez moved to Lisbon.")).text  # the next memory is fine


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (
            '```json\n{"summary": "The user met Ana.", "entities": [["Ana", "person"]], "domain": "family"}\n```',
            ["Ana"],
        ),
        ('{"summary": "The user met Ana.", "entities": [{"name": "Ana", "type": "friend"}]}', ["Ana"]),
    ],
)
def test_summary_json_variants_accepted(raw: str, names: list[str]):
    out = parse_summary_output(raw, source="test")
    assert [e.name for e in out.entities] == names
    assert out.entities[0].type in ("person", "other")  # an unknown type is kept as "other"


@pytest.mark.parametrize(
    "raw",
    ["The user met Ana.", '{"entities": []}', '{"summary": "x", "entities": [["a", "b", "c"]]}', "[1, 2]"],
)
def test_summary_json_that_is_not_the_shape_is_refused(raw: str):
    with pytest.raises(SummarizationError, match="malformed summary JSON"):
        parse_summary_output(raw, source="test")


def test_openai_accepts_the_v1_base_url(fake_llm: FakeLLMServer):
    summarizer = OpenAISummarizer(FAKE_API_KEY, base_url=fake_llm.openai_base_url)
    assert summarizer.summarize(item()).text == fake_summary(MEMORY)


@pytest.mark.parametrize(
    ("provider", "status"),
    [("anthropic", 429), ("anthropic", 500), ("anthropic", 529), ("openai", 429), ("openai", 503)],
)
def test_transient_failures_are_retried(provider: str, status: int, fake_llm: FakeLLMServer):
    fake_llm.transient_failures = 2
    fake_llm.transient_status = status
    summary = make(provider, fake_llm, max_retries=5).summarize(item())
    assert summary.text == fake_summary(MEMORY)
    assert [r.status for r in fake_llm.requests] == [status, status, 200]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_persistent_server_error_gives_up_after_max_retries(provider: str, fake_llm: FakeLLMServer):
    fake_llm.fail_fraction = 1.0
    fake_llm.fail_status = 500
    summarizer = make(provider, fake_llm, max_retries=3)
    with pytest.raises(SummarizationError) as raised:
        summarizer.summarize(item())
    message = str(raised.value)
    assert summarizer.model in message and "HTTP 500" in message and "4 attempt(s)" in message
    assert FAKE_API_KEY not in message and FAKE_API_KEY not in repr(summarizer)
    assert fake_llm.count(ROUTE[provider]) == 4


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_errors_are_not_retried(provider: str, status: int, fake_llm: FakeLLMServer):
    fake_llm.fail_fraction = 1.0
    fake_llm.fail_status = status
    with pytest.raises(SummarizationError, match=f"HTTP {status}"):
        make(provider, fake_llm).summarize(item())
    assert fake_llm.count() == 1


def test_persistent_failures_hit_the_same_memories_every_time(fake_llm: FakeLLMServer):
    fake_llm.fail_fraction = 0.5
    fake_llm.fail_status = 400
    summarizer = make("anthropic", fake_llm)
    memories = [f"Memory number {i}: the user mentioned topic {i * 7}." for i in range(30)]

    def failing() -> set[int]:
        failed = set()
        for i, content in enumerate(memories):
            try:
                summarizer.summarize(item(content))
            except SummarizationError:
                failed.add(i)
        return failed

    first = failing()
    assert 0 < len(first) < len(memories)
    assert failing() == first


@pytest.mark.parametrize("provider", PROVIDERS)
def test_timeout_is_retried_then_reported(provider: str, fake_llm: FakeLLMServer):
    fake_llm.delay_seconds = 0.5
    summarizer = make(provider, fake_llm, max_retries=1, timeout=0.1)
    with pytest.raises(SummarizationError, match=r"2 attempt\(s\).*Timeout"):
        summarizer.summarize(item())
    assert fake_llm.count() == 2


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("bad_text", ["", "   \n "])
def test_empty_summary_is_an_error(provider: str, bad_text: str, fake_llm: FakeLLMServer):
    fake_llm.summary_override = bad_text
    with pytest.raises(SummarizationError, match="empty summary"):
        make(provider, fake_llm).summarize(item())
    assert fake_llm.count() == 1  # a bad answer is not retried


def test_empty_summary_fraction_selects_memories(fake_llm: FakeLLMServer):
    fake_llm.empty_summary_fraction = 1.0
    with pytest.raises(SummarizationError, match="empty summary"):
        make("openai", fake_llm).summarize(item())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_overlong_summary_is_an_error(provider: str, fake_llm: FakeLLMServer):
    fake_llm.summary_override = "The user said a lot. " * 100
    with pytest.raises(SummarizationError, match="max_summary_chars=1200"):
        make(provider, fake_llm).summarize(item())


def test_response_without_text_block_is_an_error(fake_llm: FakeLLMServer):
    fake_llm.omit_text_block = True
    with pytest.raises(SummarizationError, match="no text block"):
        make("anthropic", fake_llm).summarize(item())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_blank_memory_is_refused_without_a_request(provider: str, fake_llm: FakeLLMServer):
    with pytest.raises(SummarizationError, match="empty"):
        make(provider, fake_llm).summarize(item("  \n"))
    assert fake_llm.count() == 0


def test_prompt_keeps_the_memory_and_asks_for_json():
    prompt = render_summary_prompt(SummaryInput("Uses {braces} and %s.", WHEN))
    assert "<memory>\nUses {braces} and %s.\n</memory>" in prompt
    for words in (
        "2-3 sentences",
        "third person",
        "name",
        "place",
        "project",
        "number",
        "date",
        "decision",
        "preference",
        "no preamble",
        "JSON",
        "entities",
        "domain",
    ):
        assert words in SUMMARY_PROMPT


def test_cost_table():
    assert estimate_cost_usd("claude-haiku-4-5", 1_000_000, 1_000_000) == pytest.approx(6.00)
    assert estimate_cost_usd("claude-haiku-4-5-20251001", 1_000_000, 0) == pytest.approx(1.00)
    assert estimate_cost_usd("gpt-4o-mini", 2_000_000, 1_000_000) == pytest.approx(0.90)
    assert estimate_cost_usd("some-future-model", 1_000_000, 1_000_000) == 0.0


# -- rate limiter -------------------------------------------------------------------------------------

SLACK = 1e-3  # clock granularity; the limiter itself never runs early


def test_rate_limiter_holds_the_rate():
    limiter = RateLimiter(20)
    start = time.monotonic()
    for _ in range(10):
        limiter.acquire()
    assert time.monotonic() - start >= 9 / 20 - SLACK


def test_rate_limiter_holds_the_rate_across_threads():
    limiter = RateLimiter(25)
    start = time.monotonic()
    threads = [threading.Thread(target=lambda: [limiter.acquire() for _ in range(4)]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start >= 11 / 25 - SLACK


def test_rate_limiter_refuses_a_nonpositive_rate():
    with pytest.raises(InvalidInputError, match="requests_per_second"):
        RateLimiter(0)


def test_summarizer_waits_for_the_limiter_before_every_attempt(fake_llm: FakeLLMServer):
    summarizer = make("openai", fake_llm, limiter=RateLimiter(20))
    fake_llm.transient_failures = 2
    start = time.monotonic()
    for _ in range(4):
        summarizer.summarize(item())
    assert fake_llm.count() == 6
    assert time.monotonic() - start >= 5 / 20 - SLACK


# -- extractive ---------------------------------------------------------------------------------------


def test_extractive_keeps_the_informative_sentences_in_order():
    content = (
        "It was a long chat. Maria Lopez moved to Lisbon on March 3, 2024. The weather was nice. "
        "Her order ORD-4417 cost $1,200 and ships Friday. She said thanks. She joined Acme Corp in 2021."
    )
    summary = ExtractiveSummarizer().summarize(item(content))
    # The three most informative sentences in order, then the content words of the ones left out.
    assert summary.text == (
        "Maria Lopez moved to Lisbon on March 3, 2024. Her order ORD-4417 cost $1,200 and ships Friday. "
        "She joined Acme Corp in 2021. (also: long, chat, weather)"
    )
    assert (summary.kind, summary.model, summary.cost_usd) == ("extractive-offline", "extractive-v2", 0.0)
    assert summary.input_tokens == len(content.split())
    assert summary.output_tokens == len(summary.text.split())


def test_extractive_is_deterministic_and_compresses_short_memories():
    summarizer = ExtractiveSummarizer()
    assert summarizer.summarize(item()) == ExtractiveSummarizer().summarize(item())
    assert summarizer.summarize(item("The user likes tea.")).text == "User likes tea."  # articles go
    assert summarizer.summarize(item("Wow, the user really likes tea!")).text == "User likes tea!"


def test_extractive_does_not_split_at_abbreviations():
    content = "Dr. Smith met the user in St. Louis on Jan. 5 at 3 p.m. today. They talked. It rained."
    pieces = ExtractiveSummarizer().select_sentences(content)
    assert pieces[0] == "Dr. Smith met the user in St. Louis on Jan. 5 at 3 p.m. today."


def test_extractive_truncates_one_long_sentence_at_a_word_boundary():
    content = "The user described " + " and ".join(
        f"project Alpha-{i} with budget {i}00 euros" for i in range(60)
    )
    summarizer = ExtractiveSummarizer(max_chars=200)
    [piece] = summarizer.select_sentences(content)
    assert piece.endswith("…") and len(piece) <= 200
    kept = piece.removesuffix("…")
    assert content.startswith(kept)
    assert content[len(kept)] in " ,"  # cut between words


def test_extractive_refuses_content_without_words():
    with pytest.raises(SummarizationError):
        ExtractiveSummarizer().summarize(item("... --- !!!"))


WORDS = st.sampled_from(
    [
        "the",
        "user",
        "likes",
        "tea",
        "moved",
        "Berlin",
        "Maria",
        "Lopez",
        "ORD-4417",
        "$1,200",
        "2024-03-03",
        "March",
        "3,",
        "on",
        "project",
        "Atlas",
        "e.g.",
        "Dr.",
        "x",
        "Ünïcode",
        "naïve",
    ]
)
SENTENCES = (
    st.lists(WORDS, min_size=1, max_size=12)
    .map(" ".join)
    .flatmap(lambda s: st.sampled_from([".", "!", "?", "", "\n", "..."]).map(lambda end: s + end))
)
CONTENTS = st.one_of(
    st.lists(SENTENCES, min_size=1, max_size=8).flatmap(
        lambda ss: st.sampled_from([" ", "  ", "\n", "\n\n- "]).map(lambda sep: sep.join(ss))
    ),
    st.text(min_size=1, max_size=600),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=CONTENTS)
def test_extractive_sentences_are_verbatim_substrings(content: str):
    summarizer = ExtractiveSummarizer()
    if not any(ch.isalnum() for ch in content):
        with pytest.raises(SummarizationError):
            summarizer.summarize(item(content))
        return
    pieces = summarizer.select_sentences(content)
    assert 1 <= len(pieces) <= 3
    for piece in pieces:
        assert piece.strip() == piece and piece
        assert piece.removesuffix("…") in content
    summary = summarizer.summarize(item(content))
    for piece in pieces:  # the summary keeps every content word of its sentences
        for word in _content_words(piece):
            assert word.casefold() in summary.text.casefold()
    assert len(summary.text) <= summarizer.max_chars + 2 * len(pieces)
    assert summarizer.summarize(item(content)) == summary


def test_extractive_keeps_names_numbers_and_dates_verbatim():
    text = ExtractiveSummarizer().summarize(item()).text
    for entity in ("Maria Lopez", "Lisbon", "March 3, 2024", "Project Atlas", "ORD-4417", "$1,200"):
        assert entity in text


# -- key entities ---------------------------------------------------------------------------------------


def test_key_entities_in_first_seen_order():
    assert extract_key_entities(MEMORY) == [
        "Maria Lopez",
        "Lisbon",
        "March 3, 2024",
        "Project Atlas",
        "Acme Corp",
        "ORD-4417",
        "$1,200",
    ]


def test_key_entities_skip_sentence_initial_words_and_dedupe():
    text = (
        "Yesterday the user met Anna Berg in New York. In Berlin she met Anna Berg again. "
        "The Bank of America card ending 4417 was declined; order ORD-4417 too. I said so."
    )
    assert extract_key_entities(text) == [
        "Anna Berg",
        "New York",
        "Berlin",
        "Bank of America",
        "4417",
        "ORD-4417",
    ]
    assert extract_key_entities(text, limit=2) == ["Anna Berg", "New York"]
    assert extract_key_entities("") == []


# -- provider selection -----------------------------------------------------------------------------------


def _llm(env: dict[str, str], **llm: object) -> LLMConfig:
    """settings.llm as Settings.from_env reads it from `env` (the keys among it), with `llm` on top."""
    return Settings.from_env(env, llm=llm).llm


def test_auto_prefers_anthropic_then_openai_then_extractive():
    both = {"ANTHROPIC_API_KEY": FAKE_API_KEY, "OPENAI_API_KEY": FAKE_API_KEY}
    assert summarizer_from_settings(_llm(both)).kind == "anthropic"
    assert summarizer_from_settings(_llm({"OPENAI_API_KEY": FAKE_API_KEY})).kind == "openai"
    assert isinstance(summarizer_from_settings(_llm({"ANTHROPIC_API_KEY": "  "})), ExtractiveSummarizer)
    assert summarizer_from_settings(_llm({})).kind == "extractive-offline"


@pytest.mark.parametrize(
    ("provider", "env_var"), [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")]
)
def test_explicit_provider_without_key_names_the_variable(provider: str, env_var: str):
    with pytest.raises(InvalidInputError, match=env_var) as raised:
        summarizer_from_settings(LLMConfig(provider=provider))
    assert raised.value.field == env_var


def test_settings_reach_the_client(fake_llm: FakeLLMServer):
    llm = LLMConfig(
        provider="openai",
        openai_model="gpt-4o-mini",
        base_url=fake_llm.base_url,
        max_output_tokens=64,
        requests_per_second=50,
        max_summary_chars=60,
        openai_api_key=FAKE_API_KEY,
    )
    summarizer = summarizer_from_settings(llm)
    assert summarizer.summarize(item("The user likes tea.")).text == "The user likes tea."
    assert fake_llm.requests[0].body["max_completion_tokens"] == 64
    with pytest.raises(SummarizationError, match="max_summary_chars=60"):
        summarizer.summarize(item())
    extractive = summarizer_from_settings(LLMConfig(provider="extractive", openai_api_key=FAKE_API_KEY))
    assert isinstance(extractive, ExtractiveSummarizer)
