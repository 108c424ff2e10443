"""OpenTelemetry metrics of context assembly: memory token share and injection hit-rate.

Recorded by the clients' build_context for every assembled context, when `opentelemetry` is importable;
nothing otherwise. The application sets the meter provider (and its exporter); without one the API's
no-op meter drops the values.

* `memory_archive.context.injection_hit_rate` (histogram, 1): injected / offered retrieved memories,
  recorded only when at least one was offered.
* `memory_archive.context.memory_token_share` (histogram, 1): tokens of memory material / all tokens
  of the context, recorded only when the context is not empty.
* `memory_archive.context.memories_offered`, `memory_archive.context.memories_injected` (counters):
  their sums give the hit rate over any period (a mean of per-call rates would weigh calls equally).

No attributes: a user id or query would be personal data and unbounded cardinality.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:  # optional: the `otel` extra
    from opentelemetry import metrics as _otel_metrics
except ImportError:  # pragma: no cover - exercised by tests/retrieval/test_observability.py in a subprocess
    _otel_metrics = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ..retrieval.context import AssembledContext

METER_NAME = "memory_archive"
HIT_RATE = "memory_archive.context.injection_hit_rate"
TOKEN_SHARE = "memory_archive.context.memory_token_share"
OFFERED = "memory_archive.context.memories_offered"
INJECTED = "memory_archive.context.memories_injected"

__all__ = ["HIT_RATE", "INJECTED", "METER_NAME", "OFFERED", "TOKEN_SHARE", "record_context"]

# Instruments per meter provider: the global provider may be set after import (once, by the app).
_instruments: dict[int, tuple[Any, Any, Any, Any]] = {}


def _for_provider() -> tuple[Any, Any, Any, Any]:
    provider = _otel_metrics.get_meter_provider()
    key = id(provider)
    found = _instruments.get(key)
    if found is None:
        meter = provider.get_meter(METER_NAME)
        found = (
            meter.create_histogram(
                HIT_RATE, unit="1", description="Share of offered retrieved memories injected"
            ),
            meter.create_histogram(TOKEN_SHARE, unit="1", description="Memory tokens / context tokens"),
            meter.create_counter(
                OFFERED, unit="{memory}", description="Retrieved memories offered to assembly"
            ),
            meter.create_counter(INJECTED, unit="{memory}", description="Retrieved memories in the context"),
        )
        _instruments.clear()  # one provider at a time: a replaced one's instruments are dead
        _instruments[key] = found
    return found


def record_context(ctx: AssembledContext) -> None:
    """Record one assembled context's metrics (no-op without opentelemetry)."""
    if _otel_metrics is None:
        return
    hit_rate, token_share, offered, injected = _for_provider()
    offered.add(ctx.offered_memories)
    injected.add(ctx.injected_memories)
    if ctx.injection_hit_rate is not None:
        hit_rate.record(ctx.injection_hit_rate)
    if ctx.memory_token_share is not None:
        token_share.record(ctx.memory_token_share)
