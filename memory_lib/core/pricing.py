"""What an LLM response cost: token usage as the provider reported it, priced from a table per model.

`Usage` is normalized across providers so that the four counts never overlap:
* Anthropic reports `input_tokens` without the cached part, plus `cache_creation_input_tokens`
  (billed at the cache-write price) and `cache_read_input_tokens` (cache-read price);
* OpenAI reports `prompt_tokens` *including* `prompt_tokens_details.cached_tokens`: the uncached part
  is `prompt_tokens - cached_tokens`, and there is no cache-write charge.

A model missing from the price table has an unknown cost: `cost_usd` returns None (not 0.0, which
would read as "free"), and the ledger records it as unpriced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_PRICES",
    "OFFLINE_PER_1000",
    "ModelPrice",
    "Usage",
    "cost_usd",
    "price_for",
    "unknown_price",
    "usage_from_response",
    "usd_per_1000",
]


class ModelPrice(BaseModel):
    """USD per million tokens. Batch prices apply to requests sent through a provider's batch API."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    input: float = Field(ge=0.0)
    output: float = Field(ge=0.0)
    batch_input: float = Field(ge=0.0)
    batch_output: float = Field(ge=0.0)
    cache_write: float = Field(0.0, ge=0.0, description="Anthropic cache writes; OpenAI has none.")
    cache_read: float = Field(0.0, ge=0.0)


def _p(
    i: float, o: float, *, cache_write: float = 0.0, cache_read: float = 0.0, batch: float = 0.5
) -> ModelPrice:
    return ModelPrice(
        input=i,
        output=o,
        batch_input=i * batch,
        batch_output=o * batch,
        cache_write=cache_write,
        cache_read=cache_read,
    )


# Prices checked 2026-11-23 with the project's search tool (pages as published Oct-Nov 2026):
# Anthropic: platform.claude.com/docs/en/models/haiku-5-5/overview (model ID `claude-haiku-5-5`, "Latest",
# released 2026-10-07: $0.10 input / $0.50 output / $0.125 5-minute cache write per MTok for prompts up to
# 100,000 tokens, 5x above; it counts ~30% more tokens than Haiku 4.5 for the same text, and the figures
# derived from measured usage already include that); docs.anthropic.com/en/docs/build-with-claude/
# batch-processing (batch = 50% of list, cache included) and dev.to/neverpaytwice "Claude Batch API: half
# price" quoting Anthropic's batch page (Haiku 5.5 batch $0.05/$0.25, Haiku 4.5 $1/$5 list); Haiku 5.5
# cache reads $0.01 (github.com/Surething-io/cockpit release v1.0.282); Haiku 3 cache prices from
# opencode.ai/data/anthropic/claude-3-haiku-20240307. Anthropic cache writes cost 1.25x input, reads 0.1x.
# Summary prompts are far below 100K tokens: the lower Haiku 5.5 tier is the one that applies.
# OpenAI: tokenmix.ai/blog/gpt-5-api-pricing (2026-04-30, citing platform.openai.com/docs/pricing:
# gpt-5.4-mini $0.75/$4.50, cached $0.075, Batch API 50% off), deploybase.ai/articles/gpt-4.1-pricing
# (gpt-4.1-mini $0.40/$1.60, batch $0.20/$0.80), explore.oreate.ai (gpt-4o-mini $0.15/$0.60, cached
# $0.075); developers.openai.com/api/docs/models/gpt-6-luna (gpt-6-luna $0.10/$0.50, cached $0.01, cache
# write $0.125, Batch 50% of Standard; a reasoning model, effort "medium" unless told otherwise). OpenAI's
# deprecations page (developers.openai.com/api/docs/deprecations, as quoted by codersera.com and dev.to in
# Oct 2026) shuts gpt-4o, gpt-4o-mini, gpt-4.1 and gpt-4.1-mini down on 2027-01-14, gpt-6-luna replacing them.
# Keys match as prefixes, so dated snapshots ("claude-haiku-4-5-20251001") find their family.
# Override or extend with the llm.prices setting; prices change, the date above says when these held.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-haiku-5-5": _p(0.10, 0.50, cache_write=0.125, cache_read=0.01),
    "claude-haiku-4-5": _p(1.00, 5.00, cache_write=1.25, cache_read=0.10),
    "claude-3-5-haiku": _p(0.80, 4.00, cache_write=1.00, cache_read=0.08),
    "claude-3-haiku": _p(0.25, 1.25, cache_write=0.30, cache_read=0.03),
    "claude-sonnet-4-5": _p(3.00, 15.00, cache_write=3.75, cache_read=0.30),
    "gpt-6-luna": _p(0.10, 0.50, cache_read=0.01),
    "gpt-5.4-mini": _p(0.75, 4.50, cache_read=0.075),
    "gpt-4.1-mini": _p(0.40, 1.60, cache_read=0.10),
    "gpt-4o-mini": _p(0.15, 0.60, cache_read=0.075),
    "gpt-4o": _p(2.50, 10.00, cache_read=1.25),
}


@dataclass(frozen=True)
class Usage:
    """Tokens of one response, normalized (see the module docstring): the four counts are disjoint."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
        )


def _int(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return int(value) if isinstance(value, int | float) and value > 0 else 0


def usage_from_response(provider: str, usage: Any) -> Usage:
    """A response's `usage` (an SDK object or its JSON as a dict) as a normalized Usage."""
    if usage is None:
        return Usage()
    if provider == "anthropic":
        return Usage(
            _int(usage, "input_tokens"),
            _int(usage, "output_tokens"),
            _int(usage, "cache_creation_input_tokens"),
            _int(usage, "cache_read_input_tokens"),
        )
    details = (
        usage.get("prompt_tokens_details")
        if isinstance(usage, Mapping)
        else getattr(usage, "prompt_tokens_details", None)
    )
    cached = _int(details, "cached_tokens") if details is not None else 0
    prompt = _int(usage, "prompt_tokens")
    return Usage(max(prompt - cached, 0), _int(usage, "completion_tokens"), 0, cached)


def price_for(prices: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The price of `model`: its own entry, else the longest key it extends with "-" (a dated snapshot)."""
    matches = [key for key in prices if model == key or model.startswith(key + "-")]
    return prices[max(matches, key=len)] if matches else None


def cost_usd(
    prices: Mapping[str, ModelPrice], model: str, usage: Usage, *, batch: bool = False
) -> float | None:
    """USD for `usage` of `model`, at batch prices when `batch`; None when the model has no price."""
    price = price_for(prices, model)
    if price is None:
        return None
    p_in, p_out = (price.batch_input, price.batch_output) if batch else (price.input, price.output)
    # Cache tokens take the same discount as plain input in a batch (Anthropic: "all usage").
    factor = (price.batch_input / price.input if price.input else 0.5) if batch else 1.0
    return (
        usage.input_tokens * p_in
        + usage.output_tokens * p_out
        + usage.cache_creation_input_tokens * price.cache_write * factor
        + usage.cache_read_input_tokens * price.cache_read * factor
    ) / 1_000_000


# What a price per 1,000 memories says for the offline summarizer: no provider, no bill.
OFFLINE_PER_1000 = "0 (offline extractive)"


def unknown_price(models: str) -> str:
    """What a price figure says instead of a number when `models` have no price (0 would read as free)."""
    return f"unknown price for model {models}: set llm.prices"


def usd_per_1000(cost: float, memories: int) -> float:
    """USD per 1,000 memories, from `cost` USD spent on `memories` memories (at least one)."""
    if memories < 1:
        raise ValueError(f"a price per 1,000 memories needs at least one memory, got {memories}")
    return 1000.0 * cost / memories
