"""The dry run, before the first backlog: what the Slow Path would do, with nothing written to Postgres."""

import time
from datetime import UTC, datetime

import dagster as dg

from memory_assets.metadata import counts, markdown_table, size_metadata
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.archival import dry_run
from memory_lib.archival.archive import ArchivalServices
from memory_lib.core.errors import InvalidInputError

from ..slow_path.partitions import SLOW_PATH


class DryRunConfig(dg.Config):
    sample_size: int = SLOW_PATH.dry_run_sample_size
    as_of: str | None = None  # ISO timestamp with zone; unset: now


@dg.asset(group_name="dry_run", pool=SLOW_PATH.llm_pool, kinds={"postgres", "llm"})
def archival_dry_run(
    context: dg.AssetExecutionContext,
    config: DryRunConfig,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    summarizer: SummarizerResource,
    embedder: EmbedderResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Eligible counts by reason; a sample summarized next to its originals for review; the sample's
    backups round-tripped under a scratch prefix and deleted; the backlog's cost and duration
    projected from the sample's measured timings and token usage. Claims nothing, writes no row."""
    started = time.monotonic()
    as_of = _as_of(config.as_of)
    services = ArchivalServices(
        summarizer.get_summarizer(), embedder.get_embedder(), object_store.get_store()
    )
    llm = summarizer.llm_config()
    # The client-side rate limit bounds an LLM summarizer's pace; the offline one has none.
    rps = llm.requests_per_second if services.summarizer.kind in ("anthropic", "openai") else None
    with database.connect() as conn:
        report = dry_run.dry_run(
            conn,
            services,
            archival.get_criteria(),
            as_of=as_of,
            sample_size=config.sample_size,
            workers=llm.max_concurrency,
            requests_per_second=rps,
        )
    p, trip = report.projection, report.round_trip
    context.log.info(f"dry run price per 1,000 memories: {p.price_per_1000}")
    return dg.MaterializeResult(
        metadata={
            "as_of": report.as_of.isoformat(),
            "eligible": p.eligible,
            **counts("eligible", report.eligible_by_reason),
            "sampled": len(report.samples),
            "sample_summary_errors": report.summary_errors,
            "review": markdown_table(
                ["memory", "user", "reason", "importance", "created", "original", "summary"],
                [
                    [
                        str(s.memory_id)[:8],
                        s.user_id,
                        s.reason,
                        f"{s.importance_score:.2f}",
                        f"{s.created_at:%Y-%m-%d}",
                        s.original,
                        s.summary or f"ERROR {s.error}",
                    ]
                    for s in report.samples
                ],
                width=400,
            ),
            "round_trip_written": trip.written,
            "round_trip_faithful": trip.faithful,
            "round_trip_deleted": trip.deleted,
            **size_metadata(
                "round_trip_bytes", trip.bytes_written, note="the sample's backups, written and deleted"
            ),
            **(
                {
                    "round_trip_failures": markdown_table(
                        ["memory", "problem"], list(trip.failures.items())[:20]
                    )
                }
                if trip.failures
                else {}
            ),
            "projected_nights": p.nights_needed,
            # Priced from the sample's measured tokens for the configured model: list vs batch API price.
            # A model without a price shows no cost (0 would read as free): price_per_1000_memories says so.
            **(
                {
                    "projected_cost_usd": round(p.cost_usd, 4),
                    "projected_cost_usd_batch": round(p.cost_usd_batch, 4),
                }
                if p.priced
                else {}
            ),
            "projected_cost_priced": p.priced,
            "price_per_1000_memories": p.price_per_1000,
            **_per_1000_metadata(p.usd_per_1000_memories, p.usd_per_1000_memories_batch),
            "projected_input_tokens": p.input_tokens,
            "projected_output_tokens": p.output_tokens,
            "projected_hours": round(p.seconds / 3600, 2),
            **size_metadata(
                "projected_backup_bytes",
                p.bytes,
                note="every eligible memory's backup, at the sample's mean size",
            ),
            "measured_seconds_per_memory": markdown_table(
                ["step", "seconds"], [[k, f"{v:.4f}"] for k, v in p.seconds_per_memory.items()]
            ),
            "summarizer": f"{services.summarizer.kind}:{services.summarizer.model}",
            "duration_s": round(time.monotonic() - started, 2),
        }
    )


def _per_1000_metadata(list_price: float | None, batch_price: float | None) -> dict[str, float]:
    """USD per 1,000 memories at list and batch price, as numbers (absent when the price is unknown)."""
    out: dict[str, float] = {}
    if list_price is not None:
        out["usd_per_1000_memories_list"] = round(list_price, 6)
    if batch_price is not None:
        out["usd_per_1000_memories_batch"] = round(batch_price, 6)
    return out


def _as_of(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            "as_of", value, "must be an ISO timestamp, e.g. 2026-01-31T00:00:00+00:00"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidInputError("as_of", value, "must include a time zone offset")
    return parsed
