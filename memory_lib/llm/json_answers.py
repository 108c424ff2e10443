"""JSON answers from the configured LLM provider, validated by a pydantic schema (digests, facts).

A prompt over memory_lib.llm.client's LLMClient: its SDK client, our retry and rate-limit policy, the
key kept out of errors and reprs. Only the prompt and the parsing are ours: the answer must be one JSON
object that the given pydantic model accepts, else SummarizationError naming the model and what was
wrong (nothing is written from an answer that does not validate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from ..core.errors import SummarizationError
from .client import LLMClient, llm_client_from_settings
from .summary import estimate_cost_usd
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
    """The JSON-answer prompt over an LLM client (Anthropic or OpenAI): digests, facts, the write judge."""

    def __init__(self, llm: LLMClient, *, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS):
        self.llm = llm
        self.kind = llm.kind
        self.model = llm.model
        self.max_output_tokens = max_output_tokens

    def __repr__(self) -> str:
        return f"JsonLLM({self.kind}, model={self.model!r})"

    def complete(self, prompt: str, schema: type[M]) -> tuple[M, JsonUsage]:
        text, usage = self.complete_text(prompt)
        return parse_json_object(text, schema, model=self.model), usage

    def complete_text(self, prompt: str) -> tuple[str | None, JsonUsage]:
        """The answer's text and what it cost, unparsed (a caller that must bill a malformed answer)."""
        # "summary": the request's name in error messages, as it has always been for JSON answers too.
        answer = self.llm.complete(prompt, max_tokens=self.max_output_tokens, what="summary")
        if answer.empty:
            raise SummarizationError(f"model {self.model!r} returned no choices")
        if answer.cut_off:
            raise SummarizationError(f"model {self.model!r} hit max_output_tokens={self.max_output_tokens}")
        u = answer.usage
        # Every prompt token, cached or not, at the list price of the configured model.
        tokens_in = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens
        return answer.text, JsonUsage(
            answer.model,
            tokens_in,
            u.output_tokens,
            estimate_cost_usd(self.model, tokens_in, u.output_tokens),
        )


def json_llm_from_settings(llm: LLMConfig) -> JsonLLM | None:
    """The JSON prompt over the provider the settings choose (as for summaries), or None when they
    resolve to offline ("extractive")."""
    client = llm_client_from_settings(llm)
    return JsonLLM(client) if client is not None else None
