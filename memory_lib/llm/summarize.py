"""Summaries of cold memories: the summary prompt over an LLM client (Anthropic, OpenAI), or the offline
extractive summarizer.

`LLMSummarizer` is a prompt over memory_lib.llm.client's LLMClient (the SDK client, our rate limit and
retries, the key kept out of errors); the offline path (memory_lib.llm.extractive) never imports an LLM
SDK. The summary's types and the rules an answer must meet are in memory_lib.llm.summary; every name
is importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..core.errors import SummarizationError
from ..core.pricing import DEFAULT_PRICES, ModelPrice, cost_usd
from .client import (
    AnthropicClient,
    Completion,
    LLMClient,
    OpenAIClient,
    llm_client_from_settings,
    llm_provider,
)
from .extractive import DATE_PATTERN, ExtractiveSummarizer, extract_key_entities, split_sentences
from .summary import (
    PRICES_USD_PER_MTOK,
    SUMMARY_PROMPT,
    Entity,
    PaidSummarizationError,
    Summarizer,
    Summary,
    SummaryInput,
    SummaryOutput,
    check_content,
    check_summary_text,
    estimate_cost_usd,
    parse_summary_output,
    render_summary_prompt,
    validated_summary_text,
)
from .transport import RateLimiter, RetryPolicy

if TYPE_CHECKING:
    from ..core.config import LLMConfig

__all__ = [
    "DATE_PATTERN",
    "PRICES_USD_PER_MTOK",
    "SUMMARY_PROMPT",
    "AnthropicSummarizer",
    "Entity",
    "ExtractiveSummarizer",
    "LLMSummarizer",
    "OpenAISummarizer",
    "PaidSummarizationError",
    "Summarizer",
    "Summary",
    "SummaryInput",
    "SummaryOutput",
    "check_summary_text",
    "estimate_cost_usd",
    "extract_key_entities",
    "llm_provider",
    "parse_summary_output",
    "render_summary_prompt",
    "split_sentences",
    "summarizer_from_settings",
]


class LLMSummarizer:
    """The summary prompt over an LLM client.

    One request per memory returns the summary, its key entities with types and a domain guess as JSON
    (SummaryOutput). Every answer that arrived is paid for: when it is unusable (malformed JSON, cut off,
    empty, too long) the error is a PaidSummarizationError whose `spent` carries the usage, so the ledger
    records it too. `request_params` and `parse_response` are shared with the batch path
    (memory_lib.llm.batches), which sends the same request and reads the same answer; `client` and
    `call` are the LLM client's SDK client and retries, which the batch endpoints use.
    """

    def __init__(
        self,
        llm: LLMClient,
        *,
        max_output_tokens: int = 400,
        max_summary_chars: int = 1200,
        prices: Mapping[str, ModelPrice] | None = None,
        batch_threshold: int = 0,
        batch_poll_seconds: float = 30.0,
        batch_wait_seconds: float = 3600.0,
    ):
        self.llm = llm
        self.kind = llm.kind
        self.model = llm.model
        self.max_output_tokens = max_output_tokens
        self.max_summary_chars = max_summary_chars
        self.prices = dict(DEFAULT_PRICES if prices is None else prices)
        # An archival batch with more memories than this goes through the batch API (0: never).
        self.batch_threshold = batch_threshold
        self.batch_poll_seconds = batch_poll_seconds
        self.batch_wait_seconds = batch_wait_seconds

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(model={self.model!r})"

    @property
    def client(self) -> Any:
        return self.llm.client

    @property
    def retry_policy(self) -> RetryPolicy:
        return self.llm.retry_policy

    def call(self, request: Any, what: str) -> Any:
        return self.llm.call(request, what)

    def request_params(self, item: SummaryInput) -> dict[str, Any]:
        return self.llm.request_params(
            render_summary_prompt(item), max_tokens=self.max_output_tokens, json_mode=True
        )

    def parse_response(self, response: Any, *, mode: str = "sync") -> Summary:
        """A provider's answer (from a sync call or a batch result) as a Summary."""
        return self._summary(self.llm.read(response), mode=mode)

    def summarize(self, item: SummaryInput) -> Summary:
        check_content(item)
        prompt = render_summary_prompt(item)
        return self._summary(
            self.llm.complete(prompt, max_tokens=self.max_output_tokens, json_mode=True, what="summary"),
            mode="sync",
        )

    def _summary(self, answer: Completion, *, mode: str) -> Summary:
        model, usage = answer.model, answer.usage
        cost = cost_usd(self.prices, model, usage, batch=mode == "batch")
        spent = Summary(
            "",
            model,
            self.kind,
            usage.input_tokens,
            usage.output_tokens,
            cost or 0.0,
            usage.cache_creation_input_tokens,
            usage.cache_read_input_tokens,
            priced=cost is not None,
            mode=mode,
            request_id=answer.request_id,
        )
        try:
            if answer.cut_off:
                # A summary cut mid-sentence would be archived as if whole (and its JSON is incomplete).
                raise SummarizationError(
                    f"model {self.model!r} hit max_output_tokens={self.max_output_tokens}: summary cut off"
                )
            if answer.text is None:
                raise SummarizationError(f"model {self.model!r} returned no text block")
            out = parse_summary_output(answer.text, source=f"{self.kind}:{model}")
            text = validated_summary_text(out.summary, model=self.model, max_chars=self.max_summary_chars)
        except SummarizationError as exc:
            raise PaidSummarizationError(str(exc), spent) from None
        entities = tuple(
            dict.fromkeys(Entity(e.name.strip(), e.type) for e in out.entities if e.name.strip())
        )
        return replace(spent, text=text, entities=entities, domain_guess=out.domain)


