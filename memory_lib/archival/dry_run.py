"""The dry run: what archival would do, writing nothing to Postgres — eligible counts, a sample
summarized for review, their backups round-tripped under a scratch prefix (deleted after), and the
backlog's cost and duration projected from what the sample measured."""

from __future__ import annotations

import math
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ..core.config import ArchivalCriteria
from ..core.errors import IntegrityError, InvalidInputError, MemoryArchiveError
from ..core.locks import backups_in_flight
from ..core.models import BackupObject, sha256_hex, to_float32
from ..core.pricing import (
    DEFAULT_PRICES,
    OFFLINE_PER_1000,
    ModelPrice,
    Usage,
    cost_usd,
    unknown_price,
    usd_per_1000,
)
from ..core.rows import Conn, Row
from ..lifecycle.eligibility import eligible_counts, sample_eligible
from ..lifecycle.forget import forgetting
from ..llm.summarize import Summary, SummaryInput
from ..storage.objectstore import ObjectStore
from ..storage.store import fetch_memories
from .archive import ArchivalServices, run_parallel
from .fidelity import differences


@dataclass(frozen=True)
class SampleReview:
    memory_id: uuid.UUID
    user_id: str
    reason: str
    created_at: datetime
    importance_score: float
    original: str
    summary: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class RoundTrip:
    written: int
    faithful: int
    deleted: int
    bytes_written: int
    failures: dict[str, str]
    seconds: float


@dataclass(frozen=True)
class Projection:
    """The backlog's cost, from the sample's measured usage (answers that failed validation count:
    they are billed) priced for the configured model: `cost_usd` synchronously (list price),
    `cost_usd_batch` through the provider's batch API. `priced` is False when the model has no price
    (the costs are then 0.0 but unknown: `price_per_1000` says so).

    `usd_per_1000_memories` / `usd_per_1000_memories_batch`: USD per 1,000 memories summarized at the
    list / batch price, from the sampled summaries' real token usage (every answer of the sample, over
    the memories sampled); None when the model has no price, 0.0 for the offline summarizer.
    `price_per_1000` says it in words, with the model and the price kind."""

    eligible: int
    nights_needed: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    seconds_per_memory: dict[str, float]
    bytes: int
    cost_usd_batch: float = 0.0
    model: str = ""
    priced: bool = True
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    usd_per_1000_memories: float | None = None
    usd_per_1000_memories_batch: float | None = None
    price_per_1000: str = ""


@dataclass(frozen=True)
class DryRunReport:
    as_of: datetime
    eligible_by_reason: dict[str, int]
    samples: list[SampleReview]
    round_trip: RoundTrip
    projection: Projection

    @property
    def summary_errors(self) -> int:
        return sum(1 for s in self.samples if s.error)


