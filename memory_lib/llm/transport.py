"""How the library talks to the LLM providers: their SDK clients, our rate limit and our retries.

Retries are ours, not the SDKs' (`max_retries=0`), so that the policy is the same for every provider
and every caller: summaries, JSON answers, batch endpoints, the embedder and the reranker. The SDKs
are imported lazily so that the offline paths (and anything that merely imports this module) do not
pay their import time. The API key never appears in an error message or a repr.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from ..core.errors import InvalidInputError, SummarizationError

__all__ = [
    "DEFAULT_BASE_URLS",
    "MalformedResponseError",
    "ProviderClient",
    "RateLimiter",
    "RetryPolicy",
    "call_with_retries",
    "is_retryable",
    "parse_json_answer",
    "sdk_client",
    "strip_json_fence",
]

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------
# Client-side rate limit and retries


class RateLimiter:
    """Spaces calls at least 1/requests_per_second apart, across threads; no bursts."""

    def __init__(
        self,
        requests_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not (math.isfinite(requests_per_second) and requests_per_second > 0):
            raise InvalidInputError("requests_per_second", requests_per_second, "must be a positive number")
        self.requests_per_second = requests_per_second
        self._interval = 1.0 / requests_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next_slot = -math.inf

    def acquire(self) -> float:
        """Block until this caller's slot; return the seconds waited."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._next_slot)
            self._next_slot = slot + self._interval
        wait = slot - now
        if wait > 0:
            self._sleep(wait)  # outside the lock: later callers queue for later slots meanwhile
        return wait


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: wait ~ U(0, min(wait_max, wait_base * 2**n))."""

    max_retries: int = 5
    wait_base: float = 0.5
    wait_max: float = 20.0
    retry_after_max: float = 60.0  # a server's retry-after is honoured up to this


# 408/429 and every 5xx (Anthropic's 529 "overloaded" included) are worth another try; other 4xx are not.
_RETRYABLE_STATUS = frozenset({408, 429})


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _is_connection_error(exc: BaseException) -> bool:
    # The SDKs' timeouts subclass their APIConnectionError. Only SDKs already imported can have raised.
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name in ("anthropic", "openai"):
        module = sys.modules.get(name)
        if module is not None:
            types.append(module.APIConnectionError)
    return isinstance(exc, tuple(types))


class MalformedResponseError(SummarizationError):
    """A provider answered, but not with its API's JSON (say, a proxy's HTML error page with 200).
    Transient as far as we can tell: retried like a 5xx."""

    def __init__(self, provider: str, status: int, content_type: str, body: str):
        self.status_code = status
        shown = " ".join(body.split())[:80]
        super().__init__(
            f"{provider} answered HTTP {status} with {content_type or 'no content type'}, not JSON: {shown!r}"
        )


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, MalformedResponseError):
        return True
    status = _status_of(exc)
    if status is not None:
        return status in _RETRYABLE_STATUS or status >= 500
    return _is_connection_error(exc)


def _retry_after_seconds(exc: BaseException | None) -> float:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return 0.0
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue  # an HTTP date: rare, and the backoff covers it
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    return 0.0


class _BackoffHonouringRetryAfter:
    def __init__(self, policy: RetryPolicy):
        self._jitter = wait_random_exponential(multiplier=policy.wait_base, max=policy.wait_max)
        self._retry_after_max = policy.retry_after_max

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return max(self._jitter(state), min(_retry_after_seconds(exc), self._retry_after_max))


def _describe(exc: BaseException, secret: str | None) -> str:
    status = _status_of(exc)
    detail = " ".join(str(exc).split())[:200]
    if secret:
        detail = detail.replace(secret, "***")
    head = f"HTTP {status} {type(exc).__name__}" if status is not None else type(exc).__name__
    return f"{head}: {detail}" if detail else head


def call_with_retries(
    request: Callable[[], T],
    *,
    what: str,
    error_type: type[Exception],
    policy: RetryPolicy,
    limiter: RateLimiter | None = None,
    secret: str | None = None,
) -> T:
    """Run `request` under the rate limit, retrying transient failures per `policy`.

    Any failure left over is raised as `error_type` naming `what` (say, the model) and the HTTP status;
    `secret` (the API key) is blanked out should the server echo it back.
    """

    def attempt() -> T:
        if limiter is not None:
            limiter.acquire()
        return request()

    retrying = Retrying(
        stop=stop_after_attempt(policy.max_retries + 1),
        wait=_BackoffHonouringRetryAfter(policy),
        retry=retry_if_exception(is_retryable),
        reraise=True,
    )
    try:
        return retrying(attempt)
    except (TypeError, AttributeError, NameError):
        raise  # our bug, not the provider's failure: do not file it under one memory
    except Exception as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise error_type(f"{what} failed after {attempts} attempt(s): {_describe(exc, secret)}") from exc


# --------------------------------------------------------------------------------------------------
# The providers' SDK clients


# The vendors' public APIs. Passed explicitly when no base URL is configured, so that the SDKs never fall
# back to ANTHROPIC_BASE_URL / OPENAI_BASE_URL themselves: Settings.from_env reads those variables.
DEFAULT_BASE_URLS = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}


def sdk_client(kind: str, api_key: str, base_url: str | None, timeout: float) -> Any:
    """The Anthropic or OpenAI SDK client, with the SDK's own retries off (ours run instead), the key and
    the API's URL given (none read from the environment)."""
    if kind == "anthropic":
        import anthropic

        return anthropic.Anthropic(
            api_key=api_key, base_url=base_url or DEFAULT_BASE_URLS[kind], max_retries=0, timeout=timeout
        )
    if kind == "openai":
        import openai

        return openai.OpenAI(
            api_key=api_key, base_url=base_url or DEFAULT_BASE_URLS[kind], max_retries=0, timeout=timeout
        )
    raise InvalidInputError("provider", kind, "must be 'anthropic' or 'openai'")