class _KeyedSummarizer(LLMSummarizer):
    """An LLMSummarizer over a new client of `client_type` built from a key."""

    client_type: type[LLMClient]

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int = 400,
        limiter: RateLimiter | None = None,
        max_retries: int = 5,
        timeout: float = 30.0,
        *,
        max_summary_chars: int = 1200,
        retry_wait_base: float = 0.5,
        retry_wait_max: float = 20.0,
        prices: Mapping[str, ModelPrice] | None = None,
        batch_threshold: int = 0,
        batch_poll_seconds: float = 30.0,
        batch_wait_seconds: float = 3600.0,
    ):
        llm = self.client_type(
            api_key,
            model,
            base_url,
            limiter,
            max_retries,
            timeout,
            retry_wait_base=retry_wait_base,
            retry_wait_max=retry_wait_max,
        )
        super().__init__(
            llm,
            max_output_tokens=max_output_tokens,
            max_summary_chars=max_summary_chars,
            prices=prices,
            batch_threshold=batch_threshold,
            batch_poll_seconds=batch_poll_seconds,
            batch_wait_seconds=batch_wait_seconds,
        )


class AnthropicSummarizer(_KeyedSummarizer):
    """The summary prompt over Anthropic's Messages API."""

    client_type = AnthropicClient


class OpenAISummarizer(_KeyedSummarizer):
    """The summary prompt over OpenAI's Chat Completions API (JSON mode)."""

    client_type = OpenAIClient


def summarizer_from_settings(llm: LLMConfig) -> Summarizer:
    """The summarizer `llm.provider` asks for (llm_provider: "auto" picks Anthropic, OpenAI, extractive),
    with the key of the settings. A provider named whose key is unset raises InvalidInputError."""
    client = llm_client_from_settings(llm)
    if client is None:
        return ExtractiveSummarizer()
    return LLMSummarizer(
        client,
        max_output_tokens=llm.max_output_tokens,
        max_summary_chars=llm.max_summary_chars,
        prices=llm.prices,
        batch_threshold=llm.batch_threshold,
        batch_poll_seconds=llm.batch_poll_seconds,
        batch_wait_seconds=llm.batch_wait_seconds,
    )
