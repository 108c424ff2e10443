"""JSON answers from the configured LLM provider, validated by a pydantic schema (digests, facts).

Reuses memory_lib.llm.summarize's provider classes as they are: their SDK client, our retry and rate-limit
policy (memory_lib.llm.transport's `call_api`), the key kept out of errors and reprs. Only the prompt and
the parsing differ: the answer must be one JSON object that the given pydantic model accepts, else
SummarizationError naming the model and what was wrong (nothing is written from an answer that does not
validate).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..core.errors import SummarizationError
from .summarize import AnthropicSummarizer, OpenAISummarizer, estimate_cost_usd, summarizer_from_settings
from .transport import parse_json_answer

if TYPE_CHECKING:
    from ..core.config import LLMConfig

__all__ = ["JsonLLM", "JsonUsage", "json_llm_from_settings", "parse_json_object"]

M = TypeVar("M", bound=BaseModel)
# A digest or a list of facts is longer than a 2-3 sentence summary.
DEFAULT_MAX_OUTPUT_TOKENS = 1500


@dataclass(frozen=True)
class JsonUsage:
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float


def parse_json_object(text: str | None, schema: type[M], *, model: str) -> M:
    """`text` as one JSON object valid under `schema` (a ```json fence around it is tolerated)."""
    if not text or not text.strip():
        raise SummarizationError(f"model {model!r} returned no JSON")
    try:
        data = parse_json_answer(text)
    except json.JSONDecodeError as exc:  # its `doc` is the text without the fence
        raise SummarizationError(f"model {model!r} returned text that is not JSON: {exc.doc[:80]!r}") from exc
    if not isinstance(data, dict):
        raise SummarizationError(f"model {model!r} returned JSON {type(data).__name__}, not an object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '-'}: {e['msg']}" for e in exc.errors()[:5])
        raise SummarizationError(
            f"model {model!r} returned JSON that fails {schema.__name__}: {problems}"
        ) from exc


class JsonLLM:
    """One provider (Anthropic or OpenAI) asked for JSON objects."""

    def __init__(
        self,
        provider: AnthropicSummarizer | OpenAISummarizer,
        *,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    ):
        self._provider = provider
        self.kind = provider.kind
        self.model = provider.model
        self.max_output_tokens = max_output_tokens

    def __repr__(self) -> str:
        return f"JsonLLM({self.kind}, model={self.model!r})"

    def complete(self, prompt: str, schema: type[M]) -> tuple[M, JsonUsage]:
        text, usage = self.complete_text(prompt)
        return parse_json_object(text, schema, model=self.model), usage

    def complete_text(self, prompt: str) -> tuple[str | None, JsonUsage]:
        """The answer's text and what it cost, unparsed (a caller that must bill a malformed answer)."""
        p = self._provider
        # "summary": the request's name in error messages, as it has always been for JSON answers too.
        if isinstance(p, AnthropicSummarizer):
            response: Any = p.call_api(
                lambda: p.client.messages.with_raw_response.create(
                    model=self.model,
                    max_tokens=self.max_output_tokens,
                    messages=[{"role": "user", "content": prompt}],
                ),
                "summary",
            )
            if response.stop_reason == "max_tokens":
                raise SummarizationError(
                    f"model {self.model!r} hit max_output_tokens={self.max_output_tokens}"
                )
            text = "".join(b.text for b in response.content if getattr(b, "type", None) == "text")
            tokens_in, tokens_out = response.usage.input_tokens, response.usage.output_tokens
        else:
            response = p.call_api(
                lambda: p.client.chat.completions.with_raw_response.create(
                    model=self.model,
                    max_completion_tokens=self.max_output_tokens,
                    messages=[{"role": "user", "content": prompt}],
                ),
                "summary",
            )
            if not response.choices:
                raise SummarizationError(f"model {self.model!r} returned no choices")
            if response.choices[0].finish_reason == "length":
                raise SummarizationError(
                    f"model {self.model!r} hit max_output_tokens={self.max_output_tokens}"
                )
            text = response.choices[0].message.content
            usage = response.usage
            tokens_in, tokens_out = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
        model = getattr(response, "model", None) or self.model
        return text, JsonUsage(
            model, tokens_in, tokens_out, estimate_cost_usd(self.model, tokens_in, tokens_out)
        )


def json_llm_from_settings(llm: LLMConfig, env: Mapping[str, str] | None = None) -> JsonLLM | None:
    """The provider the settings choose (as for summaries), or None when they resolve to offline."""
    provider = summarizer_from_settings(llm, os.environ if env is None else env)
    if isinstance(provider, AnthropicSummarizer | OpenAISummarizer):
        return JsonLLM(provider)
    return None