def dry_run(
    conn: Conn,
    services: ArchivalServices,
    criteria: ArchivalCriteria,
    *,
    as_of: datetime,
    sample_size: int = 50,
    workers: int = 4,
    requests_per_second: float | None = None,
    scratch_token: str | None = None,
) -> DryRunReport:
    """What a run would do, writing nothing to Postgres: eligible counts, `sample_size` memories
    summarized for review, their backups round-tripped under a scratch prefix (deleted after),
    and the backlog's cost and duration projected from what the sample measured."""
    if not 1 <= sample_size <= 500:
        raise InvalidInputError("sample_size", sample_size, "must be between 1 and 500")
    by_reason = eligible_counts(conn, criteria, as_of)
    rows = sample_eligible(conn, criteria, as_of, sample_size)

    t0 = time.monotonic()

    def summarize(row: Row) -> Summary:
        return services.summarizer.summarize(
            SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
        )

    outcomes = list(run_parallel(summarize, rows, workers))
    t_summary = time.monotonic() - t0
    samples: list[SampleReview] = []
    measured = Usage()
    for _, out in outcomes:
        spent = out if isinstance(out, Summary) else getattr(out, "spent", None)
        if spent is not None:
            measured = measured + spent.usage
    for row, out in outcomes:
        summary: str | None
        error: str | None
        if isinstance(out, BaseException):
            summary, error = None, f"{type(out).__name__}: {out}"[:300]
            input_tokens, output_tokens, cost = 0, 0, 0.0
        else:
            summary, error = out.text, None
            input_tokens, output_tokens, cost = out.input_tokens, out.output_tokens, out.cost_usd
        samples.append(
            SampleReview(
                row["id"],
                row["user_id"],
                row["reason"],
                row["created_at"],
                float(row["importance_score"]),
                row["content"],
                summary,
                error,
                input_tokens,
                output_tokens,
                cost,
            )
        )
    t1 = time.monotonic()
    texts = [s.summary for s in samples if s.summary]
    if texts:
        services.embedder.embed(texts)
    t_embed = time.monotonic() - t1
    users = sorted({r["user_id"] for r in rows})
    # Scratch copies are bytes of the user's too: written under the backup locks, like backups
    # (memory_lib.core.locks), and only of memories still hot and not being forgotten.
    with backups_in_flight(conn, users):
        forgotten = forgetting(conn, users)
        hot = fetch_memories(conn, [r["id"] for r in rows], users=users)
        trip = _scratch_round_trip(
            services.object_store,
            [r for r in rows if r["id"] in hot and not forgotten(r["user_id"], r["id"])],
            as_of,
            scratch_token or secrets.token_hex(6),
            workers,
        )

    eligible = sum(by_reason.values())
    n = max(len(samples), 1)
    per = {
        "summarize": t_summary / n,
        "embed": t_embed / max(len(texts), 1),
        "backup": trip.seconds / max(trip.written, 1),
    }
    if requests_per_second:  # the rate limit caps the summary rate whatever the sample's latency
        per["summarize"] = max(per["summarize"], 1.0 / requests_per_second)
    # Per sampled memory, every answer counted (a failed one is billed and would be retried).
    scale = eligible / max(len(samples), 1)
    projected = Usage(
        *(
            round(scale * getattr(measured, f))
            for f in (
                "input_tokens",
                "output_tokens",
                "cache_creation_input_tokens",
                "cache_read_input_tokens",
            )
        )
    )
    summarizer = services.summarizer
    prices = getattr(summarizer, "prices", DEFAULT_PRICES)
    offline = summarizer.kind == "extractive-offline"
    sync_cost = 0.0 if offline else cost_usd(prices, summarizer.model, projected)
    batch_cost = 0.0 if offline else cost_usd(prices, summarizer.model, projected, batch=True)
    per_1000 = _per_1000(summarizer.kind, summarizer.model, prices, measured, len(samples))
    projection = Projection(
        eligible=eligible,
        nights_needed=math.ceil(eligible / criteria.batch_size),
        input_tokens=projected.input_tokens,
        output_tokens=projected.output_tokens,
        cost_usd=sync_cost or 0.0,
        seconds=eligible * sum(per.values()),
        seconds_per_memory=per,
        bytes=round(eligible * trip.bytes_written / max(trip.written, 1)),
        cost_usd_batch=batch_cost or 0.0,
        model=f"{summarizer.kind}:{summarizer.model}",
        priced=sync_cost is not None,
        cache_read_input_tokens=projected.cache_read_input_tokens,
        cache_creation_input_tokens=projected.cache_creation_input_tokens,
        usd_per_1000_memories=per_1000[0],
        usd_per_1000_memories_batch=per_1000[1],
        price_per_1000=per_1000[2],
    )
    return DryRunReport(as_of, by_reason, samples, trip, projection)


def _per_1000(
    kind: str, model: str, prices: Mapping[str, ModelPrice], measured: Usage, sampled: int
) -> tuple[float | None, float | None, str]:
    """(list, batch, words): USD per 1,000 memories from the sample's measured usage."""
    if kind == "extractive-offline":
        return 0.0, 0.0, OFFLINE_PER_1000
    if sampled == 0:
        return None, None, f"{kind}:{model}: no memory sampled, nothing measured"
    sync = cost_usd(prices, model, measured)
    batch = cost_usd(prices, model, measured, batch=True)
    if sync is None or batch is None:
        return None, None, unknown_price(model)
    list_1000, batch_1000 = usd_per_1000(sync, sampled), usd_per_1000(batch, sampled)
    return (
        list_1000,
        batch_1000,
        f"{kind}:{model}: ${batch_1000:.4f} per 1,000 memories at batch price, ${list_1000:.4f} at list "
        f"price (estimated from the token usage of {sampled} sampled summaries)",
    )


def _scratch_key(store: ObjectStore, token: str, memory_id: uuid.UUID) -> str:
    name = f"dry-run/{token}/memories/{memory_id}.json"
    return f"{store.prefix}/{name}" if store.prefix else name


def _scratch_round_trip(
    store: ObjectStore, rows: list[Row], as_of: datetime, token: str, workers: int
) -> RoundTrip:
    started = time.monotonic()

    def trip(row: Row) -> int:
        doc = BackupObject.from_row(row, archived_at=as_of, archive_reason=row["reason"])
        data = doc.to_json_bytes()
        key = _scratch_key(store, token, row["id"])
        try:
            store.put(key, data, sha256_hex(data))
            back = BackupObject.from_json_bytes(store.get_verified(key, sha256_hex(data)))
            expected = doc.model_dump() | {"embedding": to_float32(row["embedding"])}
            bad = differences(back, expected)
            if bad:
                raise IntegrityError(key, "every field equal to the source", f"differs in {', '.join(bad)}")
        finally:
            store.delete(key)
        if store.head(key) is not None:
            raise MemoryArchiveError(f"scratch object {key} still exists after delete")
        return len(data)

    written = faithful = deleted = size = 0
    failures: dict[str, str] = {}
    for row, out in run_parallel(trip, rows, workers):
        written += 1
        if isinstance(out, BaseException):
            failures[str(row["id"])] = f"{type(out).__name__}: {out}"[:300]
        else:
            faithful += 1
            deleted += 1
            size += out
    return RoundTrip(written, faithful, deleted, size, failures, time.monotonic() - started)
