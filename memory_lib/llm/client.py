"""One client per LLM vendor; every LLM role is a prompt over it.

`LLMClient` is the vendor's SDK client under our rate limit and retries (memory_lib.llm.transport's
ProviderClient). A vendor implements three things: the request for a prompt (`request_params`), the call
(`_create`), and the reading of its answer as a `Completion` (`read`, shared by the batch path). Every
role (summary, write judge, escalation evaluator, digests and facts, rerank) renders its prompt, calls
`complete` and reads the text; none of them speaks a provider's message API. The offline paths (the
extractive summarizer, the heuristic evaluator) use no LLMClient at all and name themselves so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.config import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL
from ..core.errors import InvalidInputError
from ..core.pricing import Usage, usage_from_response
from .transport import ProviderClient, RateLimiter

if TYPE_CHECKING:
    from ..core.config import LLMConfig

__all__ = [
    "AnthropicClient",
    "Completion",
    "LLMClient",
    "OpenAIClient",
    "llm_client",
    "llm_client_from_settings",
    "llm_provider",
]


@dataclass(frozen=True)
class Completion:
    """One answer of a provider, whatever its API. `text` is None when the answer has no text (no text
    block, no choice); `cut_off`: it stopped at max_tokens; `empty`: the provider returned no choice."""

    text: str | None
    model: str
    usage: Usage
    request_id: str | None
    cut_off: bool
    empty: bool = False


class LLMClient(ProviderClient):
    """A vendor's chat API. Subclasses implement `request_params`, `_create` and `read`."""

    def request_params(self, prompt: str, *, max_tokens: int, json_mode: bool = False) -> dict[str, Any]:
        """The request asking `prompt` as one user message. `json_mode`: ask the API itself for one JSON
        object, where it has such a mode."""
        raise NotImplementedError

    def _create(self, params: dict[str, Any]) -> Any:
        """The SDK's raw response (`with_raw_response`) to `params`."""
        raise NotImplementedError

    def read(self, response: Any) -> Completion:
        """A parsed response (from a call or a batch result) as a Completion."""
        raise NotImplementedError

    def complete(
        self, prompt: str, *, max_tokens: int, json_mode: bool = False, what: str = "completion"
    ) -> Completion:
        """`prompt` answered, under the rate limit and retries; `what` names the request in errors
        (SummarizationError naming the provider, `what` and the model)."""
        params = self.request_params(prompt, max_tokens=max_tokens, json_mode=json_mode)
        return self.read(self.call_api(lambda: self._create(params), what))


class AnthropicClient(LLMClient):
    kind = "anthropic"
    default_model = DEFAULT_ANTHROPIC_MODEL  # llm.anthropic_model's default (memory_lib.core.config)

    def request_params(self, prompt: str, *, max_tokens: int, json_mode: bool = False) -> dict[str, Any]:
        # The Messages API has no JSON mode: the prompt asks for JSON, the caller validates it.
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }

    def _create(self, params: dict[str, Any]) -> Any:
        return self.client.messages.with_raw_response.create(**params)

    def read(self, response: Any) -> Completion:
        """A Messages API `Message`."""
        texts = [block.text for block in response.content if getattr(block, "type", None) == "text"]
        return Completion(
            "".join(texts) if texts else None,
            getattr(response, "model", None) or self.model,
            usage_from_response(self.kind, response.usage),
            response.id,
            cut_off=response.stop_reason == "max_tokens",
        )


class OpenAIClient(LLMClient):
    kind = "openai"
    default_model = DEFAULT_OPENAI_MODEL  # llm.openai_model's default

    def request_params(self, prompt: str, *, max_tokens: int, json_mode: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "max_completion_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
        if json_mode:  # the model must answer with one JSON object
            params["response_format"] = {"type": "json_object"}
        return params

    def _create(self, params: dict[str, Any]) -> Any:
        return self.client.chat.completions.with_raw_response.create(**params)

    def read(self, response: Any) -> Completion:
        """A `ChatCompletion` (a batch result's body included)."""
        choice = response.choices[0] if response.choices else None
        return Completion(
            choice.message.content if choice else None,
            getattr(response, "model", None) or self.model,
            usage_from_response(self.kind, response.usage),
            response.id,
            cut_off=choice is not None and choice.finish_reason == "length",
            empty=choice is None,
        )


_CLIENTS: dict[str, type[LLMClient]] = {"anthropic": AnthropicClient, "openai": OpenAIClient}


def llm_client(
    provider: str,
    api_key: str,
    model: str | None = None,
    base_url: str | None = None,
    limiter: RateLimiter | None = None,
    max_retries: int = 5,
    timeout: float = 30.0,
    *,
    retry_wait_base: float = 0.5,
    retry_wait_max: float = 20.0,
) -> LLMClient:
    """The client of `provider` ("anthropic" or "openai")."""
    if provider not in _CLIENTS:
        raise InvalidInputError("provider", provider, "must be 'anthropic' or 'openai'")
    return _CLIENTS[provider](
        api_key,
        model,
        base_url,
        limiter,
        max_retries,
        timeout,
        retry_wait_base=retry_wait_base,
        retry_wait_max=retry_wait_max,
    )


def _key(llm: LLMConfig, provider: str) -> str | None:
    secret = llm.anthropic_api_key if provider == "anthropic" else llm.openai_api_key
    return secret.get_secret_value() if secret is not None else None


def llm_provider(llm: LLMConfig) -> str:
    """The provider `llm.provider` names; "auto": Anthropic when its key is set, else OpenAI when its key
    is set, else "extractive" (no LLM)."""
    if llm.provider != "auto":
        return llm.provider
    if _key(llm, "anthropic"):
        return "anthropic"
    return "openai" if _key(llm, "openai") else "extractive"


def llm_client_from_settings(
    llm: LLMConfig,
    *,
    max_retries: int | None = None,
    timeout: float | None = None,
    limiter: RateLimiter | None = None,
    retry_wait_max: float = 20.0,
) -> LLMClient | None:
    """The client of `llm_provider(llm)` with the key and model of `llm`, or None for "extractive".
    A provider named whose key is unset raises InvalidInputError naming the variable."""
    provider = llm_provider(llm)
    if provider not in _CLIENTS:
        return None
    key = _key(llm, provider)
    if not key:
        variable = f"{provider.upper()}_API_KEY"
        raise InvalidInputError(
            variable, None, f"llm.provider={provider!r} needs this environment variable set"
        )
    return llm_client(
        provider,
        key,
        llm.anthropic_model if provider == "anthropic" else llm.openai_model,
        llm.base_url or (llm.anthropic_base_url if provider == "anthropic" else llm.openai_base_url),
        limiter if limiter is not None else RateLimiter(llm.requests_per_second),
        llm.max_retries if max_retries is None else max_retries,
        llm.timeout_seconds if timeout is None else timeout,
        retry_wait_max=retry_wait_max,
    )
