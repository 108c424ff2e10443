"""OpenTelemetry spans when `opentelemetry` is importable, nothing otherwise.

    with span("memory_archive.search", {"memory_archive.limit": 10}) as s:
        ...
        s.set({"memory_archive.hits": 3})

The library never configures a tracer provider: an application installs the `otel` extra, sets one
(an OTLP exporter, say) and gets the spans; without a provider a span costs one global look-up. `span` yields a `SpanHandle` either way, so callers never test for OpenTelemetry.

Privacy invariant: span attributes carry ids, counts, scores, modes and reasons only, never a memory's
text, a summary or the query. The user_id is left out, not hashed: a hash of a known id is a stable,
dictionary-reversible identifier, and traces often leave the host for a third-party backend; a trace is
tied to a user by the application's own spans, when it chooses to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:  # optional: the `otel` extra (the API alone also comes with the anthropic SDK)
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - exercised by tests/retrieval/test_observability.py in a subprocess
    _otel_trace = None  # type: ignore[assignment]

TRACER_NAME = "memory_archive"

__all__ = ["TRACER_NAME", "SpanHandle", "available", "span"]

AttrValue = str | bool | int | float | list[str] | list[int] | list[float]


def available() -> bool:
    """Whether spans go to OpenTelemetry (the package is importable)."""
    return _otel_trace is not None


class SpanHandle:
    """The current span, or nothing. `recording` is False when no SDK records it: callers skip
    attributes that cost something to compute (lists of ids and scores)."""

    __slots__ = ("_span",)

    def __init__(self, otel_span: Any = None) -> None:
        self._span = otel_span

    @property
    def recording(self) -> bool:
        return self._span is not None and self._span.is_recording()

    def set(self, attrs: Mapping[str, AttrValue | None]) -> None:
        """Set attributes; None values are skipped (OpenTelemetry rejects them)."""
        if self.recording:
            self._span.set_attributes({k: v for k, v in attrs.items() if v is not None})


_NOOP = SpanHandle()
_tracers: dict[int, Any] = {}


def _tracer() -> Any:
    """The tracer of the provider the application set, or None when none is set (or a no-op one): then a
    span costs one global look-up, not a non-recording span and a context switch. Looked up per call, so
    a provider set after import (late app set-up, tests) is followed."""
    if _otel_trace is None:
        return None
    provider = _otel_trace.get_tracer_provider()
    if isinstance(provider, _otel_trace.ProxyTracerProvider | _otel_trace.NoOpTracerProvider):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        _tracers.clear()  # one provider at a time
        tracer = _tracers[id(provider)] = provider.get_tracer(TRACER_NAME)
    return tracer


@contextmanager
def span(name: str, attrs: Mapping[str, AttrValue | None] | None = None) -> Iterator[SpanHandle]:
    """A child of the current span (or a root) named `name`, current while the block runs; an exception
    leaving the block is recorded on it and marks it as an error."""
    tracer = _tracer()
    if tracer is None:
        yield _NOOP
        return
    with tracer.start_as_current_span(name) as otel_span:
        handle = SpanHandle(otel_span)
        if attrs:
            handle.set(attrs)
        yield handle