class ProviderClient:
    """One provider's SDK client (`client`) under our rate limit and retries (`call`, `call_api`).

    The transport half of memory_lib.llm.client's LLMClient, through which every LLM role (summaries,
    JSON answers, the write judge, the escalation evaluator, rerank) and the batch endpoints
    (memory_lib.llm.batches) reach the provider. Failures are SummarizationError naming the provider,
    what was asked and the model.
    """

    kind: str  # "anthropic" or "openai"
    default_model: str

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        limiter: RateLimiter | None = None,
        max_retries: int = 5,
        timeout: float = 30.0,
        *,
        retry_wait_base: float = 0.5,
        retry_wait_max: float = 20.0,
    ):
        self.model = model or self.default_model
        self._limiter = limiter
        self._policy = RetryPolicy(max_retries, retry_wait_base, retry_wait_max)
        self._secret = api_key
        # The SDK client: `call_api` requests go through its `with_raw_response`, the batch path uses
        # its batch endpoints.
        self.client: Any = sdk_client(self.kind, api_key, base_url, timeout)

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._policy

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(model={self.model!r})"

    def call(self, request: Callable[[], T], what: str) -> T:
        """`request` under this client's rate limit and retries (batch endpoints use it too)."""
        return call_with_retries(
            request,
            what=f"{self.kind} {what} with model {self.model!r}",
            error_type=SummarizationError,
            policy=self._policy,
            limiter=self._limiter,
            secret=self._secret,
        )

    def call_api(self, request: Callable[[], Any], what: str) -> Any:
        """`request` returns the SDK's raw response (`with_raw_response`); it is parsed only when the
        body is JSON, else MalformedResponseError (retried). `what` names the request in errors."""

        def parsed() -> Any:
            raw = request()
            content_type = raw.headers.get("content-type", "")
            if "json" not in content_type.lower():
                raise MalformedResponseError(self.kind, raw.status_code, content_type, raw.http_response.text)
            try:
                return raw.parse()
            except ValueError as exc:  # JSON that does not parse
                raise MalformedResponseError(
                    self.kind, raw.status_code, content_type, raw.http_response.text
                ) from exc

        return self.call(parsed, what)


# --------------------------------------------------------------------------------------------------
# JSON in a provider's answer


# A model asked for bare JSON sometimes wraps it in a markdown code fence anyway.
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def strip_json_fence(text: str) -> str:
    """`text` stripped of surrounding whitespace and of a ```json (or ```) code fence around it."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1) if fenced else text


def parse_json_answer(text: str) -> Any:
    """The JSON value of a provider's answer, a ```json fence around it tolerated.

    The stdlib parser: a lone surrogate ("\\ud800") survives for the caller to refuse by name. Raises
    json.JSONDecodeError, whose `doc` is the text parsed (the answer without its fence).
    """
    return json.loads(strip_json_fence(text))
